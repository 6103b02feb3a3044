package tenants

import (
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Per-tenant metrics, labelled by tenant name. /metrics needs no key, and
// tenant names are the operator's customers, so these are on a registry of
// their own served at GET /metrics/tenants (MetricsHandler), with the
// admin's key. Their labels are bounded by the keys file: a tenant is a name the keys file
// gives (every key authenticates as one), or openTenantLabel on an open API.

// openTenantLabel is the tenant label of the open API's one tenant: not a
// valid tenant name, so no keys file's tenant has it.
const openTenantLabel = "(open)"

// Throttle reasons: the budget or limit that refused a create.
const (
	throttleRequests   = "requests"   // rpm, across frontends: 429 rate_limit_exceeded
	throttleTokens     = "tokens"     // tpm, across frontends: 429 rate_limit_exceeded
	throttleRate       = "rate"       // --tenant-rps, per frontend: 429 rate_limit_exceeded
	throttleConcurrent = "concurrent" // concurrent=N or --tenant-max-concurrent: 429 concurrency_limit_exceeded
	throttleLogShare   = "log_share"  // log=F: 503 log_full
)

// series are the per-tenant series.
type series struct {
	reg       *prometheus.Registry
	admitted  *prometheus.CounterVec   // tenant, endpoint
	throttled *prometheus.CounterVec   // tenant, reason
	queued    *prometheus.CounterVec   // tenant
	queueWait *prometheus.HistogramVec // tenant
	tokens    *prometheus.CounterVec   // tenant, kind
	logBytes  *prometheus.GaugeVec     // tenant
	mu        sync.Mutex
	counts    map[string]*tenantCount // the same counts for the console, by tenant label
}

// tenantCount is what this frontend counted of one tenant, for the console.
type tenantCount struct {
	Admitted  int64            `json:"admitted"`
	Throttled map[string]int64 `json:"throttled,omitempty"` // by reason
	Queued    int64            `json:"queued"`
	Tokens    int64            `json:"tokens"` // prompt and completion
}

// count runs fn on tenant's counts, under the lock.
func (m *series) count(label string, fn func(c *tenantCount)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.counts[label]
	if !ok {
		c = &tenantCount{}
		m.counts[label] = c
	}
	fn(c)
}

// snapshot is a copy of tenant's counts (zero when none).
func (m *series) snapshot(label string) tenantCount {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.counts[label]
	if !ok {
		return tenantCount{}
	}
	out := *c
	if c.Throttled != nil {
		out.Throttled = make(map[string]int64, len(c.Throttled))
		for k, v := range c.Throttled {
			out.Throttled[k] = v
		}
	}
	return out
}

// counted lists the tenant labels counted so far.
func (m *series) counted() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.counts))
	for t := range m.counts {
		out = append(out, t)
	}
	return out
}

func newSeries() (*series, error) {
	m := &series{
		reg: prometheus.NewRegistry(), counts: map[string]*tenantCount{},
		admitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_tenant_admitted_total", Help: "Creates (completions, chat completions, responses) this frontend admitted, by tenant.",
		}, []string{"tenant", "endpoint"}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_tenant_throttled_total", Help: "Requests this frontend refused for a tenant's budget or limit, by reason: requests (rpm), tokens (tpm), rate (--tenant-rps), concurrent, log_share (log=F), and the admission queue's.",
		}, []string{"tenant", "reason"}),
		queued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_tenant_queued_total", Help: "Creates held in the admission queue (--admission-queue) before a worker was free, by tenant.",
		}, []string{"tenant"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "baton_tenant_queue_wait_seconds", Help: "Time creates waited in the admission queue, admitted or not, by tenant.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"tenant"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_tenant_tokens_total", Help: "Tokens of the creates this frontend admitted, by tenant: prompt (the frontend's estimate, at admission) and completion (the engine's count, when the request ends here).",
		}, []string{"tenant", "kind"}),
		logBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "baton_tenant_log_bytes", Help: "A tenant's bytes in the request log as every frontend estimates them, for tenants with a share of it (log=F).",
		}, []string{"tenant"}),
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.admitted, m.throttled, m.queued, m.queueWait, m.tokens, m.logBytes} {
		errs = append(errs, m.reg.Register(c))
	}
	return m, errors.Join(errs...)
}

func tenantLabel(tenant string) string {
	if tenant == "" {
		return openTenantLabel
	}
	return tenant
}

// throttleReasons are the reasons this frontend refuses for; the admission
// queue's are added where they are counted.
var throttleReasons = []string{throttleRequests, throttleTokens, throttleRate, throttleConcurrent, throttleLogShare}

// admit counts a create of tenant admitted, with its prompt's tokens. A
// tenant's first admission starts its other series at 0, so that a rate
// of them is 0 rather than no data until the first refusal.
func (m *series) admit(tenant, endpoint string, promptTokens int) {
	t := tenantLabel(tenant)
	m.mu.Lock()
	_, seen := m.counts[t]
	m.mu.Unlock()
	if !seen {
		for _, r := range throttleReasons {
			m.throttled.WithLabelValues(t, r)
		}
		m.queued.WithLabelValues(t)
		m.tokens.WithLabelValues(t, "completion")
	}
	m.admitted.WithLabelValues(t, endpoint).Inc()
	m.tokens.WithLabelValues(t, "prompt").Add(float64(max(promptTokens, 0)))
	m.count(t, func(c *tenantCount) { c.Admitted++; c.Tokens += int64(max(promptTokens, 0)) })
}

// throttle counts a request of tenant refused for reason.
func (m *series) throttle(tenant, reason string) {
	m.throttled.WithLabelValues(tenantLabel(tenant), reason).Inc()
	m.count(tenantLabel(tenant), func(c *tenantCount) {
		if c.Throttled == nil {
			c.Throttled = map[string]int64{}
		}
		c.Throttled[reason]++
	})
}

// queue counts a create of tenant held in the admission queue, and wait,
// how long it was held (admitted or not). The admission queue calls it.
func (m *series) queue(tenant string, wait time.Duration) {
	t := tenantLabel(tenant)
	m.queued.WithLabelValues(t).Inc()
	m.queueWait.WithLabelValues(t).Observe(wait.Seconds())
	m.count(t, func(c *tenantCount) { c.Queued++ })
}

// completed counts the completion tokens of the requests ts, which tenant
// created, that ended (those still running elsewhere are not counted).
func (m *series) completed(tenant string, ts ...*runner.Request) {
	var n int
	for _, t := range ts {
		t.View(func(p *projections.Request) {
			if p.Status.Terminal() {
				n += p.CompletionTokens()
			}
		})
	}
	m.tokens.WithLabelValues(tenantLabel(tenant), "completion").Add(float64(n))
	m.count(tenantLabel(tenant), func(c *tenantCount) { c.Tokens += int64(n) })
}

// Admitted counts request acc, just accepted, for its tenant: its bytes
// in the log (Stored) and the admitted series.
func (g *Gate) Admitted(acc events.RequestAccepted) {
	g.Stored(acc)
	g.series.admit(acc.Tenant, acc.Endpoint, acc.PromptTokens)
}

// Stored accounts request acc, just accepted, in its tenant's bytes of the
// log: the choices of a create, one by one as they are accepted.
func (g *Gate) Stored(acc events.RequestAccepted) { g.ledger.add(acc) }

// AdmittedChoices counts a create of n choices, parent, in the admitted
// series; its choices' bytes are Stored.
func (g *Gate) AdmittedChoices(parent events.RequestAccepted, n int) {
	g.series.admit(parent.Tenant, parent.Endpoint, n*parent.PromptTokens)
}

// Ended is called as the handler of a create of tenant (or the watcher of
// a background response) lets its requests ts go: their tokens are
// counted, and the log share's ledger takes their last token counts.
func (g *Gate) Ended(tenant string, ts ...*runner.Request) {
	g.series.completed(tenant, ts...)
	g.ledger.observe(ts...)
}

// MetricsHandler serves GET /metrics/tenants, the per-tenant series (the
// edge gives it to the admin only), with each tenant's log bytes read now.
func (g *Gate) MetricsHandler() http.Handler {
	h := promhttp.HandlerFor(g.series.reg, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.ledger != nil {
			for t, tb := range g.allBudgets().Tenants {
				if tb.Log > 0 {
					n, _ := g.logBytes(t)
					g.series.logBytes.WithLabelValues(t).Set(float64(n))
				}
			}
		}
		h.ServeHTTP(w, r)
	})
}
