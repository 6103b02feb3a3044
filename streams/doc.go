// Package streams owns baton's JetStream layout: stream and KV definitions,
// idempotent provisioning, subject builders, and the helpers that append events
// to and read events from the log.
//
// The layout (streams, subjects, buckets, the hash slot of a request id and
// the partitions of the request log) is written down once, in
// docs/internals.md ("The event log", "Partitions and write capacity"); the
// subject builders in subjects.go and Partitions in partition.go are its code.
//
// Invariants: provisioning never weakens an existing stream's retention, nor
// changes the number of partitions; streams with limits discard new messages
// (per subject), never a live request's oldest tokens, except the ends place
// (BATON_ENDS, ends.go), which discards its oldest end so that an end always
// fits; appends that may be
// retried carry the CloudEvents id as Nats-Msg-Id so retries deduplicate; all of a request is in
// one stream, so its sequences are ordered.
package streams
