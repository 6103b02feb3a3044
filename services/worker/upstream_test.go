package worker_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/services/worker"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
)

// upstreamEngine emits two tokens with ids and details, then fails with
// the scripted upstream error (or stops, when none is set); its probe fails
// with probeErr while set.
type upstreamEngine struct {
	mu       sync.Mutex
	fail     *engine.UpstreamError
	probeErr error
}

func (u *upstreamEngine) Generate(ctx context.Context, req engine.Request, emit func(engine.Token) error) (engine.Result, error) {
	u.mu.Lock()
	fail := u.fail
	u.mu.Unlock()
	if err := emit(engine.Token{Text: "a", ID: 5, HasID: true, PromptIDs: []int{1, 2}, Details: json.RawMessage(`{"refusal":"no"}`)}); err != nil {
		return engine.Result{}, err
	}
	if err := emit(engine.Token{Text: "b", ID: 6, HasID: true}); err != nil {
		return engine.Result{}, err
	}
	if fail == nil {
		return engine.Result{FinishReason: "stop"}, nil
	}
	return engine.Result{}, fail
}

func (u *upstreamEngine) Stats() engine.Stats { return engine.Stats{} }

func (u *upstreamEngine) Probe(context.Context) (engine.Capabilities, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return engine.Capabilities{Chat: true, Completions: true, TokenIDs: true}, u.probeErr
}

func (u *upstreamEngine) set(fail *engine.UpstreamError, probeErr error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.fail, u.probeErr = fail, probeErr
}

// runWorker runs a worker of eng under cfg (its streams in memory) until
// the test ends; done has what its Run returned.
func runWorker(t *testing.T, e *env, eng engine.Engine, cfg worker.Config) (w *worker.Worker, done <-chan error) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	cfg.Streams.MemoryStorage = true
	w, err := worker.New(e.s.Connect(t), eng, log, nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() { ch <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-ch
	})
	return w, ch
}

// TestUpstreamFailures: an upstream failure is an attempt_failed with its
// class, status, code, message and Retry-After, after the tokens (ids,
// prompt ids, details) produced before it; it never stops the worker. A
// 401 makes the worker not ready with the reason in its lease and status,
// until a probe passes again. The probed capabilities are in the lease.
func TestUpstreamFailures(t *testing.T) {
	e := newEnv(t)
	eng := &upstreamEngine{}
	eng.set(&engine.UpstreamError{Class: events.FailureUnavailable, Status: 429, Code: "TooManyRequests", Message: "slow down", RetryAfter: 2 * time.Second}, nil)
	w, done := runWorker(t, e, eng, worker.Config{ID: "w-up", Model: "mock", LeaseTTL: time.Second, UpstreamProbeInterval: 50 * time.Millisecond})
	e.waitFor("lease with capabilities", func() bool {
		l, ok := e.lease("w-up")
		return ok && l.Capabilities != nil && l.Capabilities.TokenIDs && !l.Capabilities.Prefill
	})

	e.accept("r-429", "a", 5, "w-up")
	e.dispatch("w-up", newDispatch("r-429", "a", 5))
	e.waitFor("attempt_failed", func() bool { _, ok := ended(e.request("r-429")); return ok })
	var toks events.TokensGenerated // the attempt's deltas, merged (a token may have gone alone)
	for _, ev := range e.request("r-429") {
		if d, ok := ev.Event.(events.TokensGenerated); ok {
			if d.Offset == 0 {
				toks.PromptIDs = d.PromptIDs
			}
			toks.IDs = append(toks.IDs, d.IDs...)
			details := d.Details
			if details == nil {
				details = make([]json.RawMessage, len(d.Tokens))
			}
			toks.Details = append(toks.Details, details...)
		}
	}
	if !reflect.DeepEqual(toks.IDs, []int{5, 6}) || !reflect.DeepEqual(toks.PromptIDs, []int{1, 2}) || len(toks.Details) != 2 || string(toks.Details[0]) != `{"refusal":"no"}` || (toks.Details[1] != nil && string(toks.Details[1]) != "null") {
		t.Errorf("delta %+v, want ids, prompt ids and details", toks)
	}
	last, _ := ended(e.request("r-429"))
	f, ok := last.Event.(events.AttemptFailed)
	if !ok || f.Class != events.FailureUnavailable || f.Status != 429 || f.Code != "TooManyRequests" || f.Message != "slow down" || f.RetryAfterMS != 2000 || f.Offset != 2 || f.Reason != events.FailureUnavailable {
		t.Errorf("outcome %+v", last.Event)
	}
	if l, _ := e.lease("w-up"); l.NotReady || !w.Ready() {
		t.Errorf("a 429 made the worker not ready: %+v", l)
	}

	eng.set(&engine.UpstreamError{Class: events.FailureNotReady, Status: 401, Message: "Unauthorized"}, &engine.UpstreamError{Class: events.FailureNotReady, Status: 401, Message: "Unauthorized"})
	e.accept("r-401", "a", 5, "w-up")
	e.dispatch("w-up", newDispatch("r-401", "a", 5))
	e.waitFor("not ready with the reason", func() bool {
		l, _ := e.lease("w-up")
		return l.NotReady && strings.Contains(l.NotReadyReason, "401")
	})
	if st := w.Status(); st.Engine != "upstream_not_ready" || !strings.Contains(st.Reason, "Unauthorized") {
		t.Errorf("status %+v", st)
	}
	// Not ready, it refuses what still comes (a frontend that has not seen
	// its lease change yet).
	if r := e.dispatch("w-up", newDispatch("r-not-ready", "a", 5)); r.Accepted || r.Reason != streams.RefusedNotReady {
		t.Errorf("a dispatch while the upstream refuses the worker: %+v, want refused %s", r, streams.RefusedNotReady)
	}
	eng.set(nil, nil) // the key is fixed: the next probe passes
	e.waitFor("ready again", func() bool { l, _ := e.lease("w-up"); return !l.NotReady && l.NotReadyReason == "" })
	select {
	case err := <-done:
		t.Fatalf("worker stopped: %v", err)
	default:
	}
}

// slowProbe is an upstreamEngine whose first probe closes probing, then
// waits for release.
type slowProbe struct {
	upstreamEngine
	probing, release chan struct{}
	once             sync.Once
}

func (p *slowProbe) Probe(ctx context.Context) (engine.Capabilities, error) {
	p.once.Do(func() {
		close(p.probing)
		select {
		case <-p.release:
		case <-ctx.Done():
		}
	})
	return p.upstreamEngine.Probe(ctx)
}

// TestNoDispatchBeforeTheProbe: a worker listens for dispatches only once
// its upstream's probe answered. A dispatch can come before its lease
// exists (to a crashed incarnation's lease, still live): one served while
// the engine's capabilities were unknown went without token ids, and the
// answer, migrated, continued from its text into other tokens (the chaos
// soak's OpenAI-engine profile). Before the probe answers nobody listens;
// after it, the dispatch is served.
func TestNoDispatchBeforeTheProbe(t *testing.T) {
	e := newEnv(t)
	eng := &slowProbe{probing: make(chan struct{}), release: make(chan struct{})}
	runWorker(t, e, eng, worker.Config{ID: "w-slow", Model: "mock", LeaseTTL: time.Second})
	select {
	case <-eng.probing:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker never probed its upstream")
	}
	data, _ := json.Marshal(newDispatch("r-early", "a", 5))
	if m, err := e.nc.Request(streams.DispatchSubject("w-slow"), data, time.Second); err != nats.ErrNoResponders {
		t.Fatalf("a dispatch while the upstream's probe runs: %v (%v), want no responders", err, m)
	}
	close(eng.release)
	e.waitFor("lease with capabilities", func() bool {
		l, ok := e.lease("w-slow")
		return ok && l.Capabilities != nil && l.Capabilities.TokenIDs
	})
	e.accept("r-after", "a", 5, "w-slow")
	if r := e.dispatch("w-slow", newDispatch("r-after", "a", 5)); !r.Accepted {
		t.Errorf("a dispatch after the probe: %+v, want accepted", r)
	}
}

// TestUpstreamBusyProbe (issue 35): a server that answers the probe 429 (or
// 503) leaves the worker ready, with the routes it showed, but busy in its
// load report, which routers honour; the probe runs again at the server's
// Retry-After, and once it passes the worker is no longer busy.
func TestUpstreamBusyProbe(t *testing.T) {
	e := newEnv(t)
	eng := &upstreamEngine{}
	eng.set(nil, &engine.UpstreamError{Class: events.FailureUnavailable, Status: 429, Message: "slow down", RetryAfter: 500 * time.Millisecond})
	w, _ := runWorker(t, e, eng, worker.Config{ID: "w-busy", Model: "mock", LeaseTTL: time.Second})
	load := func() events.Load {
		entry, err := e.kv(streams.LoadBucket).Get(context.Background(), "w-busy")
		if err != nil {
			return events.Load{}
		}
		var l events.Load
		_ = json.Unmarshal(entry.Value(), &l)
		return l
	}
	e.waitFor("busy in the load report", func() bool { return load().Busy })
	if l, ok := e.lease("w-busy"); !ok || l.NotReady || l.Capabilities == nil || !l.Capabilities.Chat {
		t.Errorf("lease %+v, want ready with the chat route", l)
	}
	if st := w.Status(); st.Status != "ready" || !st.Busy || st.BusyUntil == "" {
		t.Errorf("status %+v, want ready and busy", st)
	}
	eng.set(nil, nil)
	e.waitFor("not busy after the probe at Retry-After", func() bool { return !load().Busy })
	if l, _ := e.lease("w-busy"); l.NotReady || !l.Capabilities.TokenIDs {
		t.Errorf("lease %+v, want ready with every capability probed", l)
	}
}
