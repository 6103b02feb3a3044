package fleet

import "github.com/prometheus/client_golang/prometheus"

// metrics are the fleet's Prometheus series: what its routing decided.
type metrics struct {
	// fallbacks counts dispatches routed to a lower priority tier than the
	// highest of the model's routable workers, by model.
	fallbacks *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_frontend_fallback_dispatches_total",
			Help: "Dispatches this frontend routed to a lower priority tier (--priority) than the highest of the model's routable workers: every worker of a higher tier was busy, inhibited, had failed the request or could not run it.",
		}, []string{"model"}),
	}
	if err := reg.Register(m.fallbacks); err != nil {
		return nil, err
	}
	return m, nil
}
