// Package streams owns baton's JetStream layout: stream and KV definitions,
// idempotent provisioning, subject builders, and the helpers that append events
// to and read events from the log.
//
// Layout (inspectable with the nats CLI):
//
//	BATON_REQUESTS  baton.requests.<slot>.<id>.events                lifecycle decisions of a request
//	                baton.requests.<slot>.<id>.tokens.<k>.<worker>   deltas and completion of dispatch attempt k,
//	                                                                 written by the worker it was routed to
//	                republished to baton.live.requests.<slot>.<id>.… for core-NATS tailing
//
//	BATON_WORKERS   baton.workers.<id>.events        worker lifecycle
//	KV baton_leases  <worker id> → events.Lease, per-key TTL (an expiry is a delete marker)
//	KV baton_load    <worker id> → events.Load
//	KV baton_frontends <frontend id> → events.FrontendPresence, per-key TTL
//
// <slot> is Slot(id), a hash of the id (0 to Slots-1): every subject of a
// request is a function of its id, attempt and worker alone. A request log of
// N > 1 partitions (Partitions, fixed when created, recorded in the streams'
// metadata and learnt by Discover) is the streams BATON_REQUESTS_<k>, k < N,
// partition k holding the slots s with s % N == k; each republishes like
// BATON_REQUESTS, and a request's stream is Partitions.StreamOf(id).
//
// Invariants: provisioning never weakens an existing stream's retention, nor
// changes the number of partitions; streams with limits discard new messages
// (per subject), never a live request's oldest tokens; appends carry the
// CloudEvents id as Nats-Msg-Id so retries deduplicate; all of a request is in
// one stream, so its sequences are ordered.
package streams
