package tenants

import (
	"net/http"
	"slices"
)

// consoleTenantsMax bounds the tenants one answer of /v1/console/tenants
// lists (each with a budget reads its key of the budgets bucket).
const consoleTenantsMax = 200

// consoleTenant is one row of the console's tenants panel.
type consoleTenant struct {
	Tenant     string       `json:"tenant"`
	RPM        int64        `json:"rpm,omitempty"`
	TPM        int64        `json:"tpm,omitempty"`
	Concurrent int          `json:"concurrent,omitempty"`
	Weight     float64      `json:"weight"`
	Share      float64      `json:"log_share,omitempty"`
	Requests   *usageWindow `json:"requests,omitempty"` // across every frontend
	Tokens     *usageWindow `json:"tokens,omitempty"`
	LogBytes   int64        `json:"log_bytes,omitempty"` // every frontend's estimate
	LogLimit   int64        `json:"log_limit_bytes,omitempty"`
	OpenHere   *int         `json:"open_here,omitempty"` // under a concurrency cap
	Open       *int         `json:"open,omitempty"`      // every frontend's, under concurrent=N
	Here       tenantCount  `json:"here"`                // what this frontend counted since it started
}

// ServeConsole answers GET /v1/console/tenants (the admin's): every
// tenant of the keys file and the budgets file (the one tenant of an open
// API), at most consoleTenantsMax, with its budgets, what is left of them
// across every frontend, its open requests (across every frontend under
// concurrent=N, here under --tenant-max-concurrent), its bytes in the log,
// and this frontend's counts.
func (g *Gate) ServeConsole(w http.ResponseWriter, r *http.Request) {
	budgets := g.allBudgets()
	var names []string
	if g.Keys != nil {
		names = g.Keys.Tenants()
		for t := range budgets.Tenants {
			names = append(names, t)
		}
	} else {
		names = []string{""}
	}
	for _, t := range g.series.counted() {
		if t != openTenantLabel {
			names = append(names, t)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	if g.Keys != nil {
		names = slices.DeleteFunc(names, func(t string) bool { return t == "" })
	}
	truncated := len(names) > consoleTenantsMax
	names = names[:min(len(names), consoleTenantsMax)]
	rows := make([]consoleTenant, 0, len(names))
	for _, t := range names {
		b := budgets.For(t)
		row := consoleTenant{Tenant: tenantLabel(t), RPM: b.RPM, TPM: b.TPM, Concurrent: b.Concurrent, Weight: b.Weight,
			Share: b.Log, Here: g.series.snapshot(tenantLabel(t))}
		if g.quota != nil { // no read for a tenant without per-minute budgets
			if st, err := g.quota.Usage(r.Context(), t); err == nil {
				row.Requests, row.Tokens = usageOf(st.Requests), usageOf(st.Tokens)
			}
		}
		row.LogBytes, row.LogLimit = g.logBytes(t)
		if n := g.limits.maxOf(t); n > 0 {
			open := g.limits.open(t)
			row.OpenHere = &open
			row.Concurrent = n
		}
		if b.Concurrent > 0 && g.slots != nil { // one cap across every frontend: one read of its key
			if open, err := g.slots.Open(r.Context(), t); err == nil {
				row.Open, row.Concurrent = &open, b.Concurrent
			}
		}
		rows = append(rows, row)
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": rows, "truncated": truncated, "frontend": g.ID})
}
