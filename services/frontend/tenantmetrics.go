package frontend

import (
	"errors"
	"net/http"
	"time"

	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Per-tenant metrics, labelled by tenant name. /metrics needs no key, and
// tenant names are the operator's customers, so these are on a registry of
// their own served at GET /metrics/tenants, with the admin's key. Their
// labels are bounded by the keys file: a tenant is a name the keys file
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

// tenantMetrics are the per-tenant series.
type tenantMetrics struct {
	reg       *prometheus.Registry
	admitted  *prometheus.CounterVec   // tenant, endpoint
	throttled *prometheus.CounterVec   // tenant, reason
	queued    *prometheus.CounterVec   // tenant
	queueWait *prometheus.HistogramVec // tenant
	tokens    *prometheus.CounterVec   // tenant, kind
	logBytes  *prometheus.GaugeVec     // tenant
}

func newTenantMetrics() (*tenantMetrics, error) {
	m := &tenantMetrics{
		reg: prometheus.NewRegistry(),
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

// admit counts a create of tenant admitted, with its prompt's tokens.
func (m *tenantMetrics) admit(tenant, endpoint string, promptTokens int) {
	t := tenantLabel(tenant)
	m.admitted.WithLabelValues(t, endpoint).Inc()
	m.tokens.WithLabelValues(t, "prompt").Add(float64(max(promptTokens, 0)))
}

// throttle counts a request of tenant refused for reason.
func (m *tenantMetrics) throttle(tenant, reason string) {
	m.throttled.WithLabelValues(tenantLabel(tenant), reason).Inc()
}

// queue counts a create of tenant held in the admission queue, and wait,
// how long it was held (admitted or not). The admission queue calls it.
func (m *tenantMetrics) queue(tenant string, wait time.Duration) {
	t := tenantLabel(tenant)
	m.queued.WithLabelValues(t).Inc()
	m.queueWait.WithLabelValues(t).Observe(wait.Seconds())
}

// completed counts the completion tokens of the requests ts, which tenant
// created, that ended (those still running elsewhere are not counted).
func (m *tenantMetrics) completed(tenant string, ts ...*runner.Request) {
	var n int
	for _, t := range ts {
		t.View(func(p *projections.Request) {
			if p.Status.Terminal() {
				n += p.CompletionTokens()
			}
		})
	}
	m.tokens.WithLabelValues(tenantLabel(tenant), "completion").Add(float64(n))
}

// handleTenantMetrics serves GET /metrics/tenants, the per-tenant series
// (the admin's only: adminPath), with each tenant's log bytes read now.
func (fe *Frontend) handleTenantMetrics() http.Handler {
	h := promhttp.HandlerFor(fe.tenants.reg, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fe.ledger != nil {
			fe.mu.Lock()
			b := fe.budgets
			fe.mu.Unlock()
			for t, tb := range b.Tenants {
				if tb.Log > 0 {
					n, _ := fe.logBytes(t)
					fe.tenants.logBytes.WithLabelValues(t).Set(float64(n))
				}
			}
		}
		h.ServeHTTP(w, r)
	})
}
