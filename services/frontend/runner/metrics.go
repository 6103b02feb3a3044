package runner

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the runtime's Prometheus series, with Dynamo's names and
// labels: what the runners decide (migrations, rejections) and cancel.
type metrics struct {
	migrations        *prometheus.CounterVec   // model, migration_type
	maxSeqLenExceeded *prometheus.CounterVec   // model
	migrationDuration *prometheus.HistogramVec // model, migration_type, outcome
	rejections        *prometheus.CounterVec   // model, endpoint
	cancellations     *prometheus.CounterVec   // model, endpoint, request_type

	// baton's own: why a worker left this frontend's routing.
	inhibitions        *prometheus.CounterVec // worker_id
	dispatchUnanswered *prometheus.CounterVec // worker_id
	adoptions          prometheus.Counter     // orphans taken over with no reader (adopt.go)
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	latency := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	m := &metrics{
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
		inhibitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_frontend_worker_inhibitions_total", Help: "Times this frontend took a worker out of its routing after a request-path failure.",
		}, []string{"worker_id"}),
		dispatchUnanswered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_frontend_dispatch_unanswered_total", Help: "Dispatches a worker did not answer within --dispatch-timeout (or could not be sent).",
		}, []string{"worker_id"}),
		adoptions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "baton_frontend_requests_adopted_total", Help: "Requests meant to outlive their client (background, X-Resumable) that this frontend took over from a departed one without a reader.",
		}),
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.migrations, m.maxSeqLenExceeded, m.migrationDuration, m.rejections, m.cancellations, m.inhibitions, m.dispatchUnanswered, m.adoptions} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}
