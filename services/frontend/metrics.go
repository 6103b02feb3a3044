package frontend

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the HTTP edge's Prometheus series, with Dynamo's names and
// labels: what clients were sent. The runtime registers its own (package
// runner).
type metrics struct {
	requests     *prometheus.CounterVec   // model, endpoint, request_type, status
	active       *prometheus.GaugeVec     // model
	ttft         *prometheus.HistogramVec // model
	addedTTFT    *prometheus.HistogramVec // model
	itl          *prometheus.HistogramVec // model
	duration     *prometheus.HistogramVec // model
	outputTokens *prometheus.CounterVec   // model
	disconnected prometheus.Counter
	resumes      *prometheus.CounterVec // model
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	latency := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynamo_frontend_requests_total", Help: "Requests handled, by outcome.",
		}, []string{"model", "endpoint", "request_type", "status"}),
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dynamo_frontend_active_requests", Help: "Requests in flight on this frontend.",
		}, []string{"model"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dynamo_frontend_time_to_first_token_seconds", Help: "Time from request to first token sent.", Buckets: latency,
		}, []string{"model"}),
		addedTTFT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "baton_frontend_added_ttft_seconds", Help: "Time to first token minus the engine's own, as its worker reported it: what baton added (streams from their start).",
			Buckets: []float64{.0005, .001, .002, .003, .005, .0075, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"model"}),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dynamo_frontend_inter_token_latency_seconds", Help: "Time between consecutive tokens sent, per token.", Buckets: latency,
		}, []string{"model"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dynamo_frontend_request_duration_seconds", Help: "Time from request to its last byte.", Buckets: latency,
		}, []string{"model"}),
		outputTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynamo_frontend_output_tokens_total", Help: "Tokens sent to clients.",
		}, []string{"model"}),
		disconnected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dynamo_frontend_disconnected_clients", Help: "Clients that went away before their response ended.",
		}),
		resumes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynamo_frontend_model_resume_total", Help: "Streams resumed on this replica.",
		}, []string{"model"}),
	}
	var errs []error
	for _, c := range []prometheus.Collector{
		m.requests, m.active, m.ttft, m.addedTTFT, m.itl, m.duration, m.outputTokens, m.disconnected, m.resumes,
	} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}
