package frontend

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/quota"
	"github.com/baton-dev/baton/streams"
)

// CheckTenantBudgetsFile reads and checks a budgets file as the frontend
// will, so that a bad file is a configuration error at start.
func CheckTenantBudgetsFile(path string) error {
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

// budgetsConfigured reports whether the frontend keeps shared budgets: a
// budgets file, or a default per-minute budget. Without either it sends
// nothing to the budgets bucket.
func (c Config) budgetsConfigured() bool {
	return c.TenantBudgetsFile != "" || c.TenantRPM > 0 || c.TenantTPM > 0
}

// loadBudgets reads the budgets file (if any) with the defaults of cfg.
func (c Config) loadBudgets() (quota.Budgets, error) {
	b := quota.Budgets{Default: quota.Budget{RPM: c.TenantRPM, TPM: c.TenantTPM}}
	if c.TenantBudgetsFile == "" {
		return b, nil
	}
	t, err := readBudgets(c.TenantBudgetsFile)
	b.Tenants = t
	return b, err
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
// starts the limiter; Run calls it once the runtime started, and runs the
// returned function until the end of the shutdown.
func (fe *Frontend) startBudgets(ctx context.Context) (run func(context.Context) error, err error) {
	if !fe.cfg.budgetsConfigured() {
		return nil, nil
	}
	kv, err := fe.js.KeyValue(ctx, streams.BudgetsBucket)
	if err != nil {
		return nil, fmt.Errorf("budgets bucket %s: %w", streams.BudgetsBucket, err)
	}
	fe.mu.Lock() // against a SIGHUP's ReloadBudgets
	defer fe.mu.Unlock()
	q, err := quota.New(kv, fe.log, fe.budgets, quota.Config{Frontend: fe.id, Lease: fe.cfg.BudgetLease})
	if err != nil {
		return nil, err
	}
	fe.quota = q
	fe.log.Info("tenant budgets shared by every frontend", "bucket", streams.BudgetsBucket,
		"tenants", len(fe.budgets.Tenants), "budgets_hash", fe.budgets.Hash())
	return q.Run, nil
}

// ReloadBudgets reads the budgets file again (on SIGHUP). On an error the
// budgets in use stay and the error is returned; without a file it does
// nothing.
func (fe *Frontend) ReloadBudgets() error {
	if fe.cfg.TenantBudgetsFile == "" {
		return nil
	}
	b, err := fe.cfg.loadBudgets()
	if err != nil {
		return fmt.Errorf("frontend: %w", err)
	}
	fe.limits.setPerTenant(concurrentOf(b))
	fe.mu.Lock()
	fe.budgets = b
	if fe.quota != nil {
		fe.quota.SetBudgets(b)
	}
	fe.mu.Unlock()
	fe.log.Info("tenant budgets reloaded", "tenants", len(b.Tenants), "budgets_hash", b.Hash())
	return nil
}

// budgetHeaders sets OpenAI's x-ratelimit-* headers on every answer to a
// tenant with a per-minute budget (the check of a create sets them again
// with what it took). They come from this frontend's view, with no call
// to the bucket.
func (fe *Frontend) budgetHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fe.quota != nil && !openPath(r.URL.Path) {
			setRateHeaders(w, fe.quota.Status(tenantOf(r)))
		}
		next.ServeHTTP(w, r)
	})
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

// budget is what a create took of its tenant's budget, given back when it
// ends (end).
type budget struct {
	fe    *Frontend
	grant quota.Grant
	ids   []string // the requests whose tokens count
	taken int64
}

// chargeBudget checks a create of tenant reserving tokens against the
// tenant's shared budget: over it, 429 rate_limit_exceeded with
// Retry-After; the bucket out of reach, 503 (fail closed). ids are the
// requests the create starts (one, or one per choice).
func (fe *Frontend) chargeBudget(w http.ResponseWriter, r *http.Request, tenant string, tokens int64, ids ...string) (*budget, bool) {
	if fe.quota == nil {
		return &budget{}, true
	}
	g, st, err := fe.quota.Acquire(r.Context(), tenant, tokens)
	setRateHeaders(w, st)
	var over *quota.OverError
	switch {
	case errors.As(err, &over):
		fe.tenants.throttle(tenant, over.Resource) // throttleRequests or throttleTokens
		w.Header().Set("Retry-After", retryAfter(over.RetryAfter))
		writeError(w, http.StatusTooManyRequests, over.Resource, "rate_limit_exceeded", over.Error())
		return nil, false
	case err != nil:
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "service_unavailable", "budget_unavailable",
			"Service temporarily unavailable: the tenant budgets cannot be checked (the log is out of reach), please retry later")
		return nil, false
	}
	return &budget{fe: fe, grant: g, ids: ids, taken: tokens}, true
}

// choiceIDs are the requests a create of n choices starts as id.
func choiceIDs(id string, n int) []string {
	if n <= 1 {
		return []string{id}
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = childID(id, i)
	}
	return ids
}

// end gives back what the create reserved and its requests did not use,
// once every one of them ended (a request that goes on, detached or in
// the background elsewhere, keeps what it reserved).
func (b *budget) end() {
	if b == nil || b.fe == nil {
		return
	}
	used, ended := b.fe.tokensUsed(b.ids, false)
	if !ended {
		return
	}
	b.grant.Release(used)
}

// tokensUsed is what requests ids used, prompt and completion, and whether
// every one of them ended (false too when one cannot be read). With
// skipUnknown an id the log does not know (never accepted) used nothing.
func (fe *Frontend) tokensUsed(ids []string, skipUnknown bool) (used int64, ended bool) {
	ctx, cancel := context.WithTimeout(context.Background(), streams.DefaultTimeout)
	defer cancel()
	for _, id := range ids {
		t, err := fe.runtime.Attach(ctx, id)
		if skipUnknown && errors.Is(err, streams.ErrNotFound) {
			continue
		}
		if err != nil {
			return used, false
		}
		var done bool
		t.View(func(p *projections.Request) {
			done = p.Status.Terminal()
			used += int64(p.PromptTokens() + p.CompletionTokens())
		})
		t.Release()
		if !done {
			return used, false
		}
	}
	return used, true
}

// withBudgetsNote adds to a /health body the frontends whose budgets differ
// from this one's, when some do.
func (fe *Frontend) withBudgetsNote(body map[string]any) map[string]any {
	if fe.quota != nil {
		if d := fe.quota.Differ(); len(d) > 0 {
			body["budgets_differ"] = map[string]any{"budgets_hash": fe.quota.Hash(), "frontends": d}
		}
	}
	return body
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

// handleUsage answers GET /v1/tenants/{tenant}/usage: the tenant's budgets
// and what is left of them across every frontend (one read of the budgets
// bucket), and its open responses on this frontend. The admin may read any
// tenant's, a tenant its own only (404 for another's, as for one that does
// not exist). On an open API every caller is the one tenant, whatever the
// name.
func (fe *Frontend) handleUsage(w http.ResponseWriter, r *http.Request) {
	caller, name := tenantOf(r), r.PathValue("tenant")
	tenant := name
	switch {
	case fe.keys == nil:
		tenant = ""
	case caller == streams.AdminTenant:
	case caller != name:
		writeError(w, http.StatusNotFound, "invalid_request_error", "tenant_not_found",
			fmt.Sprintf("no tenant %q for this API key: a tenant reads its own usage only", name))
		return
	}
	fe.mu.Lock()
	b := fe.budgets.For(tenant)
	fe.mu.Unlock()
	budget := map[string]any{"rpm": b.RPM, "tpm": b.TPM, "weight": b.Weight}
	body := map[string]any{"object": "tenant.usage", "tenant": name, "budget": budget, "frontend": fe.id,
		"here": fe.tenants.snapshot(tenantLabel(tenant))} // this frontend's counts (tenantmetrics.go)
	if b.Log > 0 {
		budget["log"] = b.Log
	}
	if n, a := fe.logBytes(tenant); a > 0 { // every frontend's estimate (logshare.go)
		body["log"] = map[string]any{"bytes": n, "limit_bytes": a}
	}
	if n := fe.limits.maxOf(tenant); n > 0 { // per frontend; counted only under a cap
		budget["concurrent"], body["open_here"] = n, fe.limits.open(tenant)
	}
	if fe.quota != nil {
		st, err := fe.quota.Usage(r.Context(), tenant)
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, "service_unavailable", "budget_unavailable",
				"Service temporarily unavailable: the tenant budgets cannot be read (the log is out of reach), please retry later")
			return
		}
		body["requests"], body["tokens"] = usageOf(st.Requests), usageOf(st.Tokens)
		body["budgets_hash"] = fe.quota.Hash()
	}
	writeJSON(w, http.StatusOK, body)
}
