// Package runner is the frontend's request runtime: everything that keeps a
// request alive once it is in the log, with no HTTP in it. It follows each
// request a client reads here (one follower per request, fed by one live
// subscription), runs the requests this frontend owns (asking
// migrations.Policy.Step what to do and carrying it out: route, dispatch,
// fence, migrate, fail, detach), takes over requests whose owner is gone
// (for a reader, or with none for those meant to outlive their client:
// adopt.go), keeps this frontend's presence key alive, relays commands to workers and
// answers their checks. It routes with the fleet view (services/fleet),
// which it is handed through its own small interface (Fleet) and does not
// run.
//
// The HTTP edge (package frontend) drives it through a small API: Accept,
// AcceptParent, Link, Attach, Cancel, Load, Admit, and per request View,
// Listen, Dispatched, Enter, Leave, Claim and Release. The runtime never imports the edge. Its state is a
// cache rebuilt from the log (invariant 1): the registry's mu guards only the
// requests followed here and their reference counts.
package runner
