// Package worker runs an engine behind a lease: it registers in the leases
// bucket, accepts dispatches over core NATS, appends each attempt's token
// deltas and outcome to the log, reports load, and drains on shutdown.
//
// Invariants:
//   - The dispatch subscription exists before the lease does, so no frontend
//     can route to a worker that is not listening.
//   - Every delta of an attempt is acknowledged before its completion is
//     appended, so a completion is never stored ahead of its tokens.
//   - A worker that loses its lease re-registers under a new lease id; the
//     old attempts stay fenced by the frontends' migration decisions.
//   - Shutdown never drops a request silently: what is still running at the
//     end of the drain budget is handed off with attempt_failed "shutdown".
package worker
