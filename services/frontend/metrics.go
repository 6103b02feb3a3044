package frontend

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the frontend's Prometheus series, with Dynamo's names and labels.
type metrics struct {
	requests          *prometheus.CounterVec   // model, endpoint, request_type, status
	active            *prometheus.GaugeVec     // model
	ttft              *prometheus.HistogramVec // model
	itl               *prometheus.HistogramVec // model
	duration          *prometheus.HistogramVec // model
	outputTokens      *prometheus.CounterVec   // model
	disconnected      prometheus.Counter
	migrations        *prometheus.CounterVec   // model, migration_type
	maxSeqLenExceeded *prometheus.CounterVec   // model
	migrationDuration *prometheus.HistogramVec // model, migration_type, outcome
	rejections        *prometheus.CounterVec   // model, endpoint
	cancellations     *prometheus.CounterVec   // model, endpoint, request_type
	resumes           *prometheus.CounterVec   // model
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
		migrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynamo_frontend_model_migration_total", Help: "Requests re-dispatched to another worker.",
		}, []string{"model", "migration_type"}),
		maxSeqLenExceeded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynamo_frontend_model_migration_max_seq_len_exceeded_total", Help: "Requests whose migration was disabled by --migration-max-seq-len.",
		}, []string{"model"}),
		migrationDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dynamo_frontend_model_migration_duration_seconds", Help: "Time from a failure to the continuation's dispatch (or giving up).", Buckets: latency,
		}, []string{"model", "migration_type", "outcome"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynamo_frontend_model_rejection_total", Help: "Requests rejected with 503 because every worker was busy.",
		}, []string{"model", "endpoint"}),
		cancellations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynamo_frontend_model_cancellation_total", Help: "Requests cancelled.",
		}, []string{"model", "endpoint", "request_type"}),
		resumes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynamo_frontend_model_resume_total", Help: "Streams resumed on this replica.",
		}, []string{"model"}),
	}
	var errs []error
	for _, c := range []prometheus.Collector{
		m.requests, m.active, m.ttft, m.itl, m.duration, m.outputTokens, m.disconnected,
		m.migrations, m.maxSeqLenExceeded, m.migrationDuration, m.rejections, m.cancellations, m.resumes,
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
