package worker

import (
	"context"
	"errors"
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

// busy reports whether the worker's server said at its last probe that it
// is busy (events.Load.Busy), and until when it asked to be left alone.
func (w *Worker) busy() (bool, time.Time) {
	w.upstreamMu.Lock()
	defer w.upstreamMu.Unlock()
	return !w.busyUntil.IsZero(), w.busyUntil
}

// probeUnanswered reports whether the last probe failed for want of an
// answer (no connection, no answer in time), not by the server's answer.
func (w *Worker) probeUnanswered() bool {
	w.upstreamMu.Lock()
	defer w.upstreamMu.Unlock()
	return w.unanswered
}

// setBusy records the server's busy answer (nil: not busy) and reports the
// change in the load.
func (w *Worker) setBusy(e *engine.UpstreamError) {
	var until time.Time
	if e != nil {
		d := e.RetryAfter
		if d <= 0 {
			d = DefaultBusyFor
		}
		until = time.Now().Add(min(d, maxBusyFor))
	}
	w.upstreamMu.Lock()
	was := !w.busyUntil.IsZero()
	w.busyUntil = until
	w.upstreamMu.Unlock()
	if was || e != nil {
		w.notifyLoad()
	}
}

// capabilities is what the engine can do, as the last probe found; nil for
// engines that are not Probers (they can do everything).
func (w *Worker) capabilities() *events.Capabilities {
	w.upstreamMu.Lock()
	defer w.upstreamMu.Unlock()
	return w.caps
}

// upstreamReady reports whether the engine may serve a dispatch: its
// server was probed and is not refusing it (an engine that does not probe
// always may).
func (w *Worker) upstreamReady() bool {
	if _, ok := w.eng.(engine.Prober); ok && w.capabilities() == nil {
		return false
	}
	return w.health.upstreamReason() == ""
}

// probeUpstream asks a probing engine what its server can do. A server that
// refuses the engine or cannot be reached leaves the worker not ready, with
// the reason in its lease and /health, until a later probe passes.
func (w *Worker) probeUpstream(ctx context.Context) bool {
	p, ok := w.eng.(engine.Prober)
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
		w.upstreamMu.Lock()
		w.caps = &caps
		w.upstreamMu.Unlock()
		w.setBusy(busy)
		_, until := w.busy()
		w.log.Warn("upstream busy: ready, but taking nothing until it is probed again", "until", until, "chat", caps.Chat, "completions", caps.Completions, "err", err)
		w.health.setUpstream("")
		return true
	}
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("upstream not ready", "err", err)
			w.health.setUpstream(err.Error())
			w.upstreamMu.Lock()
			w.unanswered = !errors.As(err, &busy) || busy.Status == 0
			w.upstreamMu.Unlock()
		}
		return false
	}
	w.upstreamMu.Lock()
	w.caps, w.unanswered = &caps, false
	w.upstreamMu.Unlock()
	w.setBusy(nil)
	if w.health.upstreamReason() != "" {
		w.log.Info("upstream ready again", "capabilities", caps)
	} else {
		w.log.Info("upstream probed", "chat", caps.Chat, "completions", caps.Completions, "token_ids", caps.TokenIDs, "prefill", caps.Prefill)
	}
	if l, ok := w.eng.(interface{ Listing() engine.Listing }); ok {
		if got := l.Listing(); got.Names != nil && got.Match == "" {
			w.log.Warn("the upstream's /v1/models does not list the model, but it answers requests for it", "listed", got.Names)
		}
	}
	w.health.setUpstream("")
	return true
}

// upstreamNotReady takes the worker out of routing after its upstream
// refused it (401, 403, 404) until a probe passes again.
func (w *Worker) upstreamNotReady(e *engine.UpstreamError) {
	w.health.setUpstream(e.Error())
	w.syncReady()
}

// recheckUpstream asks for a probe of the upstream now: its server answers
// again after the engine watch found it down, or it failed a request before
// the first token (an error answer of 500 or more, or no
// answer). Such a failure may be the request's own (Ollama answers 500 to an
// invalid JSON schema), so it does not inhibit the worker; a server that
// also fails the probe takes the worker out of routing until a probe passes.
// Requests coalesce: one probe answers any number of them.
func (w *Worker) recheckUpstream() {
	select {
	case w.recheck <- struct{}{}:
	default:
	}
}

// reprobeUpstream probes the upstream every Config.UpstreamProbeInterval
// while it is not ready, at the end of a busy server's Retry-After, and
// when recheckUpstream asks, until ctx is done.
func (w *Worker) reprobeUpstream(ctx context.Context) {
	if _, ok := w.eng.(engine.Prober); !ok {
		return
	}
	t := time.NewTicker(w.cfg.UpstreamProbeInterval)
	defer t.Stop()
	again := time.NewTimer(time.Hour)
	defer again.Stop()
	for {
		again.Stop()
		if busy, until := w.busy(); busy {
			again.Reset(time.Until(until))
		}
		select {
		case <-ctx.Done():
			return
		case <-again.C:
			w.log.Info("probing a busy upstream again")
			w.probeUpstream(ctx)
			w.syncReady()
			continue
		case <-w.recheck:
			w.log.Info("probing the upstream again")
			w.probeUpstream(ctx)
			w.syncReady() // its capabilities too: it may be another server now
			continue
		case <-t.C:
		}
		if w.health.upstreamReason() == "" {
			continue
		}
		if w.probeUpstream(ctx) {
			w.syncReady()
		}
	}
}
