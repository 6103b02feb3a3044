package tenants

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/baton-dev/baton/services/quota"
)

// limits bounds each tenant's concurrent responses and request rate
// (a token bucket of rps with a burst of max(1, rps)). Zero disables either.
// A tenant's concurrent=N in the budgets file replaces maxConcurrent for it.
type limits struct {
	maxConcurrent int
	rps           float64
	mu            sync.Mutex
	tenants       map[string]*tenantUse // bounded by the tenants of the keys file
	perTenant     map[string]int        // the budgets file's concurrent=N; guarded by mu
}

// setPerTenant replaces the per-tenant concurrency caps (a budgets reload);
// slots held stay held.
func (l *limits) setPerTenant(caps map[string]int) {
	l.mu.Lock()
	l.perTenant = caps
	l.mu.Unlock()
}

// maxFor is tenant's cap of concurrent responses (0: none); l.mu held.
func (l *limits) maxFor(tenant string) int {
	if n, ok := l.perTenant[tenant]; ok {
		return n
	}
	return l.maxConcurrent
}

// open is how many of tenant's responses are counted open here.
func (l *limits) open(tenant string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if u, ok := l.tenants[tenant]; ok {
		return u.active
	}
	return 0
}

// maxOf is maxFor for callers that do not hold l.mu.
func (l *limits) maxOf(tenant string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.maxFor(tenant)
}

type tenantUse struct {
	active int
	tokens float64
	last   time.Time
}

func newLimits(maxConcurrent int, rps float64) *limits {
	return &limits{maxConcurrent: maxConcurrent, rps: rps, tenants: map[string]*tenantUse{}}
}

func (l *limits) use(tenant string, now time.Time) *tenantUse {
	u, ok := l.tenants[tenant]
	if !ok {
		u = &tenantUse{tokens: l.burst(), last: now}
		l.tenants[tenant] = u
	}
	return u
}

func (l *limits) burst() float64 { return math.Max(1, l.rps) }

// allow takes one token of tenant's rate; when none is left it returns how
// long until one is.
func (l *limits) allow(tenant string, now time.Time) (time.Duration, bool) {
	if l.rps <= 0 {
		return 0, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	u := l.use(tenant, now)
	if el := now.Sub(u.last); el > 0 {
		u.tokens = math.Min(l.burst(), u.tokens+el.Seconds()*l.rps)
	}
	u.last = now
	if u.tokens >= 1 {
		u.tokens--
		return 0, true
	}
	wait := time.Duration((1 - u.tokens) / l.rps * float64(time.Second))
	return wait, false
}

// acquire takes one of tenant's concurrent slots; release gives it back.
func (l *limits) acquire(tenant string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	limit := l.maxFor(tenant)
	if limit <= 0 && len(l.perTenant) == 0 {
		return true // no cap anywhere: nothing is counted, as before budgets
	}
	u := l.use(tenant, time.Now())
	if limit > 0 && u.active >= limit {
		return false
	}
	u.active++
	return true
}

// release gives back a slot acquire took. Slots are counted for every
// tenant once any cap exists, so that a reload that gives a tenant a cap
// finds its open responses counted; without any cap nothing was.
func (l *limits) release(tenant string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if u, ok := l.tenants[tenant]; ok && u.active > 0 {
		u.active--
	}
}

// Rate takes one of tenant's requests of --tenant-rps: over it, a 429
// rate_limit_exceeded with the wait until the next as Retry-After. The edge
// asks it of every API request but the probes and /metrics.
func (g *Gate) Rate(tenant string) *Refusal {
	wait, ok := g.limits.allow(tenant, time.Now())
	if ok {
		return nil
	}
	g.series.throttle(tenant, throttleRate)
	return &Refusal{Status: http.StatusTooManyRequests, Type: "requests", Code: "rate_limit_exceeded", RetryAfter: wait,
		Message: fmt.Sprintf("Rate limit reached: %v requests per second for this API key, please retry later", g.cfg.RPS)}
}

// Acquire takes one of tenant's concurrent slots: a budgets file's
// concurrent=N is one cap across every frontend (quota.Slots), and
// --tenant-max-concurrent one per frontend for the tenants without it. At
// the cap, a 429 concurrency_limit_exceeded; the bucket out of reach for a
// shared cap, a 503 (fail closed). The caller gives the slot back with
// release, once.
func (g *Gate) Acquire(ctx context.Context, tenant string) (release func(), e *Refusal) {
	if !g.limits.acquire(tenant) {
		return nil, g.concurrencyRefusal(tenant, g.limits.maxOf(tenant))
	}
	local := func() { g.limits.release(tenant) }
	n := g.budget(tenant).Concurrent
	if n <= 0 || g.slots == nil {
		return local, nil
	}
	err := g.slots.Acquire(ctx, tenant, n)
	var full *quota.SlotsFullError
	switch {
	case errors.As(err, &full):
		local()
		return nil, g.concurrencyRefusal(tenant, full.Limit)
	case err != nil:
		local()
		return nil, &Refusal{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "budget_unavailable",
			Message: "Service temporarily unavailable: the tenant's concurrent slots cannot be checked (the log is out of reach), please retry later"}
	}
	return func() { local(); g.slots.Release(tenant) }, nil
}

// concurrencyRefusal is the 429 of tenant at its cap of n open responses.
func (g *Gate) concurrencyRefusal(tenant string, n int) *Refusal {
	g.series.throttle(tenant, throttleConcurrent)
	return &Refusal{Status: http.StatusTooManyRequests, Type: "requests", Code: "concurrency_limit_exceeded",
		Message: fmt.Sprintf("Too many concurrent requests: at most %d open at once for this API key, please retry later", n)}
}

// startSlots starts the shared concurrent slots when a budgets file is
// given (a reload may give a tenant concurrent=N); Start runs the returned
// function until the end of the shutdown, when it gives its slots back.
func (g *Gate) startSlots(ctx context.Context) (run func(context.Context) error, err error) {
	if g.cfg.BudgetsFile == "" {
		return nil, nil
	}
	kv, err := g.bucket(ctx)
	if err != nil {
		return nil, err
	}
	s, err := quota.NewSlots(kv, g.Log, quota.Config{Frontend: g.ID, Lease: g.cfg.Lease})
	if err != nil {
		return nil, err
	}
	g.slots = s
	return s.Run, nil
}
