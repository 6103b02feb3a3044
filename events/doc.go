// Package events defines baton's facts: one Go type per thing that happened to a
// request or a worker, and their encoding as CloudEvents in binary content mode
// on NATS messages (attributes as ce-* headers, JSON data).
//
// Invariants:
//   - Event types are past-tense, versioned facts ("baton.request.routed.v1").
//   - The CloudEvents id doubles as the Nats-Msg-Id header, so a retried append
//     of the same fact is deduplicated by JetStream. (A worker leaves it off a
//     token delta it sends only once: docs/internals.md.)
//   - Decoding an unknown type returns ErrUnknownType, which readers skip, so an
//     old build survives a newer producer; the envelope then carries an
//     Unreadable that says why (a newer version, an unknown fact, bad data),
//     for readers that show what they skipped. Unknown fields are ignored.
//     docs/compatibility.md is the whole rule.
//   - A batch (TypeTokensBatch, batch.go) carries many request events in one
//     message, without headers of their own; each entry decodes to exactly
//     the envelope its own message decodes to. Nothing writes one yet.
//
// The package is pure: no I/O, no logging, no clocks (callers set Time).
package events
