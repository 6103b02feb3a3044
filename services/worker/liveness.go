package worker

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/baton-dev/baton/services/engine"
)

// Defaults of the engine watch (Config.LivenessInterval, LivenessTimeout).
// A dead engine is seen within an interval, a hung one within an interval
// and a timeout: 3 s.
const (
	DefaultLivenessInterval = 2 * time.Second
	DefaultLivenessTimeout  = time.Second
)

// errEngineHung stops the generations of an engine the watch found hung, so
// that their frontends move them at once instead of after their stall
// timeout.
var errEngineHung = errors.New("worker: the engine stopped answering")

// engineWatch is the engine watch (run): the liveness of the server behind
// a Pinger engine, asked whether traffic flows or not. Its verdicts go to
// the health monitor, the upstream (probe an engine back again), the
// generations (stopAll, when it hangs) and the lease (readinessChanged).
type engineWatch struct {
	eng              engine.Engine
	interval         time.Duration // Config.LivenessInterval
	timeout          time.Duration // Config.LivenessTimeout
	health           *monitor
	upstream         *upstream
	stopAll          func(cause error) int
	readinessChanged func()
	log              *slog.Logger
}

// run asks a Pinger engine's server whether it is alive every
// Config.LivenessInterval, traffic or not, until ctx is done:
//
//   - an answer (any HTTP status) makes it alive: a worker that was out of
//     routing for the watch is back, and its server is probed again (it may
//     be another server now);
//   - no connection (refused, reset) makes the worker not ready,
//     engine_unreachable: its generations fail by themselves;
//   - no answer within Config.LivenessTimeout makes it not ready,
//     engine_hung, and the generations running on it are stopped and
//     reported failed (engine_hung), so their frontends migrate them now.
//     A request that emitted a token meanwhile proves the engine works (a
//     loaded server may answer its listing late): then nothing changes.
//     Nor does a wait that lasted over twice the timeout: the worker itself
//     was held up (SIGSTOP, no CPU), and the silence says nothing.
func (ew *engineWatch) run(ctx context.Context) {
	p, ok := ew.eng.(engine.Pinger)
	if !ok || ew.interval < 0 {
		return
	}
	t := time.NewTimer(ew.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ew.ping(ctx, p)
		t.Reset(ew.interval)
	}
}

// ping runs one check of the watch and acts on its verdict.
func (ew *engineWatch) ping(ctx context.Context, p engine.Pinger) {
	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, ew.timeout)
	err := p.Ping(pctx)
	cancel()
	if ctx.Err() != nil {
		return // stopping: the outcome means nothing
	}
	reason, why := "", ""
	switch {
	case err == nil:
	case errors.Is(err, engine.ErrNoAnswer) && ew.health.tokenSince(start):
		ew.log.Debug("engine slow to answer its watch, but generating", "err", err)
	case errors.Is(err, engine.ErrNoAnswer) && time.Since(start) > 2*ew.timeout:
		// The worker itself did not run for most of the wait (stopped,
		// starved of CPU): the server's silence says nothing. Ask again.
		ew.log.Debug("engine watch inconclusive: the worker was held up", "waited", time.Since(start))
		return
	case errors.Is(err, engine.ErrNoAnswer):
		reason, why = engineHung, err.Error()
	default:
		reason, why = engineUnreachable, err.Error()
	}
	if !ew.health.setDown(reason, why) {
		if reason == "" && ew.upstream.probeUnanswered() {
			// The probe found no server, the watch finds one: it came back
			// between two watches. Probe it now rather than at the next
			// probe interval.
			ew.log.Info("engine answers again; probing it")
			ew.upstream.recheck()
		}
		return
	}
	switch reason {
	case "":
		ew.log.Info("engine answers again; probing it")
		ew.upstream.recheck()
	case engineHung:
		n := ew.stopAll(errEngineHung)
		ew.log.Warn("engine hung: out of routing, its generations handed back", "timeout", ew.timeout, "in_flight", n, "err", err)
	default:
		ew.log.Warn("engine unreachable: out of routing", "err", err)
	}
	ew.readinessChanged()
}

// stopAll stops every running generation with cause and returns how many.
func (w *Worker) stopAll(cause error) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, j := range w.jobs {
		j.cancel(cause)
	}
	return len(w.jobs)
}
