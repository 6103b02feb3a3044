package worker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/baton-dev/baton/services/engine"
)

// pinger is an engine whose server the test kills, hangs or revives.
type pinger struct {
	engine.Engine
	mu    sync.Mutex
	state string // "", "dead" or "hung"
	pings int
}

func (p *pinger) Ping(ctx context.Context) error {
	p.mu.Lock()
	p.pings++
	state := p.state
	p.mu.Unlock()
	switch state {
	case "dead":
		return errors.New("connect: connection refused")
	case "hung":
		<-ctx.Done()
		return engine.ErrNoAnswer
	case "held": // the worker itself did not run for 3 s of the wait
		time.Sleep(3 * time.Second)
		return engine.ErrNoAnswer
	}
	return nil
}

func (p *pinger) set(state string) {
	p.mu.Lock()
	p.state = state
	p.mu.Unlock()
}

// watched is a worker with no lease, just enough to run its engine watch.
func watched(p *pinger) *Worker {
	cfg := Config{}.withDefaults()
	w := &Worker{
		eng: p, cfg: cfg, log: slog.New(slog.DiscardHandler), jobs: map[jobKey]*job{},
		health: newMonitor(false, cfg.CanaryWait, cfg.HealthCheckTimeout, nil, func(bool) {}),
	}
	w.upstream = newUpstream(p, w.log, w.health, cfg.UpstreamProbeInterval)
	w.watch = &engineWatch{eng: p, interval: cfg.LivenessInterval, timeout: cfg.LivenessTimeout, health: w.health,
		upstream: w.upstream, stopAll: w.stopAll, readinessChanged: func() {}, log: w.log}
	return w
}

// startWatch runs w.watch until the test ends.
func startWatch(t *testing.T, w *Worker) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); w.watch.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// addJob gives w a running generation, ended when the test ends; it
// returns the generation's ctx.
func addJob(t *testing.T, w *Worker) context.Context {
	jctx, jcancel := context.WithCancelCause(context.Background())
	t.Cleanup(func() { jcancel(nil) })
	w.jobs[jobKey{"r", 0}] = &job{ctx: jctx, cancel: jcancel}
	return jctx
}

// TestWatchSeesDeadAndHungEngines: with no traffic, a dead engine makes the
// worker not ready within one interval (2 s), a hung one within an interval
// and a timeout (3 s), stopping what runs on it; an answer makes it ready
// again and asks for a probe of the server.
func TestWatchSeesDeadAndHungEngines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &pinger{}
		w := watched(p)
		startWatch(t, w)

		time.Sleep(time.Second) // between two pings
		synctest.Wait()
		p.set("dead")
		died := time.Now()
		waitHealth := func(want string) time.Duration {
			t.Helper()
			for range 100 {
				if _, why := w.health.state(); why == want {
					return 0
				}
				time.Sleep(100 * time.Millisecond)
				synctest.Wait()
			}
			t.Fatalf("engine never %s", want)
			return 0
		}
		waitHealth(engineUnreachable)
		if took := time.Since(died); took > 3*time.Second {
			t.Errorf("dead engine seen after %v, want within 3s", took)
		}
		if healthy, _ := w.health.state(); healthy {
			t.Error("a dead engine leaves the worker healthy")
		}

		p.set("")
		waitHealth(engineOK)
		select {
		case <-w.upstream.rechecks:
		default:
			t.Error("an engine back from the dead was not probed again")
		}

		// A hung engine with a generation running: stopped with errEngineHung.
		jctx, jcancel := context.WithCancelCause(context.Background())
		w.jobs[jobKey{"r", 0}] = &job{ctx: jctx, cancel: jcancel}
		p.set("hung")
		hung := time.Now()
		waitHealth(engineHung)
		if took := time.Since(hung); took > 3*time.Second {
			t.Errorf("hung engine seen after %v, want within 3s", took)
		}
		if !errors.Is(context.Cause(jctx), errEngineHung) {
			t.Errorf("running generation's cause %v, want errEngineHung", context.Cause(jctx))
		}
		p.set("")
		waitHealth(engineOK)
	})
}

// TestWatchTokensProveAHungListingWrong: a server slow to answer its
// listing while its generations emit tokens is loaded, not hung: the worker
// stays ready and nothing is stopped.
func TestWatchTokensProveAHungListingWrong(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &pinger{}
		w := watched(p)
		jctx := addJob(t, w)
		startWatch(t, w)
		tokens := make(chan struct{})
		go func() { // a token every 100 ms
			for {
				select {
				case <-tokens:
					return
				case <-time.After(100 * time.Millisecond):
					w.health.token()
				}
			}
		}()
		p.set("hung")
		time.Sleep(10 * time.Second)
		synctest.Wait()
		close(tokens)
		if healthy, why := w.health.state(); !healthy || jctx.Err() != nil {
			t.Errorf("health %v %s, generation %v; want healthy and running", healthy, why, jctx.Err())
		}
		p.mu.Lock()
		n := p.pings
		p.mu.Unlock()
		if n < 3 || n > 4 {
			t.Errorf("%d pings in 10s, want one every 2s and a timeout of 1s", n)
		}
	})
}

// TestWatchHeldWorkerIsInconclusive: a wait far past the timeout means the
// worker itself was held up (SIGSTOP, no CPU): no verdict, nothing stopped.
func TestWatchHeldWorkerIsInconclusive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &pinger{state: "held"}
		w := watched(p)
		jctx := addJob(t, w)
		startWatch(t, w)
		time.Sleep(12 * time.Second)
		synctest.Wait()
		if healthy, why := w.health.state(); !healthy || jctx.Err() != nil {
			t.Errorf("health %v %s, generation %v; want healthy and running", healthy, why, jctx.Err())
		}
	})
}
