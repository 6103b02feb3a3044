package frontend

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/streams"
)

// tenantLimits bounds each tenant's concurrent responses and request rate
// (a token bucket of rps with a burst of max(1, rps)). Zero disables either.
// A tenant's concurrent=N in the budgets file replaces maxConcurrent for it.
type tenantLimits struct {
	maxConcurrent int
	rps           float64
	mu            sync.Mutex
	tenants       map[string]*tenantUse // bounded by the tenants of the keys file
	perTenant     map[string]int        // the budgets file's concurrent=N; guarded by mu
}

// setPerTenant replaces the per-tenant concurrency caps (a budgets reload);
// slots held stay held.
func (l *tenantLimits) setPerTenant(caps map[string]int) {
	l.mu.Lock()
	l.perTenant = caps
	l.mu.Unlock()
}

// maxFor is tenant's cap of concurrent responses (0: none); l.mu held.
func (l *tenantLimits) maxFor(tenant string) int {
	if n, ok := l.perTenant[tenant]; ok {
		return n
	}
	return l.maxConcurrent
}

// open is how many of tenant's responses are counted open here.
func (l *tenantLimits) open(tenant string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if u, ok := l.tenants[tenant]; ok {
		return u.active
	}
	return 0
}

// maxOf is maxFor for callers that do not hold l.mu.
func (l *tenantLimits) maxOf(tenant string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.maxFor(tenant)
}

type tenantUse struct {
	active int
	tokens float64
	last   time.Time
}

func newTenantLimits(maxConcurrent int, rps float64) *tenantLimits {
	return &tenantLimits{maxConcurrent: maxConcurrent, rps: rps, tenants: map[string]*tenantUse{}}
}

func (l *tenantLimits) use(tenant string, now time.Time) *tenantUse {
	u, ok := l.tenants[tenant]
	if !ok {
		u = &tenantUse{tokens: l.burst(), last: now}
		l.tenants[tenant] = u
	}
	return u
}

func (l *tenantLimits) burst() float64 { return math.Max(1, l.rps) }

// allow takes one token of tenant's rate; when none is left it returns how
// long until one is.
func (l *tenantLimits) allow(tenant string, now time.Time) (time.Duration, bool) {
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
func (l *tenantLimits) acquire(tenant string) bool {
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
func (l *tenantLimits) release(tenant string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if u, ok := l.tenants[tenant]; ok && u.active > 0 {
		u.active--
	}
}

// retryAfter is the Retry-After header's whole seconds for a wait, at least 1.
func retryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))
}

// rateLimit answers 429 with Retry-After to a tenant over its rate. The
// probes and /metrics are not counted.
func (fe *Frontend) rateLimit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !openPath(r.URL.Path) {
			if wait, ok := fe.limits.allow(tenantOf(r), time.Now()); !ok {
				fe.tenants.throttle(tenantOf(r), throttleRate)
				w.Header().Set("Retry-After", retryAfter(wait))
				writeError(w, http.StatusTooManyRequests, "requests", "rate_limit_exceeded",
					fmt.Sprintf("Rate limit reached: %v requests per second for this API key, please retry later", fe.cfg.TenantRPS))
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// concurrent answers 429 with Retry-After to a tenant that already has its
// maximum of responses open (completions and resumes).
func (fe *Frontend) concurrent(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tenant := tenantOf(r)
		if !fe.limits.acquire(tenant) {
			fe.writeConcurrencyLimit(w, tenant)
			return
		}
		defer fe.limits.release(tenant)
		h(w, r)
	}
}

// writeConcurrencyLimit answers 429 to a tenant at its maximum of open
// responses.
func (fe *Frontend) writeConcurrencyLimit(w http.ResponseWriter, tenant string) {
	fe.tenants.throttle(tenant, throttleConcurrent)
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusTooManyRequests, "requests", "concurrency_limit_exceeded",
		fmt.Sprintf("Too many concurrent requests: at most %d open at once for this API key, please retry later", fe.limits.maxOf(tenant)))
}

// countUnlessBackground takes one of the caller's concurrent slots for a
// reader of request t (answering 429 when none is left, and returning
// false), unless t runs in the background: a background response counts
// once, from its create until it ends (countUntilEnd), not again for each
// reader. The caller gives the slot back with the returned release.
func (fe *Frontend) countUnlessBackground(w http.ResponseWriter, r *http.Request, t *runner.Request) (release func(), ok bool) {
	var background bool
	t.View(func(p *projections.Request) { background = p.Accepted.Background })
	if background {
		return func() {}, true
	}
	tenant := tenantOf(r)
	if !fe.limits.acquire(tenant) {
		fe.writeConcurrencyLimit(w, tenant)
		return nil, false
	}
	return func() { fe.limits.release(tenant) }, true
}

// countUntilEnd keeps the slot of tenant its caller took for background
// response t until t ends (completed, failed or cancelled, whichever
// frontend stored the end), whether or not a client reads it, or until the
// frontend stops; then it calls ended (the budget's give-back). It takes
// its own reference to t.
func (fe *Frontend) countUntilEnd(t *runner.Request, tenant string, ended func()) {
	ctx, cancel := context.WithTimeout(context.Background(), streams.DefaultTimeout)
	held, err := fe.runtime.Attach(ctx, t.ID()) // t is followed here: a new reference
	cancel()
	if err != nil || !fe.startBackground() {
		if err == nil {
			held.Release()
		}
		fe.limits.release(tenant)
		ended()
		return
	}
	go func() {
		defer fe.background.Done()
		defer ended()
		defer fe.limits.release(tenant)
		defer held.Release()
		wake := make(chan struct{}, 1)
		defer held.Listen(wake)()
		for {
			var terminal bool
			held.View(func(p *projections.Request) { terminal = p.Status.Terminal() })
			if terminal {
				fe.createEnded(tenant, held)
				return
			}
			select {
			case <-wake:
			case <-fe.stopped:
				return
			}
		}
	}()
}
