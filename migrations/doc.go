// Package migrations holds the per-request migration decision: a pure state
// machine (Policy.Step) from a request's projection, what its runner
// remembers and what it observed, to the next action: wait, dispatch, fence,
// migrate, fail or detach. It also holds the policy (--migration-limit,
// --migration-max-seq-len) and builds a continuation's dispatch.
//
// It imports only events and projections, does no I/O and does not log: the
// frontend's runner observes, calls Step and carries the action out.
package migrations
