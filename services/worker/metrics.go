package worker

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of an accepted request, the status label of requests_total.
const (
	statusCompleted = "completed"  // generation finished (length, stop or cancel-stop)
	statusHandedOff = "handed_off" // stopped by shutdown; the frontend migrates it
	statusFailed    = "failed"     // engine or log error
	statusCancelled = "cancelled"  // killed by a cancel command
)

// metrics are the worker's Prometheus collectors, Dynamo's names first.
type metrics struct {
	requests     *prometheus.CounterVec // model, status
	inflight     *prometheus.GaugeVec   // model
	cancellation *prometheus.CounterVec // model, mode
	refused      *prometheus.CounterVec // model, reason
	leaseLive    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, workerID string) (*metrics, error) {
	constLabels := prometheus.Labels{"worker_id": workerID}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynamo_component_requests_total", ConstLabels: constLabels,
			Help: "Requests this worker accepted, by outcome.",
		}, []string{"model", "status"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dynamo_component_inflight_requests", ConstLabels: constLabels,
			Help: "Requests this worker is generating.",
		}, []string{"model"}),
		cancellation: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dynamo_component_cancellation_total", ConstLabels: constLabels,
			Help: "Requests cancelled by a cancel command while generating.",
		}, []string{"model", "mode"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_worker_dispatch_refused_total", ConstLabels: constLabels,
			Help: "Dispatches this worker refused, by reason.",
		}, []string{"model", "reason"}),
		leaseLive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "baton_worker_lease_live", ConstLabels: constLabels,
			Help: "1 while this worker holds a live lease, else 0.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.requests, m.inflight, m.cancellation, m.refused, m.leaseLive} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("worker: register metrics: %w", err)
	}
	return m, nil
}
