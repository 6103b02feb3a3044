package worker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/engine"
)

// DefaultUpstreamProbeInterval is how often a worker whose upstream is not
// ready probes it again.
const DefaultUpstreamProbeInterval = 5 * time.Second

// upstreamProbeTimeout bounds one probe of the upstream.
const upstreamProbeTimeout = 30 * time.Second

// DefaultBusyFor is how long a worker whose server answered its probe 429 or
// 503 without a Retry-After reports itself busy before it probes again: the
// frontends' default inhibition window. maxBusyFor bounds a server's
// Retry-After: the probe runs again at least that often.
const (
	DefaultBusyFor = 5 * time.Second
	maxBusyFor     = time.Minute
)

// upstream is what the worker knows of the server behind its engine, when
// the engine is a Prober: what it can do, whether it is busy and until
// when, whether its last probe went unanswered; and the probes that learn
// it. Its methods are safe for concurrent use. What it learns goes to the
// health monitor (a refusal), the load reporter (busy: loadChanged) and the
// lease (capabilities, readiness: readinessChanged).
type upstream struct {
	eng              engine.Engine
	log              *slog.Logger
	health           *monitor
	interval         time.Duration // Config.UpstreamProbeInterval
	loadChanged      func()
	readinessChanged func()
	rechecks         chan struct{} // capacity 1: probe the upstream now, coalesced

	mu         sync.Mutex
	caps       *events.Capabilities // the engine's, when it is a Prober and a probe passed
	unanswered bool                 // the last probe failed for want of an answer
	busyUntil  time.Time            // the server answered its probe 429/503: busy until then and its next probe; zero: not busy
}

func newUpstream(eng engine.Engine, log *slog.Logger, health *monitor, interval time.Duration) *upstream {
	return &upstream{eng: eng, log: log, health: health, interval: interval, rechecks: make(chan struct{}, 1),
		loadChanged: func() {}, readinessChanged: func() {}}
}

// busy reports whether the worker's server said at its last probe that it
// is busy (events.Load.Busy), and until when it asked to be left alone.
func (u *upstream) busy() (bool, time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return !u.busyUntil.IsZero(), u.busyUntil
}

// probeUnanswered reports whether the last probe failed for want of an
// answer (no connection, no answer in time), not by the server's answer.
func (u *upstream) probeUnanswered() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.unanswered
}

// setBusy records the server's busy answer (nil: not busy) and reports the
// change in the load.
func (u *upstream) setBusy(e *engine.UpstreamError) {
	var until time.Time
	if e != nil {
		d := e.RetryAfter
		if d <= 0 {
			d = DefaultBusyFor
		}
		until = time.Now().Add(min(d, maxBusyFor))
	}
	u.mu.Lock()
	was := !u.busyUntil.IsZero()
	u.busyUntil = until
	u.mu.Unlock()
	if was || e != nil {
		u.loadChanged()
	}
}

// capabilities is what the engine can do, as the last probe found; nil for
// engines that are not Probers (they can do everything).
func (u *upstream) capabilities() *events.Capabilities {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.caps
}

// ready reports whether the engine may serve a dispatch: its
// server was probed and is not refusing it (an engine that does not probe
// always may).
func (u *upstream) ready() bool {
	if _, ok := u.eng.(engine.Prober); ok && u.capabilities() == nil {
		return false
	}
	return u.health.upstreamReason() == ""
}

// probe asks a probing engine what its server can do. A server that
// refuses the engine or cannot be reached leaves the worker not ready, with
// the reason in its lease and /health, until a later probe passes.
func (u *upstream) probe(ctx context.Context) bool {
	p, ok := u.eng.(engine.Prober)
	if !ok {
		return true
	}
	pctx, cancel := context.WithTimeout(ctx, upstreamProbeTimeout)
	defer cancel()
	caps, err := p.Probe(pctx)
	var busy *engine.UpstreamError
	if errors.As(err, &busy) && busy.Class == events.FailureUnavailable {
		// Up, but busy: ready for the routes it showed, out of every
		// router until it is asked again at its Retry-After.
		u.mu.Lock()
		u.caps = &caps
		u.mu.Unlock()
		u.setBusy(busy)
		_, until := u.busy()
		u.log.Warn("upstream busy: ready, but taking nothing until it is probed again", "until", until, "chat", caps.Chat, "completions", caps.Completions, "err", err)
		u.health.setUpstream("")
		return true
	}
	if err != nil {
		if ctx.Err() == nil {
			u.log.Warn("upstream not ready", "err", err)
			u.health.setUpstream(err.Error())
			u.mu.Lock()
			u.unanswered = !errors.As(err, &busy) || busy.Status == 0
			u.mu.Unlock()
		}
		return false
	}
	u.mu.Lock()
	u.caps, u.unanswered = &caps, false
	u.mu.Unlock()
	u.setBusy(nil)
	if u.health.upstreamReason() != "" {
		u.log.Info("upstream ready again", "capabilities", caps)
	} else {
		u.log.Info("upstream probed", "chat", caps.Chat, "completions", caps.Completions, "token_ids", caps.TokenIDs, "prefill", caps.Prefill)
	}
	if l, ok := u.eng.(interface{ Listing() engine.Listing }); ok {
		if got := l.Listing(); got.Names != nil && got.Match == "" {
			u.log.Warn("the upstream's /v1/models does not list the model, but it answers requests for it", "listed", got.Names)
		}
	}
	u.health.setUpstream("")
	return true
}

// notReady takes the worker out of routing after its upstream
// refused it (401, 403, 404) until a probe passes again.
func (u *upstream) notReady(e *engine.UpstreamError) {
	u.health.setUpstream(e.Error())
	u.readinessChanged()
}

// recheck asks for a probe of the upstream now: its server answers
// again after the engine watch found it down, or it failed a request before
// the first token (an error answer of 500 or more, or no
// answer). Such a failure may be the request's own (Ollama answers 500 to an
// invalid JSON schema), so it does not inhibit the worker; a server that
// also fails the probe takes the worker out of routing until a probe passes.
// Requests coalesce: one probe answers any number of them.
func (u *upstream) recheck() {
	select {
	case u.rechecks <- struct{}{}:
	default:
	}
}

// reprobe probes the upstream every Config.UpstreamProbeInterval
// while it is not ready, at the end of a busy server's Retry-After, and
// when recheck asks, until ctx is done.
func (u *upstream) reprobe(ctx context.Context) {
	if _, ok := u.eng.(engine.Prober); !ok {
		return
	}
	t := time.NewTicker(u.interval)
	defer t.Stop()
	again := time.NewTimer(time.Hour)
	defer again.Stop()
	for {
		again.Stop()
		if busy, until := u.busy(); busy {
			again.Reset(time.Until(until))
		}
		select {
		case <-ctx.Done():
			return
		case <-again.C:
			u.log.Info("probing a busy upstream again")
			u.probe(ctx)
			u.readinessChanged()
			continue
		case <-u.rechecks:
			u.log.Info("probing the upstream again")
			u.probe(ctx)
			u.readinessChanged() // its capabilities too: it may be another server now
			continue
		case <-t.C:
		}
		if u.health.upstreamReason() == "" {
			continue
		}
		if u.probe(ctx) {
			u.readinessChanged()
		}
	}
}
