package tenants

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/baton-dev/baton/services/quota"
	"github.com/baton-dev/baton/streams"
)

// CheckBudgetsFile reads and checks a budgets file as the frontend will,
// so that a bad file is a configuration error at start.
func CheckBudgetsFile(path string) error {
	_, err := readBudgets(path)
	return err
}

func readBudgets(path string) (map[string]quota.Budget, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read tenant budgets: %w", err)
	}
	b, err := quota.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("tenant budgets file %s: %w", path, err)
	}
	return b, nil
}

// concurrentOf is the per-tenant concurrency caps of b (concurrent=N).
func concurrentOf(b quota.Budgets) map[string]int {
	out := map[string]int{}
	for t, tb := range b.Tenants {
		if tb.Concurrent > 0 {
			out[t] = tb.Concurrent
		}
	}
	return out
}

// startBudgets opens the budgets bucket (provisioned with the log) and
// starts the limiter; Start calls it, and the edge runs the returned
// function until the end of the shutdown.
func (g *Gate) startBudgets(ctx context.Context) (run func(context.Context) error, err error) {
	if !g.cfg.sharedBudgets() {
		return nil, nil
	}
	kv, err := g.bucket(ctx)
	if err != nil {
		return nil, err
	}
	g.mu.Lock() // against a SIGHUP's Reload
	defer g.mu.Unlock()
	q, err := quota.New(kv, g.Log, g.budgets, quota.Config{Frontend: g.ID, Lease: g.cfg.Lease})
	if err != nil {
		return nil, err
	}
	g.quota = q
	g.Log.Info("tenant budgets shared by every frontend", "bucket", streams.BudgetsBucket,
		"tenants", len(g.budgets.Tenants), "budgets_hash", g.budgets.Hash())
	return q.Run, nil
}

// Headers sets OpenAI's x-ratelimit-* headers of tenant on an answer, when
// it has a per-minute budget (the check of a create sets them again with
// what it took). They come from this frontend's view, with no call to the
// bucket. The edge sets them on every answer but the probes and /metrics.
func (g *Gate) Headers(w http.ResponseWriter, tenant string) {
	if g.quota != nil {
		setRateHeaders(w, g.quota.Status(tenant))
	}
}

func setRateHeaders(w http.ResponseWriter, st quota.Status) {
	for _, x := range []struct {
		name string
		w    quota.Window
	}{{"requests", st.Requests}, {"tokens", st.Tokens}} {
		if x.w.Limit == 0 {
			continue
		}
		h := w.Header()
		h.Set("x-ratelimit-limit-"+x.name, strconv.FormatInt(x.w.Limit, 10))
		h.Set("x-ratelimit-remaining-"+x.name, strconv.FormatInt(x.w.Remaining, 10))
		h.Set("x-ratelimit-reset-"+x.name, x.w.Reset.Round(time.Millisecond).String())
	}
}

// Spent is what a create took of its tenant's budget, given back when it
// ends (End). A Spent of no shared budgets gives back nothing.
type Spent struct {
	g     *Gate
	grant quota.Grant
	ids   []string // the requests whose tokens count
}

// Charge checks a create of tenant reserving tokens against the tenant's
// shared budget, and sets on w the x-ratelimit-* headers of what it took:
// over it, 429 rate_limit_exceeded with Retry-After; the bucket out of
// reach, 503 (fail closed). ids are the requests the create starts (one,
// or one per choice).
func (g *Gate) Charge(ctx context.Context, w http.ResponseWriter, tenant string, tokens int64, ids ...string) (*Spent, *Refusal) {
	if g.quota == nil {
		return &Spent{}, nil
	}
	grant, st, err := g.quota.Acquire(ctx, tenant, tokens)
	setRateHeaders(w, st)
	var over *quota.OverError
	switch {
	case errors.As(err, &over):
		g.series.throttle(tenant, over.Resource) // throttleRequests or throttleTokens
		return nil, &Refusal{Status: http.StatusTooManyRequests, Type: over.Resource, Code: "rate_limit_exceeded",
			Message: over.Error(), RetryAfter: over.RetryAfter}
	case err != nil:
		return nil, &Refusal{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "budget_unavailable",
			Message: "Service temporarily unavailable: the tenant budgets cannot be checked (the log is out of reach), please retry later"}
	}
	return &Spent{g: g, grant: grant, ids: ids}, nil
}

// Unused gives back the whole charge of a create that started nothing.
func (s *Spent) Unused() {
	if s != nil && s.g != nil {
		s.grant.Release(0)
	}
}

// End gives back what the create reserved and its requests did not use,
// once every one of them ended (a request that goes on, detached or in
// the background elsewhere, keeps what it reserved).
func (s *Spent) End() {
	if s == nil || s.g == nil {
		return
	}
	used, ended := s.g.tokensUsed(s.ids, false)
	if !ended {
		return
	}
	s.grant.Release(used)
}

// usageWindow is one budget in a usage answer.
type usageWindow struct {
	Limit        int64   `json:"limit"`
	Remaining    int64   `json:"remaining"`
	ResetSeconds float64 `json:"reset_seconds"`
}

func usageOf(w quota.Window) *usageWindow {
	if w.Limit == 0 {
		return nil
	}
	return &usageWindow{Limit: w.Limit, Remaining: w.Remaining, ResetSeconds: w.Reset.Seconds()}
}

// ServeUsage answers GET /v1/tenants/{tenant}/usage of caller: the
// tenant's budgets and what is left of them across every frontend (one
// read of the budgets bucket), and its open responses on this frontend.
// The admin may read any tenant's, a tenant its own only (404 for
// another's, as for one that does not exist). On an open API every caller
// is the one tenant, whatever the name.
func (g *Gate) ServeUsage(w http.ResponseWriter, r *http.Request, caller string) {
	name := r.PathValue("tenant")
	tenant := name
	switch {
	case g.Keys == nil:
		tenant = ""
	case caller == streams.AdminTenant:
	case caller != name:
		writeError(w, http.StatusNotFound, "invalid_request_error", "tenant_not_found",
			fmt.Sprintf("no tenant %q for this API key: a tenant reads its own usage only", name))
		return
	}
	b := g.budget(tenant)
	budget := map[string]any{"rpm": b.RPM, "tpm": b.TPM, "weight": b.Weight}
	body := map[string]any{"object": "tenant.usage", "tenant": name, "budget": budget, "frontend": g.ID,
		"here": g.series.snapshot(tenantLabel(tenant))} // this frontend's counts (metrics.go)
	if b.Log > 0 {
		budget["log"] = b.Log
	}
	if n, a := g.logBytes(tenant); a > 0 { // every frontend's estimate (logshare.go)
		body["log"] = map[string]any{"bytes": n, "limit_bytes": a}
	}
	if n := g.limits.maxOf(tenant); n > 0 { // per frontend; counted only under a cap
		budget["concurrent"], body["open_here"] = n, g.limits.open(tenant)
	}
	if b.Concurrent > 0 && g.slots != nil { // concurrent=N: every frontend's, one read of its key
		open, err := g.slots.Open(r.Context(), tenant)
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, "service_unavailable", "budget_unavailable",
				"Service temporarily unavailable: the tenant's concurrent slots cannot be read (the log is out of reach), please retry later")
			return
		}
		body["open"] = open
	}
	if g.quota != nil {
		st, err := g.quota.Usage(r.Context(), tenant)
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, "service_unavailable", "budget_unavailable",
				"Service temporarily unavailable: the tenant budgets cannot be read (the log is out of reach), please retry later")
			return
		}
		body["requests"], body["tokens"] = usageOf(st.Requests), usageOf(st.Tokens)
		body["budgets_hash"] = g.quota.Hash()
	}
	writeJSON(w, http.StatusOK, body)
}
