package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/baton-dev/baton/services/engine"

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
	ready        prometheus.GaugeFunc   // what /health says, as 0/1
	stalled      prometheus.GaugeFunc   // engine stopped making progress, 0/1
	canaries     *prometheus.CounterVec // model, outcome
	canaryOK     prometheus.Gauge       // unix time of the last passing canary
	// What the engine itself says, read at scrape time: the generations it
	// runs and those it aborted (a cancel, a client gone, a fence).
	engineActive    prometheus.GaugeFunc
	engineAborted   prometheus.CounterFunc
	engineLastAbort prometheus.GaugeFunc
}

// newMetrics builds the collectors; ready, stalled and stats are read at
// scrape time.
func newMetrics(reg prometheus.Registerer, workerID string, ready, stalled func() bool, stats func() engine.Stats) (*metrics, error) {
	// opts names a series of this worker (its worker_id label).
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Name: name, Help: help, ConstLabels: prometheus.Labels{"worker_id": workerID}}
	}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts(opts("dynamo_component_requests_total",
			"Requests this worker accepted, by outcome.")), []string{"model", "status"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts(opts("dynamo_component_inflight_requests",
			"Requests this worker is generating.")), []string{"model"}),
		cancellation: prometheus.NewCounterVec(prometheus.CounterOpts(opts("dynamo_component_cancellation_total",
			"Requests cancelled by a cancel command while generating.")), []string{"model", "mode"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts(opts("baton_worker_dispatch_refused_total",
			"Dispatches this worker refused, by reason.")), []string{"model", "reason"}),
		leaseLive: prometheus.NewGauge(prometheus.GaugeOpts(opts("baton_worker_lease_live",
			"1 while this worker holds a live lease, else 0."))),
		ready: prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("baton_worker_ready",
			"1 while the worker is ready (lease live, not draining, health checks passing), as /health says, else 0.")), func() float64 { return b2f(ready()) }),
		stalled: prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("baton_worker_engine_stalled",
			"1 while in-flight requests have produced no token for the health check timeout, else 0.")), func() float64 { return b2f(stalled()) }),
		canaries: prometheus.NewCounterVec(prometheus.CounterOpts(opts("baton_worker_canary_total",
			"Canary health checks sent to the engine, by outcome (success or failure).")), []string{"model", "outcome"}),
		canaryOK: prometheus.NewGauge(prometheus.GaugeOpts(opts("baton_worker_canary_last_success_timestamp_seconds",
			"Unix time of the last canary that passed; 0 if none has."))),
		engineActive: prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("baton_engine_active_requests",
			"Generations the engine runs now, as the engine counts them (a slot held by a cancelled request shows here).")), func() float64 { return float64(stats().ActiveRequests) }),
		engineAborted: prometheus.NewCounterFunc(prometheus.CounterOpts(opts("baton_engine_aborted_total",
			"Generations the engine aborted because they were cancelled (a cancel, a client gone, a fence, a hand-off).")), func() float64 { return float64(stats().Aborted) }),
		engineLastAbort: prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("baton_engine_last_abort_timestamp_seconds",
			"Unix time at which the latest aborted generation let go of the engine; 0 if none has.")), func() float64 { return unixSeconds(stats().LastAbort) }),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.requests, m.inflight, m.cancellation, m.refused, m.leaseLive, m.ready, m.stalled, m.canaries, m.canaryOK,
		m.engineActive, m.engineAborted, m.engineLastAbort} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("worker: register metrics: %w", err)
	}
	return m, nil
}

func unixSeconds(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixNano()) / 1e9
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
