// Package fleet is one frontend's view of the fleet and its routing: the
// workers (discovery, folded from the leases and load buckets and the
// workers stream), the frontends (every presence key), the disconnect
// advisories that revoke a crashed worker's lease or a crashed frontend's
// key at once, and the choice of a worker for a dispatch (the highest
// priority tier that can take it, the least loaded in it, load thresholds,
// this frontend's local inhibition of workers that failed on the request
// path).
//
// Fleet has one Run; the request runtime (services/frontend/runner) and the
// HTTP edge read it through small interfaces of their own. The view is a
// cache of the buckets and the workers stream (invariant 1): routable means
// leased (invariant 4), and what the fleet decides alone is local (an
// inhibition) or idempotent in the log (a lease revoked at the revision the
// view saw, a lost or quarantined event under a deterministic id).
package fleet
