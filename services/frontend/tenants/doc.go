// Package tenants holds a frontend's tenants to what the operator gives
// them: --tenant-rps and --tenant-max-concurrent per frontend, and a
// budgets file's concurrent=N as one cap across every frontend
// (limits.go, over quota.Slots), the per-minute budgets shared by every
// frontend (budgets.go, over quota.Limiter), a tenant's share of the
// request log (logshare.go), weighted fair admission when every worker is
// busy (admission.go), and the per-tenant series, usage and console rows
// that show them (series.go, budgets.go, console.go).
//
// The edge (package frontend) holds one Gate and asks it of every request:
// Rate and Headers in its middleware, Acquire (and the release it returns)
// around an open response, AdmitLogShare, Admit and Charge before a create
// is stored, Admitted and Ended around it, ServeUsage, ServeConsole and
// MetricsHandler for its routes, Reload on SIGHUP and HealthNote for
// /health. A refusal is a *Refusal, which writes itself in OpenAI's error
// shape with Retry-After. The package reads the request runtime (runner),
// is handed the fleet view through the small interface it defines (Pool),
// and never imports the edge. services/quota is the mechanism underneath:
// the shared windows, leases, slots and counters in the budgets bucket.
package tenants
