// Package streams owns baton's JetStream layout: stream and KV definitions,
// idempotent provisioning, subject builders, and the helpers that append events
// to and read events from the log.
//
// Layout (inspectable with the nats CLI):
//
//	BATON_REQUESTS  baton.requests.<id>.events       lifecycle decisions of a request
//	                baton.requests.<id>.tokens.<k>   deltas and completion of dispatch attempt k
//	                republished to baton.live.requests.<id>.… for core-NATS tailing
//	BATON_WORKERS   baton.workers.<id>.events        worker lifecycle
//	KV baton_leases  <worker id> → events.Lease, per-key TTL (an expiry is a delete marker)
//	KV baton_load    <worker id> → events.Load
//	KV baton_frontends <frontend id> → events.FrontendPresence, per-key TTL
//
// Invariants: provisioning never weakens an existing stream's retention; streams
// with limits discard new messages (per subject), never a live request's oldest
// tokens; appends carry the CloudEvents id as Nats-Msg-Id so retries deduplicate.
package streams
