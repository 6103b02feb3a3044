package worker_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/services/worker"
)

// stallable wraps the mock: while stallAll is set every Generate blocks
// until cancelled; stallReqs stalls real requests (not canaries) after
// their first token.
type stallable struct {
	*engine.Mock
	stallAll  atomic.Bool
	stallReqs atomic.Bool
}

func (s *stallable) Generate(ctx context.Context, req engine.Request, emit func(engine.Token) error) (engine.Result, error) {
	if s.stallAll.Load() {
		<-ctx.Done()
		return engine.Result{}, ctx.Err()
	}
	if s.stallReqs.Load() && !strings.HasPrefix(req.RequestID, "canary-") {
		r, err := s.Mock.Generate(ctx, engine.Request{RequestID: req.RequestID, Prompt: req.Prompt, MaxTokens: 1}, emit)
		if err != nil {
			return r, err
		}
		<-ctx.Done()
		return engine.Result{}, ctx.Err()
	}
	return s.Mock.Generate(ctx, req, emit)
}

// gated is an engine whose requests start producing once open is closed.
type gated struct {
	*engine.Mock
	open chan struct{}
}

func (g *gated) Generate(ctx context.Context, req engine.Request, emit func(engine.Token) error) (engine.Result, error) {
	select {
	case <-g.open:
	case <-ctx.Done():
		return engine.Result{}, ctx.Err()
	}
	return g.Mock.Generate(ctx, req, emit)
}

// startStatus runs a worker on eng with a status server on a random port.
func (e *env) startStatus(eng engine.Engine, cfg worker.Config) (*running, string) {
	e.t.Helper()
	cfg.SystemAddr = "127.0.0.1:0"
	w, reg := e.newWorker(nil, eng, cfg, 2*time.Second, slog.LevelError)
	addr, err := w.Listen()
	if err != nil {
		e.t.Fatal(err)
	}
	return e.run(w, reg), "http://" + addr.String()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func health(t *testing.T, base string) (int, worker.Status) {
	t.Helper()
	code, body := get(t, base+"/health")
	var s worker.Status
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatalf("/health body %q: %v", body, err)
	}
	return code, s
}

// routable folds the worker's current lease into a discovery view.
func (e *env) routable(id string) bool {
	l, ok := e.lease(id)
	if !ok {
		return false
	}
	d := projections.NewDiscovery()
	d.ApplyLease(projections.LeaseUpdate{Key: id, Revision: 1, Lease: &l})
	return len(d.Routable(l.Model)) == 1
}

func TestStatusServer(t *testing.T) {
	e := newEnv(t)
	mock, _ := engine.NewMock(fullSpeed)
	// A lease of 10 s: the 1 s of the other status tests, renewed every
	// third of it, could lapse on a loaded machine before the look at
	// /health below, which wants it live.
	r, base := e.startStatus(mock, worker.Config{ID: "w-st", LeaseTTL: 10 * time.Second})

	if code, body := get(t, base+"/live"); code != http.StatusOK || strings.TrimSpace(body) != `{"status":"live"}` {
		t.Errorf("/live = %d %q", code, body)
	}
	code, s := health(t, base)
	if code != http.StatusOK || s.Status != "ready" || s.Endpoints["generate"] != "ready" || s.Lease != "live" || s.Engine != "ok" || s.WorkerID != "w-st" {
		t.Errorf("/health = %d %+v, want 200 ready", code, s)
	}
	code, body := get(t, base+"/metrics")
	for _, name := range []string{"baton_worker_ready", "baton_worker_lease_live", "baton_worker_engine_stalled", "baton_worker_canary_last_success_timestamp_seconds"} {
		if !strings.Contains(body, name) {
			t.Errorf("/metrics (%d) lacks %s", code, name)
		}
	}
	if got := value(t, r.reg, "baton_worker_ready"); got != 1 {
		t.Errorf("baton_worker_ready = %v, want 1", got)
	}

	if err := r.stop(t); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if _, err := http.Get(base + "/live"); err == nil {
		t.Error("status server still answers after Run returned")
	}
}

func TestStatusNotReadyWhileDraining(t *testing.T) {
	e := newEnv(t)
	mock, _ := engine.NewMock(fullSpeed)
	// The request produces nothing until the test has seen the worker
	// draining, so that it drains for as long as the test looks (before,
	// 20 tokens at 10/s drained in 2 s, and a loaded machine sometimes took
	// longer than that to look); then it drains to completion well within
	// the budget.
	eng := &gated{Mock: mock, open: make(chan struct{})}
	r, base := e.startStatus(eng, worker.Config{ID: "w-dr", ShutdownTimeout: 15 * time.Second})
	e.dispatched("r-dr", "x", 20, "w-dr")
	stopped := make(chan error, 1)
	go func() { stopped <- r.stop(t) }()
	e.waitFor("draining", func() bool { l, ok := e.lease("w-dr"); return ok && l.Draining })
	if code, s := health(t, base); code != http.StatusServiceUnavailable || s.Status != "notready" || !s.Draining {
		t.Errorf("/health while draining = %d %+v, want 503 notready draining", code, s)
	}
	close(eng.open)
	if err := <-stopped; err != nil {
		t.Fatalf("Run = %v", err)
	}
	last, _ := ended(e.request("r-dr"))
	if c, ok := last.Event.(events.RequestCompleted); !ok || c.CompletionTokens != 20 {
		t.Errorf("outcome %+v, want the in-flight request drained to completion", last.Event)
	}
}

func TestCanaryTakesStalledEngineOutOfRouting(t *testing.T) {
	e := newEnv(t)
	mock, _ := engine.NewMock(fullSpeed)
	eng := &stallable{Mock: mock}
	r, base := e.startStatus(eng, worker.Config{ID: "w-can", HealthCheck: true,
		CanaryWait: 50 * time.Millisecond, HealthCheckTimeout: 200 * time.Millisecond})

	e.waitFor("a passing canary", func() bool {
		return value(t, r.reg, "baton_worker_canary_last_success_timestamp_seconds") > 0
	})
	if !e.routable("w-can") {
		t.Fatal("not routable while canaries pass")
	}
	eng.stallAll.Store(true)
	e.waitFor("not-ready lease", func() bool { l, ok := e.lease("w-can"); return ok && l.NotReady })
	if e.routable("w-can") {
		t.Error("a not-ready worker is routable")
	}
	if code, s := health(t, base); code != http.StatusServiceUnavailable || s.Engine != "canary_failed" || s.Endpoints["generate"] != "notready" {
		t.Errorf("/health = %d %+v, want 503 canary_failed", code, s)
	}
	if got := value(t, r.reg, "baton_worker_ready"); got != 0 {
		t.Errorf("baton_worker_ready = %v, want 0", got)
	}
	eng.stallAll.Store(false)
	e.waitFor("ready lease again", func() bool { l, ok := e.lease("w-can"); return ok && !l.NotReady })
	if !e.routable("w-can") {
		t.Error("not routable after a canary passed again")
	}
	if code, _ := health(t, base); code != http.StatusOK {
		t.Errorf("/health = %d after recovery, want 200", code)
	}
}

// An in-flight request that stops making progress makes the worker not
// ready even though canaries pass (Dynamo issue #13429).
func TestStalledRequestMakesWorkerNotReady(t *testing.T) {
	e := newEnv(t)
	mock, _ := engine.NewMock(fullSpeed)
	eng := &stallable{Mock: mock}
	eng.stallReqs.Store(true)
	_, base := e.startStatus(eng, worker.Config{ID: "w-stl", HealthCheck: true,
		CanaryWait: 50 * time.Millisecond, HealthCheckTimeout: 200 * time.Millisecond})
	e.dispatched("r-stl", "x", 100, "w-stl")
	e.waitFor("not-ready lease", func() bool { l, ok := e.lease("w-stl"); return ok && l.NotReady })
	if code, s := health(t, base); code != http.StatusServiceUnavailable || s.Engine != "stalled" || s.InFlight != 1 {
		t.Errorf("/health = %d %+v, want 503 stalled with 1 in flight", code, s)
	}
	// The frontend gives up on it (here: a kill); the canary then passes.
	e.cancel("w-stl", "r-stl", events.CancelKill)
	e.waitFor("ready lease again", func() bool { l, ok := e.lease("w-stl"); return ok && !l.NotReady })
}
