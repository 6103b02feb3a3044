package tenants

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// counter is the value of counter name with labels (pairs of name and
// value) in m's registry; -1 when there is no such series.
func counter(t *testing.T, m *series, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, x := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range x.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			match := true
			for i := 0; i+1 < len(labels); i += 2 {
				match = match && got[labels[i]] == labels[i+1]
			}
			if match {
				return x.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// TestSeries: a tenant's admissions, refusals and queue waits are counted
// in its series and in the counts the usage and the console show; its
// first admission starts its other series at 0; the open API's one tenant
// is labelled (open).
func TestSeries(t *testing.T) {
	m, err := newSeries()
	if err != nil {
		t.Fatal(err)
	}
	m.admit("alice", "chat_completions", 7)
	m.admit("alice", "chat_completions", 3)
	m.throttle("alice", throttleTokens)
	m.queue("alice", 20*time.Millisecond)
	m.admit("", "completions", 1)
	if got := counter(t, m, "baton_tenant_admitted_total", "tenant", "alice", "endpoint", "chat_completions"); got != 2 {
		t.Errorf("alice admitted = %v, want 2", got)
	}
	if got := counter(t, m, "baton_tenant_tokens_total", "tenant", "alice", "kind", "prompt"); got != 10 {
		t.Errorf("alice's prompt tokens = %v, want 10", got)
	}
	if got := counter(t, m, "baton_tenant_throttled_total", "tenant", "alice", "reason", throttleRate); got != 0 {
		t.Errorf("alice's rate refusals = %v, want the series at 0", got)
	}
	c := m.snapshot("alice")
	if c.Admitted != 2 || c.Tokens != 10 || c.Queued != 1 || c.Throttled[throttleTokens] != 1 {
		t.Errorf("alice's counts = %+v, want 2 admitted, 10 tokens, 1 queued, 1 refused for tokens", c)
	}
	c.Throttled[throttleTokens] = 99
	if m.snapshot("alice").Throttled[throttleTokens] != 1 {
		t.Error("a snapshot shares its map with the counts")
	}
	if m.snapshot(openTenantLabel).Admitted != 1 || m.snapshot("nobody").Admitted != 0 {
		t.Error("the open API's tenant is not counted as (open)")
	}
}

// TestServeConsole: the console's rows are every tenant of the keys file
// and the budgets file, with its budgets and this frontend's counts, the
// admin's own name left out of none; an open API shows its one tenant.
func TestServeConsole(t *testing.T) {
	keys, budgets := keysAndBudgets(t, "alice alice-0123456789abcdef\nadmin admin-0123456789abcdef\n", "alice rpm=60 weight=2\ncarol concurrent=3\n")
	rows := func(g *Gate) []consoleTenant {
		w := httptest.NewRecorder()
		g.ServeConsole(w, httptest.NewRequest(http.MethodGet, "/v1/console/tenants", nil))
		var out struct{ Data []consoleTenant }
		if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &out) != nil {
			t.Fatalf("console tenants: %d %s", w.Code, w.Body)
		}
		return out.Data
	}
	g := newGate(t, Config{BudgetsFile: budgets}, keys)
	g.series.admit("alice", "completions", 5)
	var names []string
	for _, r := range rows(g) {
		names = append(names, r.Tenant)
		switch r.Tenant {
		case "alice":
			if r.RPM != 60 || r.Weight != 2 || r.Here.Admitted != 1 {
				t.Errorf("alice's row = %+v, want rpm 60, weight 2, 1 admitted here", r)
			}
		case "carol":
			if r.Concurrent != 3 || r.OpenHere == nil || *r.OpenHere != 0 {
				t.Errorf("carol's row = %+v, want concurrent 3, none open here", r)
			}
		}
	}
	if strings.Join(names, " ") != "admin alice carol" {
		t.Errorf("console tenants = %v, want admin alice carol", names)
	}
	if open := rows(newGate(t, Config{}, nil)); len(open) != 1 || open[0].Tenant != openTenantLabel {
		t.Errorf("an open API's console tenants = %+v, want its one tenant (open)", open)
	}
}
