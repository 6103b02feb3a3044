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
// <slot> is Slot(id), a hash of the id (0 to Slots-1): every subject of a
// request is a function of its id, attempt and worker alone.
//	BATON_WORKERS   baton.workers.<id>.events        worker lifecycle
//	KV baton_leases  <worker id> → events.Lease, per-key TTL (an expiry is a delete marker)
//	KV baton_load    <worker id> → events.Load
//	KV baton_frontends <frontend id> → events.FrontendPresence, per-key TTL
//
// Invariants: provisioning never weakens an existing stream's retention; streams
// with limits discard new messages (per subject), never a live request's oldest
// tokens; appends carry the CloudEvents id as Nats-Msg-Id so retries deduplicate.
package streams
