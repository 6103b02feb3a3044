package worker_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/services/worker"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type env struct {
	t   *testing.T
	s   *natstest.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	log *streams.Log
}

func newEnv(t *testing.T) *env {
	t.Helper()
	s := natstest.Start(t)
	s.Provision(t) // as a frontend does: a worker provisions nothing
	nc := s.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, s: s, nc: nc, js: js, log: streams.NewLog(js, "baton/test")}
}

type running struct {
	w      *worker.Worker
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

// start runs a worker on its own connection until the test ends.
func (e *env) start(nc *nats.Conn, mock engine.MockConfig, cfg worker.Config) *running {
	e.t.Helper()
	eng, err := engine.NewMock(mock)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.startEngine(nc, eng, cfg)
}

// startEngine runs a worker in front of eng on nc until the test ends.
func (e *env) startEngine(nc *nats.Conn, eng engine.Engine, cfg worker.Config) *running {
	e.t.Helper()
	return e.run(e.newWorker(nc, eng, cfg, 5*time.Second, slog.LevelWarn))
}

// newWorker makes a worker in front of eng on nc (nil: a connection of its
// own) that stores in memory, with a lease TTL of 1 s and a shutdown budget
// of shutdown unless cfg sets them, and that logs from level up.
func (e *env) newWorker(nc *nats.Conn, eng engine.Engine, cfg worker.Config, shutdown time.Duration, level slog.Level) (*worker.Worker, *prometheus.Registry) {
	e.t.Helper()
	if nc == nil {
		nc = e.s.Connect(e.t)
	}
	cfg.Streams.MemoryStorage = true
	cfg.LeaseTTL = cmp.Or(cfg.LeaseTTL, time.Second)
	cfg.ShutdownTimeout = cmp.Or(cfg.ShutdownTimeout, shutdown)
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	w, err := worker.New(nc, eng, log, reg, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return w, reg
}

// run runs w until the test ends (its Run must return within 20 s of
// that), once it is registered.
func (e *env) run(w *worker.Worker, reg *prometheus.Registry) *running {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{w: w, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- w.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(20 * time.Second):
			e.t.Error("worker did not stop")
		}
	})
	e.waitRegistered(w)
	return r
}

// waitRegistered waits until w holds its lease. The lease is in the bucket
// before the worker holds it: it appends its registered event in between,
// so wait for both (CI once looked at /health in that window and saw the
// lease "lost", and once closed the connection in it, so that Run failed
// with "register: connection closed").
func (e *env) waitRegistered(w *worker.Worker) {
	e.t.Helper()
	e.waitFor("lease of "+w.ID(), func() bool {
		_, ok := e.lease(w.ID())
		return ok && w.Status().Lease == "live"
	})
}

// stop cancels the worker and returns Run's result.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("worker did not stop")
		return nil
	}
}

func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (e *env) kv(bucket string) jetstream.KeyValue {
	e.t.Helper()
	kv, err := e.js.KeyValue(context.Background(), bucket)
	if err != nil {
		e.t.Fatal(err)
	}
	return kv
}

// lease returns the worker's lease value if its key exists.
func (e *env) lease(id string) (events.Lease, bool) {
	kv, err := e.js.KeyValue(context.Background(), streams.LeasesBucket)
	if err != nil {
		return events.Lease{}, false
	}
	entry, err := kv.Get(context.Background(), id)
	if err != nil {
		return events.Lease{}, false
	}
	var l events.Lease
	if err := json.Unmarshal(entry.Value(), &l); err != nil {
		e.t.Fatalf("lease value %q: %v", entry.Value(), err)
	}
	return l, true
}

// workerEvents lists the worker's lifecycle events.
func (e *env) workerEvents(id string) []events.Envelope {
	e.t.Helper()
	ctx := context.Background()
	c, err := e.js.OrderedConsumer(ctx, streams.WorkersStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{streams.WorkerEvents(id)}})
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []events.Envelope
	if info.NumPending == 0 {
		return nil
	}
	batch, err := c.FetchNoWait(int(info.NumPending))
	if err != nil {
		e.t.Fatal(err)
	}
	for m := range batch.Messages() {
		ev, err := events.Unmarshal(events.Header(m.Headers()), m.Data())
		if err != nil {
			e.t.Fatalf("decode worker event: %v", err)
		}
		out = append(out, ev)
	}
	return out
}

func types(es []events.Envelope) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Type())
	}
	return out
}

// request reads a request's log.
func (e *env) request(id string) []events.Envelope {
	e.t.Helper()
	var out []events.Envelope
	for ev, err := range streams.ReadRequest(context.Background(), e.js, 1, id, 1) {
		if errors.Is(err, streams.ErrNotFound) {
			return nil
		}
		if err != nil {
			e.t.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}

// ended reports whether attempt's tokens subject has a completion or failure.
func ended(es []events.Envelope) (events.Envelope, bool) {
	for _, ev := range es {
		switch ev.Event.(type) {
		case events.RequestCompleted, events.AttemptFailed:
			return ev, true
		}
	}
	return events.Envelope{}, false
}

// accept appends the frontend's accepted and routed events for a request.
// dispatched accepts request id (accept) and dispatches it to workerID,
// failing the test unless the worker takes it.
func (e *env) dispatched(id, prompt string, maxTokens int, workerID string) {
	e.t.Helper()
	e.accept(id, prompt, maxTokens, workerID)
	if rep := e.dispatch(workerID, newDispatch(id, prompt, maxTokens)); !rep.Accepted {
		e.t.Fatalf("dispatch %s to %s: %+v", id, workerID, rep)
	}
}

func (e *env) accept(id, prompt string, maxTokens int, workerID string) {
	e.t.Helper()
	ctx := context.Background()
	acc := events.RequestAccepted{RequestID: id, Model: "mock", Endpoint: events.EndpointCompletions, Prompt: prompt,
		PromptTokens: engine.CountTokens(prompt), MaxTokens: maxTokens, Frontend: "fe-test"}
	if _, err := e.log.Append(ctx, streams.RequestEvents(id), e.log.Envelope(id+".accepted", id, acc), 0); err != nil {
		e.t.Fatal(err)
	}
	routed := events.RequestRouted{RequestID: id, Attempt: 0, WorkerID: workerID}
	if _, err := e.log.Append(ctx, streams.RequestEvents(id), e.log.Envelope(id+".routed.0", id, routed), -1); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) dispatch(workerID string, d events.Dispatch) streams.DispatchReply {
	e.t.Helper()
	data, _ := json.Marshal(d)
	m, err := e.nc.Request(streams.DispatchSubject(workerID), data, 5*time.Second)
	if err != nil {
		e.t.Fatalf("dispatch %s: %v", d.RequestID, err)
	}
	var r streams.DispatchReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		e.t.Fatalf("dispatch reply %q: %v", m.Data, err)
	}
	return r
}

func newDispatch(id, prompt string, maxTokens int) events.Dispatch {
	return events.Dispatch{RequestID: id, Model: "mock", Prompt: prompt, PromptTokens: engine.CountTokens(prompt),
		MaxTokens: maxTokens, Frontend: "fe-test"}
}

var fullSpeed = engine.MockConfig{SpeedupRatio: math.Inf(1)}

// slow emits a token every 100ms, after a 10ms TTFT.
var slow = engine.MockConfig{TokensPerSec: 10, TTFT: 10 * time.Millisecond}

func TestRegisterAndDeregister(t *testing.T) {
	e := newEnv(t)
	r := e.start(nil, fullSpeed, worker.Config{ID: "w-reg", Model: "mock"})
	l, _ := e.lease("w-reg")
	if l.WorkerID != "w-reg" || l.LeaseID == "" || l.Model != "mock" || l.PID != os.Getpid() || l.TTLMS != 1000 || l.Draining || l.ClientID == 0 || l.Server == "" {
		t.Errorf("lease value %+v", l)
	}
	msg, err := e.js.Conn().Request("$JS.API.DIRECT.GET.KV_"+streams.LeasesBucket, []byte(`{"last_by_subj":"$KV.baton_leases.w-reg"}`), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := msg.Header.Get("Nats-TTL"); got != "1s" {
		t.Errorf("lease message TTL %q, want 1s", got)
	}
	evs := e.workerEvents("w-reg")
	if len(evs) != 1 || evs[0].Type() != events.TypeWorkerRegistered {
		t.Fatalf("worker events %v, want registered", types(evs))
	}
	if reg := evs[0].Event.(events.WorkerRegistered); reg.LeaseID != l.LeaseID || reg.KVBlocks != engine.DefaultMockKVBlocks {
		t.Errorf("registered %+v, want lease %s", reg, l.LeaseID)
	}
	e.waitFor("load report", func() bool {
		entry, err := e.kv(streams.LoadBucket).Get(context.Background(), "w-reg")
		return err == nil && len(entry.Value()) > 0
	})

	if err := r.stop(t); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if _, ok := e.lease("w-reg"); ok {
		t.Error("lease key still there after shutdown")
	}
	if _, err := e.kv(streams.LoadBucket).Get(context.Background(), "w-reg"); err == nil {
		t.Error("load key still there after shutdown")
	}
	want := []string{events.TypeWorkerRegistered, events.TypeWorkerDraining, events.TypeWorkerDeregistered}
	if got := types(e.workerEvents("w-reg")); !equal(got, want) {
		t.Errorf("worker events %v, want %v", got, want)
	}
}

// signalWriter closes found when what it is written contains want.
type signalWriter struct {
	want  string
	once  sync.Once
	found chan struct{}
}

func (w *signalWriter) Write(p []byte) (int, error) {
	if strings.Contains(string(p), w.want) {
		w.once.Do(func() { close(w.found) })
	}
	return len(p), nil
}

// TestWorkerProvisionsNothing: on a server with no log a worker creates no
// stream or bucket (formerly it provisioned like a frontend, so a worker
// credential could define the log, issue 23): it says it waits, and
// registers once something else has provisioned.
func TestWorkerProvisionsNothing(t *testing.T) {
	s := natstest.Start(t)
	eng, err := engine.NewMock(fullSpeed)
	if err != nil {
		t.Fatal(err)
	}
	out := &signalWriter{want: "waiting for the log to be provisioned", found: make(chan struct{})}
	w, err := worker.New(s.Connect(t), eng, slog.New(slog.NewTextHandler(out, nil)), prometheus.NewRegistry(),
		worker.Config{ID: "w-wait", Model: "mock", LeaseTTL: time.Second, Streams: streams.Config{MemoryStorage: true}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	<-out.found
	js := s.JetStream(t)
	if names := streamNames(t, js); len(names) != 0 {
		t.Errorf("a waiting worker created streams %v, want none", names)
	}
	s.Provision(t)
	e := &env{t: t, s: s, js: js}
	e.waitFor("lease of w-wait", func() bool { _, ok := e.lease("w-wait"); return ok })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
}

func streamNames(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	var out []string
	l := js.StreamNames(context.Background())
	for n := range l.Name() {
		out = append(out, n)
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestLeaseExpiresWithoutRenewal(t *testing.T) {
	e := newEnv(t)
	nc := e.s.Connect(t)
	r := e.start(nc, fullSpeed, worker.Config{ID: "w-gone", ShutdownTimeout: time.Second})
	l, _ := e.lease("w-gone")
	// Let it renew past its TTL first: renewal keeps the key alive.
	time.Sleep(1500 * time.Millisecond)
	if got, ok := e.lease("w-gone"); !ok || got.LeaseID != l.LeaseID {
		t.Fatalf("lease after 1.5 TTL: %+v %v, want the same lease alive", got, ok)
	}
	nc.Close() // the worker can no longer renew, as if partitioned or stopped
	start := time.Now()
	e.waitFor("lease expiry", func() bool { _, ok := e.lease("w-gone"); return !ok })
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("lease expired after %v, want about the 1s TTL", d)
	}
	if err := r.stop(t); err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
}

// TestControlConnectionFollowsData: dispatches arrive on a connection of
// their own, which closes with the worker's connection, so a worker that
// can no longer reach the log takes no more work.
func TestControlConnectionFollowsData(t *testing.T) {
	e := newEnv(t)
	nc := e.s.Connect(t)
	r := e.start(nc, fullSpeed, worker.Config{ID: "w-ctl", ShutdownTimeout: time.Second})
	client := e.s.Connect(t)
	if _, err := client.Request(streams.DispatchSubject("w-ctl"), []byte(`{}`), 2*time.Second); err != nil {
		t.Fatalf("dispatch while connected: %v, want a reply", err)
	}
	nc.Close()
	e.waitFor("no responder on the dispatch subject", func() bool {
		_, err := client.Request(streams.DispatchSubject("w-ctl"), []byte(`{}`), 200*time.Millisecond)
		return errors.Is(err, nats.ErrNoResponders)
	})
	if err := r.stop(t); err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
}

func TestReRegistersAfterLeaseLoss(t *testing.T) {
	e := newEnv(t)
	r := e.start(nil, fullSpeed, worker.Config{ID: "w-back"})
	first, _ := e.lease("w-back")
	if err := e.kv(streams.LeasesBucket).Delete(context.Background(), "w-back"); err != nil {
		t.Fatal(err)
	}
	var second events.Lease
	e.waitFor("a new lease", func() bool {
		l, ok := e.lease("w-back")
		second = l
		return ok && l.LeaseID != first.LeaseID
	})
	// The key is visible before registration ends (the registered event,
	// then the gauge): wait for the gauge rather than race it.
	e.waitFor("lease_live 1 again", func() bool { return value(t, r.reg, "baton_worker_lease_live") == 1 })
	e.waitFor("second registered event", func() bool { return len(e.workerEvents("w-back")) == 2 })
	evs := e.workerEvents("w-back")
	if reg, ok := evs[1].Event.(events.WorkerRegistered); !ok || reg.LeaseID != second.LeaseID {
		t.Errorf("second event %+v, want registered with lease %s", evs[1].Event, second.LeaseID)
	}
}

// value sums the series of a gauge or counter.
func value(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	return v
}

func TestDispatchProducesDeterministicText(t *testing.T) {
	e := newEnv(t)
	r := e.start(nil, fullSpeed, worker.Config{ID: "w-gen", DeltaMaxTokens: 4})
	const prompt, n = "the quick brown fox jumps", 37
	e.dispatched("req-1", prompt, n, "w-gen")
	e.waitFor("completion", func() bool { _, ok := ended(e.request("req-1")); return ok })

	log := e.request("req-1")
	proj := projections.NewRequest()
	next := 0
	for _, ev := range log {
		proj.Apply(ev)
		if d, ok := ev.Event.(events.TokensGenerated); ok {
			if d.Offset != next || len(d.Tokens) == 0 || len(d.Tokens) > 4 {
				t.Errorf("delta at offset %d with %d tokens, want offset %d and 1-4 tokens", d.Offset, len(d.Tokens), next)
			}
			if ev.ID != events.ID("req-1", 0, d.Offset) || ev.Subject != "req-1" {
				t.Errorf("delta id %q subject %q", ev.ID, ev.Subject)
			}
			next = d.Offset + len(d.Tokens)
		}
	}
	if next != n {
		t.Errorf("deltas end at %d, want %d", next, n)
	}
	last := log[len(log)-1]
	c, ok := last.Event.(events.RequestCompleted)
	if !ok {
		t.Fatalf("last event %s, want completed", last.Type())
	}
	if c.FinishReason != engine.FinishLength || c.CompletionTokens != n || c.PromptTokens != 5 || last.ID != events.ID("req-1", 0, "completed") {
		t.Errorf("completed %+v id %q", c, last.ID)
	}
	if proj.Status != projections.StatusCompleted || proj.Skipped != 0 {
		t.Errorf("projection status %s skipped %d", proj.Status, proj.Skipped)
	}
	if got, want := proj.Text(), engine.MockText(prompt, 0, n); got != want {
		t.Errorf("text:\ngot  %q\nwant %q", got, want)
	}
	// The worker counts the request once its completion's append is
	// acknowledged, which may come after the test has read the completion.
	e.waitFor("requests_total", func() bool { return value(t, r.reg, "dynamo_component_requests_total") >= 1 })
	e.waitFor("inflight back to 0", func() bool {
		return value(t, r.reg, "dynamo_component_inflight_requests") == 0
	})
	if got := value(t, r.reg, "dynamo_component_requests_total"); got != 1 {
		t.Errorf("requests_total = %v, want 1", got)
	}
}

func TestDeltasFlushOnDelay(t *testing.T) {
	e := newEnv(t)
	e.start(nil, slow, worker.Config{ID: "w-delay", DeltaMaxTokens: 1000})
	e.accept("req-d", "a b", 3, "w-delay")
	e.dispatch("w-delay", newDispatch("req-d", "a b", 3))
	e.waitFor("completion", func() bool { _, ok := ended(e.request("req-d")); return ok })
	deltas := 0
	for _, ev := range e.request("req-d") {
		if _, ok := ev.Event.(events.TokensGenerated); ok {
			deltas++
		}
	}
	// Tokens 100ms apart with a 5ms delay bound: one delta each.
	if deltas != 3 {
		t.Errorf("%d deltas, want 3", deltas)
	}
}

// TestDeltasSentAtOnceWhenIdle: with no append in flight a token goes at
// once, whatever the coalescing delay (here an hour: the tokens would
// otherwise all wait for the end).
func TestDeltasSentAtOnceWhenIdle(t *testing.T) {
	e := newEnv(t)
	e.start(nil, slow, worker.Config{ID: "w-idle", DeltaMaxTokens: 1000, DeltaMaxDelay: time.Hour})
	e.accept("req-i", "a b", 3, "w-idle")
	e.dispatch("w-idle", newDispatch("req-i", "a b", 3))
	e.waitFor("completion", func() bool { _, ok := ended(e.request("req-i")); return ok })
	var sizes []int
	for _, ev := range e.request("req-i") {
		if d, ok := ev.Event.(events.TokensGenerated); ok {
			sizes = append(sizes, len(d.Tokens))
		}
	}
	if len(sizes) != 3 {
		t.Errorf("deltas of %v tokens, want 3 deltas of one (tokens 100ms apart, each acknowledged before the next)", sizes)
	}
}

func TestRefusals(t *testing.T) {
	e := newEnv(t)
	r := e.start(nil, slow, worker.Config{ID: "w-ref", MaxConcurrentRequests: 1, ShutdownTimeout: 500 * time.Millisecond})
	if rep := e.dispatch("w-ref", events.Dispatch{RequestID: "r-x", Model: "other", MaxTokens: 1}); rep.Accepted || rep.Reason != streams.RefusedWrongModel {
		t.Errorf("wrong model: %+v", rep)
	}
	if rep := e.dispatch("w-ref", events.Dispatch{RequestID: "bad id!", Model: "mock", MaxTokens: 1}); rep.Accepted || rep.Reason != streams.RefusedBadRequest {
		t.Errorf("bad id: %+v", rep)
	}
	m, err := e.nc.Request(streams.DispatchSubject("w-ref"), []byte("{not json"), 5*time.Second)
	if err != nil || string(m.Data) != `{"accepted":false,"reason":"bad_request"}` {
		t.Errorf("malformed: %q %v", m.Data, err)
	}
	e.accept("r-1", "x", 1000, "w-ref")
	if rep := e.dispatch("w-ref", newDispatch("r-1", "x", 1000)); !rep.Accepted {
		t.Fatalf("first: %+v", rep)
	}
	if rep := e.dispatch("w-ref", newDispatch("r-1", "x", 1000)); !rep.Accepted {
		t.Errorf("retried dispatch of a running attempt: %+v, want accepted", rep)
	}
	if rep := e.dispatch("w-ref", newDispatch("r-2", "x", 1000)); rep.Accepted || rep.Reason != streams.RefusedBusy {
		t.Errorf("second at max concurrency: %+v, want busy", rep)
	}
	// End r-1 here rather than leave it to the worker's shutdown at the
	// test's end: its 500 ms budget is for a hand-off, which a loaded
	// machine can overrun, and Run then returns with the generation still
	// running (goleak reported a leaked goroutine twice under load).
	e.cancel("w-ref", "r-1", events.CancelKill)
	e.waitFor("r-1 to end on the worker", func() bool { return r.w.Status().InFlight == 0 })
}

func TestShutdownHandsOff(t *testing.T) {
	e := newEnv(t)
	r := e.start(nil, slow, worker.Config{ID: "w-off", ShutdownTimeout: time.Second})
	e.dispatched("r-long", "x y", 1000, "w-off")
	e.waitFor("first delta", func() bool { return len(e.request("r-long")) > 2 })
	stopped := make(chan error, 1)
	go func() { stopped <- r.stop(t) }()
	e.waitFor("draining lease", func() bool { l, ok := e.lease("w-off"); return ok && l.Draining })
	if rep := e.dispatch("w-off", newDispatch("r-late", "x", 10)); rep.Accepted || rep.Reason != streams.RefusedDraining {
		t.Errorf("dispatch while draining: %+v, want draining", rep)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	log := e.request("r-long")
	last := log[len(log)-1]
	f, ok := last.Event.(events.AttemptFailed)
	if !ok || f.Reason != "shutdown" || f.WorkerID != "w-off" {
		t.Fatalf("last event %s %+v, want attempt_failed shutdown", last.Type(), last.Event)
	}
	proj := projections.NewRequest()
	for _, ev := range log {
		proj.Apply(ev)
	}
	if f.Offset != proj.Len() || proj.Len() == 0 {
		t.Errorf("hand-off offset %d, folded %d tokens", f.Offset, proj.Len())
	}
	if got, want := proj.Text(), engine.MockText("x y", 0, proj.Len()); got != want {
		t.Errorf("text %q, want %q", got, want)
	}
	if a, _ := proj.Current(); !a.Closed || a.CloseReason != "shutdown" {
		t.Errorf("attempt %+v, want closed by shutdown", a)
	}
	if _, ok := e.lease("w-off"); ok {
		t.Error("lease still there")
	}
}

// stubborn is an engine slow to stop: once its ctx is done it keeps
// Generate blocked until release is closed.
type stubborn struct {
	engine.Engine
	release chan struct{}
}

func (s stubborn) Generate(ctx context.Context, req engine.Request, emit func(engine.Token) error) (engine.Result, error) {
	res, err := s.Engine.Generate(ctx, req, emit)
	<-s.release
	return res, err
}

// TestShutdownLeavesWhenHandOffOverruns: a generation that does not stop
// when handed off must not eat the leave's part of the budget. The worker
// still revokes its lease and appends worker_deregistered, so it is not
// declared lost (the frontends migrate its attempts when the lease goes
// either way).
func TestShutdownLeavesWhenHandOffOverruns(t *testing.T) {
	e := newEnv(t)
	mock, err := engine.NewMock(slow)
	if err != nil {
		t.Fatal(err)
	}
	eng := stubborn{Engine: mock, release: make(chan struct{})}
	r := e.startEngine(nil, eng, worker.Config{ID: "w-stub", ShutdownTimeout: time.Second})
	e.dispatched("r-stub", "x y", 1000, "w-stub")
	e.waitFor("first delta", func() bool { return len(e.request("r-stub")) > 2 })
	stopped := make(chan error, 1)
	go func() { stopped <- r.stop(t) }()
	e.waitFor("deregistered", func() bool {
		evs := e.workerEvents("w-stub")
		return len(evs) > 0 && evs[len(evs)-1].Type() == events.TypeWorkerDeregistered
	})
	if _, ok := e.lease("w-stub"); ok {
		t.Error("lease still there after the worker left")
	}
	close(eng.release)
	if err := <-stopped; err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}

func TestCancelStop(t *testing.T) {
	e := newEnv(t)
	r := e.start(nil, slow, worker.Config{ID: "w-can"})
	e.accept("r-c", "p", 1000, "w-can")
	e.dispatch("w-can", newDispatch("r-c", "p", 1000))
	e.waitFor("first delta", func() bool { return len(e.request("r-c")) > 2 })
	e.cancel("w-can", "r-c", events.CancelStop)
	e.waitFor("completion", func() bool { _, ok := ended(e.request("r-c")); return ok })
	last, _ := ended(e.request("r-c"))
	if c, ok := last.Event.(events.RequestCompleted); !ok || c.FinishReason != worker.FinishCancelled {
		t.Errorf("outcome %+v, want completed cancelled", last.Event)
	}
	if got := value(t, r.reg, "dynamo_component_cancellation_total"); got != 1 {
		t.Errorf("cancellation_total = %v, want 1", got)
	}
}

func TestEngineFatal(t *testing.T) {
	e := newEnv(t)
	r := e.start(nil, engine.MockConfig{SpeedupRatio: math.Inf(1), EngineErrorAfter: 1}, worker.Config{ID: "w-bad"})
	e.accept("r-ok", "a", 3, "w-bad")
	e.dispatch("w-bad", newDispatch("r-ok", "a", 3))
	e.waitFor("first completion", func() bool { _, ok := ended(e.request("r-ok")); return ok })
	e.accept("r-bad", "a", 3, "w-bad")
	// Not e.dispatch: the worker starts generating before it answers (the
	// engine's time to first token starts first), and the engine fails at
	// once, so the worker may stop before its answer goes out (a frontend
	// then takes the dispatch as unanswered). What is checked is below.
	data, _ := json.Marshal(newDispatch("r-bad", "a", 3))
	if _, err := e.nc.Request(streams.DispatchSubject("w-bad"), data, time.Second); err != nil {
		t.Logf("dispatch r-bad: %v (the worker stopped first)", err)
	}
	select {
	case err := <-r.done:
		r.done <- err
		if !errors.Is(err, engine.ErrFatal) {
			t.Errorf("Run = %v, want ErrFatal", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("worker did not stop after an engine failure")
	}
	last, _ := ended(e.request("r-bad"))
	if f, ok := last.Event.(events.AttemptFailed); !ok || f.Reason != "engine_error" {
		t.Errorf("outcome %+v, want attempt_failed engine_error", last.Event)
	}
	if _, ok := e.lease("w-bad"); ok {
		t.Error("lease still there")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  worker.Config
		ok   bool
	}{
		{"zero", worker.Config{}, true},
		{"bad id", worker.Config{ID: "a.b"}, false},
		{"short ttl", worker.Config{LeaseTTL: 10 * time.Millisecond}, false},
		{"negatives", worker.Config{MaxConcurrentRequests: -1, ShutdownTimeout: -1, DeltaMaxTokens: -1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); (err == nil) != tc.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// TestLoadFallsToIdleAtOnce: the end of a request is reported at once, not
// after the load report spacing (LoadInterval) that token-by-token changes
// wait for: /v1/workers must not show a finished request as active.
func TestLoadFallsToIdleAtOnce(t *testing.T) {
	e := newEnv(t)
	const interval = 2 * time.Second
	// A long lease TTL, so that no refresh (every TTL/3) reports by chance.
	// The request is held at its 10th token until its load is reported, so
	// that it is running when the report comes, however slow the machine.
	mock, err := engine.NewMock(engine.MockConfig{TokensPerSec: 100, TTFT: time.Millisecond, HoldAtToken: 10})
	if err != nil {
		t.Fatal(err)
	}
	e.startEngine(nil, mock, worker.Config{ID: "w-load", LoadInterval: interval, LeaseTTL: time.Minute})
	active := func() int {
		entry, err := e.kv(streams.LoadBucket).Get(context.Background(), "w-load")
		if err != nil {
			return -1
		}
		var l events.Load
		if err := json.Unmarshal(entry.Value(), &l); err != nil {
			t.Fatal(err)
		}
		return l.ActiveRequests
	}
	e.waitFor("the first load report", func() bool { return active() == 0 })

	const prompt, n = "report my load", 250
	e.dispatched("req-load", prompt, n, "w-load")
	e.waitFor("the load report of the running request", func() bool { return active() == 1 })
	mock.Release()
	e.waitFor("completion", func() bool { _, ok := ended(e.request("req-load")); return ok })
	done := time.Now()
	deadline := done.Add(interval / 4)
	for active() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("load still shows %d active requests %v after the request completed (report spacing %v)", active(), time.Since(done), interval)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("load back to 0 active requests %v after the completed event was read", time.Since(done).Round(time.Millisecond))
}
