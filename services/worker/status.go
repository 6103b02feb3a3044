package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Status is the body of the status server's /health, in Dynamo's shape
// (status and endpoints) with baton's reasons added.
type Status struct {
	Status    string            `json:"status"`    // "ready" or "notready"
	Endpoints map[string]string `json:"endpoints"` // "generate": "ready" | "notready"
	WorkerID  string            `json:"worker_id"`
	Model     string            `json:"model"`
	LeaseID   string            `json:"lease_id,omitempty"`
	Lease     string            `json:"lease"` // "live" or "lost"
	// Engine is "ok", "stalled", "canary_failed", "upstream_not_ready",
	// "engine_unreachable" or "engine_hung".
	Engine string `json:"engine"`
	// Reason is why the upstream cannot serve, when Engine is
	// "upstream_not_ready" (its status and message), or the engine
	// watch's error when it is "engine_unreachable" or "engine_hung".
	Reason string `json:"reason,omitempty"`
	// Capabilities are what the engine's server can do, as probed.
	Capabilities *events.Capabilities `json:"capabilities,omitempty"`
	Draining     bool                 `json:"draining"`
	// Busy: the server answered the last probe 429 or 503; the worker is
	// ready but out of every router until BusyUntil, when it probes again.
	Busy      bool   `json:"busy,omitempty"`
	BusyUntil string `json:"busy_until,omitempty"`
	InFlight  int    `json:"in_flight"`
	// EngineActive is the generations the engine runs, as it counts them;
	// EngineAborted those it aborted because they were cancelled, and
	// EngineLastAbort when the latest let go of the engine (RFC 3339, empty
	// if none has).
	EngineActive    int    `json:"engine_active"`
	EngineAborted   int64  `json:"engine_aborted"`
	EngineLastAbort string `json:"engine_last_abort,omitempty"`
}

// Ready reports whether the worker may receive new requests: its lease is
// live, it is not draining, its last canary did not fail and its engine is
// not stalled. It is what /health and baton_worker_ready say.
func (w *Worker) Ready() bool { return w.Status().Status == "ready" }

// Status returns the worker's current health, as /health serves it.
func (w *Worker) Status() Status {
	healthy, why := w.health.state()
	l := w.registration.current()
	w.mu.Lock()
	draining, n := w.draining, len(w.jobs)
	w.mu.Unlock()
	s := Status{
		WorkerID: w.cfg.ID, Model: w.cfg.Model, Lease: "lost", Engine: why,
		Draining: draining, InFlight: n, Reason: w.health.detail(), Capabilities: w.upstream.capabilities(),
	}
	if busy, until := w.upstream.busy(); busy {
		s.Busy, s.BusyUntil = true, until.UTC().Format(time.RFC3339Nano)
	}
	st := w.eng.Stats()
	s.EngineActive, s.EngineAborted = st.ActiveRequests, st.Aborted
	if !st.LastAbort.IsZero() {
		s.EngineLastAbort = st.LastAbort.UTC().Format(time.RFC3339Nano)
	}
	live := false
	if l != nil {
		select {
		case <-l.Done():
		default:
			live = true
			s.Lease, s.LeaseID = "live", l.ID()
		}
	}
	s.Status = "notready"
	if live && !draining && healthy {
		s.Status = "ready"
	}
	s.Endpoints = map[string]string{"generate": s.Status}
	return s
}

// Listen binds the status server's address now, so that callers learn the
// port before Run (Config.SystemAddr ":0" picks one). Run calls it if it was
// not called. It returns nil if the status server is off.
func (w *Worker) Listen() (net.Addr, error) { return w.server.listen() }

// Handler returns the status server's routes: GET /live (200 while the
// process runs), GET /health (200 ready or 503 notready, body Status) and
// GET /metrics (the registry given to New, if it is a Gatherer).
func (w *Worker) Handler() http.Handler { return w.server.handler() }

// statusServer is the worker's status server (Config.SystemAddr): /live,
// /health from status, and /metrics from gatherer. Its methods are safe for
// concurrent use.
type statusServer struct {
	addr     string // Config.SystemAddr; empty: no status server
	status   func() Status
	gatherer prometheus.Gatherer
	log      *slog.Logger

	mu       sync.Mutex
	listener net.Listener // nil when off or not yet bound
}

func (ss *statusServer) listen() (net.Addr, error) {
	if ss.addr == "" {
		return nil, nil
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.listener != nil {
		return ss.listener.Addr(), nil
	}
	l, err := net.Listen("tcp", ss.addr)
	if err != nil {
		return nil, fmt.Errorf("worker: status server: listen %s: %w", ss.addr, err)
	}
	ss.listener = l
	return l.Addr(), nil
}

func (ss *statusServer) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /live", func(rw http.ResponseWriter, _ *http.Request) {
		writeJSON(rw, http.StatusOK, map[string]string{"status": "live"})
	})
	mux.HandleFunc("GET /health", func(rw http.ResponseWriter, _ *http.Request) {
		s := ss.status()
		code := http.StatusOK
		if s.Status != "ready" {
			code = http.StatusServiceUnavailable
		}
		writeJSON(rw, code, s)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(ss.gatherer, promhttp.HandlerOpts{}))
	return mux
}

func writeJSON(rw http.ResponseWriter, code int, v any) {
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(code)
	_ = json.NewEncoder(rw).Encode(v)
}

// serve starts the status server if it is configured; stop closes it.
func (ss *statusServer) serve() (stop func(), err error) {
	if _, err := ss.listen(); err != nil {
		return nil, err
	}
	ss.mu.Lock()
	l := ss.listener
	ss.mu.Unlock()
	if l == nil {
		return func() {}, nil
	}
	srv := &http.Server{Handler: ss.handler(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			ss.log.Error("status server", "err", err)
		}
	}()
	ss.log.Info("status server listening", "addr", l.Addr().String())
	return func() {
		_ = srv.Close() // probes are short; nothing to drain
		<-done
	}, nil
}
