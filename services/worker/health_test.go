package worker

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/engine"
)

// monitorProbe is a probe whose outcome the test sets; it records its calls.
type monitorProbe struct {
	mu    sync.Mutex
	err   error
	hang  bool
	calls []time.Time
}

func (p *monitorProbe) probe(ctx context.Context) error {
	p.mu.Lock()
	p.calls = append(p.calls, time.Now())
	hang, err := p.hang, p.err
	p.mu.Unlock()
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	return err
}

func (p *monitorProbe) set(err error, hang bool) {
	p.mu.Lock()
	p.err, p.hang = err, hang
	p.mu.Unlock()
}

func (p *monitorProbe) n() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.calls)
}

// runMonitor starts a monitor with wait 10s and timeout 3s inside a synctest
// bubble; changes records what onChange reported.
func runMonitor(t *testing.T, p *monitorProbe) (m *monitor, changes func() []bool, stop func()) {
	var mu sync.Mutex
	var got []bool
	m = newMonitor(true, 10*time.Second, 3*time.Second, p.probe, func(h bool) {
		mu.Lock()
		got = append(got, h)
		mu.Unlock()
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	return m, func() []bool {
			mu.Lock()
			defer mu.Unlock()
			return append([]bool(nil), got...)
		}, func() {
			cancel()
			<-done
		}
}

func TestMonitorCanaryAfterIdleness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &monitorProbe{}
		start := time.Now()
		m, changes, stop := runMonitor(t, p)
		defer stop()
		time.Sleep(9 * time.Second)
		synctest.Wait()
		if got := p.n(); got != 0 {
			t.Fatalf("got %d canaries after 9s idle, want 0", got)
		}
		// Activity pushes the next canary back.
		m.started()
		time.Sleep(2 * time.Second)
		m.token()
		m.ended(false) // at 11s
		time.Sleep(9 * time.Second)
		synctest.Wait()
		if got := p.n(); got != 0 {
			t.Fatalf("got %d canaries 9s after the last request, want 0", got)
		}
		time.Sleep(1 * time.Second)
		synctest.Wait()
		p.mu.Lock()
		first := p.calls[0].Sub(start)
		p.mu.Unlock()
		if got := p.n(); got != 1 || first != 21*time.Second {
			t.Fatalf("got %d canaries (first at %v), want 1 at 21s", got, first)
		}
		// Canaries repeat every wait while idle.
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := p.n(); got != 2 {
			t.Errorf("got %d canaries, want 2", got)
		}
		if got := changes(); len(got) != 0 {
			t.Errorf("got health changes %v, want none", got)
		}
	})
}

func TestMonitorCanaryFailureAndRecovery(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		hang bool
	}{
		{"error", errors.New("boom"), false},
		{"timeout", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := &monitorProbe{}
				p.set(tc.err, tc.hang)
				m, changes, stop := runMonitor(t, p)
				defer stop()
				time.Sleep(10*time.Second + 3*time.Second + time.Millisecond)
				synctest.Wait()
				if h, why := m.state(); h || why != canaryFailed {
					t.Fatalf("got state %v %q after a failed canary, want not healthy, %q", h, why, canaryFailed)
				}
				p.set(nil, false)
				time.Sleep(10 * time.Second)
				synctest.Wait()
				if h, _ := m.state(); !h {
					t.Fatal("still not healthy after a passing canary")
				}
				if got := changes(); len(got) != 2 || got[0] || !got[1] {
					t.Errorf("got health changes %v, want [false true]", got)
				}
			})
		})
	}
}

func TestMonitorStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &monitorProbe{}
		m, changes, stop := runMonitor(t, p)
		defer stop()
		m.started()
		time.Sleep(2 * time.Second)
		m.token()
		stallsAfterTimeout(t, m)
		m.token() // progress again: healthy at once
		synctest.Wait()
		if h, _ := m.state(); !h {
			t.Fatal("still stalled after a token")
		}
		// Stalled again, then the request ends without a token: a canary
		// runs at once and decides.
		time.Sleep(3*time.Second + time.Millisecond)
		synctest.Wait()
		p.set(nil, true)
		m.ended(false)
		synctest.Wait()
		if got := p.n(); got != 1 {
			t.Fatalf("got %d canaries after a stalled request ended, want 1 at once", got)
		}
		if h, _ := m.state(); h {
			t.Fatal("healthy while the suspect canary runs")
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if h, why := m.state(); h || why != canaryFailed {
			t.Fatalf("got %v %q after the canary hung, want %q", h, why, canaryFailed)
		}
		want := []bool{false, true, false}
		if got := changes(); len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
			t.Errorf("got health changes %v, want %v", got, want)
		}
	})
}

// stallsAfterTimeout checks, in a synctest bubble, that m (the 3 s
// timeout of runMonitor) is healthy 1 ms before the timeout from now and
// stalled 1 ms after it.
func stallsAfterTimeout(t *testing.T, m *monitor) {
	t.Helper()
	time.Sleep(2999 * time.Millisecond)
	synctest.Wait()
	if h, _ := m.state(); !h {
		t.Fatal("stalled before the timeout")
	}
	time.Sleep(2 * time.Millisecond)
	synctest.Wait()
	if h, why := m.state(); h || why != engineStalled {
		t.Fatalf("got state %v %q 3s without a token, want %q", h, why, engineStalled)
	}
}

// TestMonitorHeldBackIsNoStall: an engine that holds a token the worker
// has not taken (the worker's writes behind: a junk flood slowing the log)
// is not stalled however long it waits; once the worker takes the token
// the stall clock starts again from then.
func TestMonitorHeldBackIsNoStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, changes, stop := runMonitor(t, &monitorProbe{})
		defer stop()
		m.started()
		m.holdBack(true)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if h, why := m.state(); !h {
			t.Fatalf("%q after 10 s with the engine held back, want healthy", why)
		}
		m.holdBack(false)
		stallsAfterTimeout(t, m)
		if got := changes(); len(got) != 1 || got[0] {
			t.Errorf("health changes %v, want one, to unhealthy", got)
		}
	})
}

func TestMonitorDisabled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &monitorProbe{}
		m := newMonitor(false, time.Second, time.Second, p.probe, func(bool) { t.Error("onChange called") })
		m.started()
		m.Run(context.Background()) // returns at once
		time.Sleep(time.Minute)
		if h, _ := m.state(); !h || p.n() != 0 {
			t.Errorf("disabled monitor: healthy %v, %d canaries", h, p.n())
		}
	})
}

// TestMonitorQueueIsNotAStall (issue 22, failure 3): with an engine that
// keeps a first-token deadline, a request waiting for its first token (in
// the server's queue) is not a stall and runs no canary, however long it
// waits; from its first token on, the progress timeout applies.
func TestMonitorQueueIsNotAStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &monitorProbe{}
		var mu sync.Mutex
		var got []bool
		m := newMonitor(true, 10*time.Second, 3*time.Second, p.probe, func(h bool) { mu.Lock(); got = append(got, h); mu.Unlock() })
		m.queued = true
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); m.Run(ctx) }()
		defer func() { cancel(); <-done }()

		m.started()
		time.Sleep(time.Minute) // queued for a minute: past the timeout and the canary wait
		synctest.Wait()
		if h, why := m.state(); !h || p.n() != 0 {
			t.Fatalf("queued a minute: healthy %v (%s), %d canaries; want healthy, none", h, why, p.n())
		}
		m.firstToken()
		time.Sleep(3*time.Second + time.Millisecond)
		synctest.Wait()
		if h, why := m.state(); h || why != engineStalled {
			t.Fatalf("3s after its first token without another: %v %q, want %q", h, why, engineStalled)
		}
		m.ended(true)
		m.started()
		m.ended(false) // a queued request that leaves without a token
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(got) == 0 || got[0] {
			t.Errorf("health changes %v, want the stall reported", got)
		}
	})
}

// TestMonitorCanaryAfterTheEngineIsBack: a canary that failed while the
// engine watch found the engine down does not keep the worker out once the
// engine answers again: a canary runs at once and decides.
func TestMonitorCanaryAfterTheEngineIsBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &monitorProbe{}
		p.set(errors.New("connection refused"), false)
		m, _, stop := runMonitor(t, p)
		defer stop()
		m.setDown(engineUnreachable, "refused")
		time.Sleep(10 * time.Second) // a canary, failed
		synctest.Wait()
		if p.n() != 1 {
			t.Fatalf("%d canaries, want 1", p.n())
		}
		p.set(nil, false)
		m.setDown("", "")
		synctest.Wait()
		if healthy, why := m.state(); !healthy || p.n() != 2 {
			t.Errorf("health %v %s after %d canaries; want healthy after a canary at once", healthy, why, p.n())
		}
	})
}

// failingEngine fails every generation with err.
type failingEngine struct{ err error }

func (f failingEngine) Generate(context.Context, engine.Request, func(engine.Token) error) (engine.Result, error) {
	return engine.Result{}, f.err
}
func (failingEngine) Stats() engine.Stats { return engine.Stats{} }

// TestCanaryProbeAnswers: a canary answered 429, 503 or 400 passes (the
// server is alive: busy, or refusing the prompt); no answer, a 500 or a
// 401 fails it.
func TestCanaryProbeAnswers(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		pass bool
	}{
		{"429", &engine.UpstreamError{Class: events.FailureUnavailable, Status: 429}, true},
		{"503", &engine.UpstreamError{Class: events.FailureUnavailable, Status: 503}, true},
		{"400 policy", &engine.UpstreamError{Class: events.FailureClient, Status: 400, Code: "content_policy_violation"}, true},
		{"401", &engine.UpstreamError{Class: events.FailureNotReady, Status: 401}, false},
		{"500", &engine.UpstreamError{Status: 500}, false},
		{"refused", &engine.UpstreamError{Message: "connection refused"}, false},
	} {
		err := canaryProbe(failingEngine{tc.err}, "w", func(error) {})(t.Context())
		if (err == nil) != tc.pass {
			t.Errorf("%s: canary %v, want pass %v", tc.name, err, tc.pass)
		}
	}
}
