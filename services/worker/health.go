package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/engine"
)

// Why the engine is not ready, as /health reports it.
const (
	engineOK      = "ok"
	engineStalled = "stalled"       // in-flight requests stopped producing tokens
	canaryFailed  = "canary_failed" // the last canary timed out or failed
	// upstreamNotReady: the server behind the engine refused it (a bad key,
	// an unknown model) or could not be reached at start.
	upstreamNotReady = "upstream_not_ready"
	// engineUnreachable: the engine's server refused or reset the watch's
	// connection (liveness.go): it is dead.
	engineUnreachable = "engine_unreachable"
	// engineHung: the engine's server took the watch's request but did not
	// answer it in time, and no request made progress meanwhile: it is
	// stopped or deadlocked.
	engineHung = "engine_hung"
)

// canaryPrompt is the prompt of a canary request.
const canaryPrompt = "health check"

// monitor decides whether the engine is healthy, from two signals:
//
//   - canaries: after wait without request activity (no request running, none
//     started or ended), probe is called with a deadline of timeout; a
//     failure makes the engine unhealthy until a later canary passes;
//   - progress: while requests run, the engine must emit a token (any
//     request's) at least every timeout; if it does not, it is stalled
//     until a token arrives. Stalled requests that end without a token
//     leave the engine suspect: a canary runs at once and decides.
//     With queued set (an engine that keeps a first-token deadline itself,
//     as the OpenAI engine does), a request counts for progress only from
//     its first token: time in the server's queue is not a stall (the
//     engine fails a request whose first token does not come in time).
//
// It does nothing when disabled. Its methods are safe for concurrent use;
// onChange is called from Run's goroutine only, with the new health, each
// time it changes.
type monitor struct {
	enabled  bool
	wait     time.Duration
	timeout  time.Duration
	probe    func(ctx context.Context) error
	onChange func(healthy bool)
	onCanary func(ok bool, at time.Time) // every canary's outcome; may be nil

	kick chan struct{} // capacity 1: an input changed, coalesced

	// queued: requests count for progress only from their first token.
	queued bool

	mu        sync.Mutex
	waiting   int       // requests without a first token yet (queued mode)
	active    int       // requests running
	idleSince time.Time // last start, end or canary while nothing ran
	progress  time.Time // last token, or when active went from 0 to 1
	// heldBack counts engines holding a token the worker has not taken
	// yet, its own writes behind (a log slow to acknowledge, a NATS
	// server stalling its publishes): they are not stalled.
	heldBack  int
	stalled   bool
	failed    bool   // last canary failed
	suspect   bool   // run a canary now
	reported  bool   // the health last given to onChange (true = healthy)
	upstream  string // why the upstream cannot serve; "" when it can
	down      string // engineUnreachable or engineHung while the watch says so; "" otherwise
	downWhy   string // the watch's error, while down
	lastToken time.Time
}

// setDown records the engine watch's verdict (liveness.go): reason is
// engineUnreachable or engineHung with the error that showed it, or "" when
// the engine answered. It reports whether the verdict changed.
func (m *monitor) setDown(reason, why string) (changed bool) {
	m.mu.Lock()
	changed = m.down != reason
	m.down, m.downWhy = reason, why
	if changed && reason == "" && m.failed {
		m.suspect = true // a canary failed while it was down: run one now
	}
	m.mu.Unlock()
	if changed {
		m.notify()
	}
	return changed
}

// detail is the words behind a not-ready state: the upstream's refusal, or
// the engine watch's error; "" when there are none.
func (m *monitor) detail() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.upstream != "" {
		return m.upstream
	}
	return m.downWhy
}

// tokenSince reports whether some request emitted a token after t.
func (m *monitor) tokenSince(t time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastToken.After(t)
}

// setUpstream records why the upstream cannot serve ("" when it can again).
// It works whether or not health checks are enabled.
func (m *monitor) setUpstream(reason string) {
	m.mu.Lock()
	m.upstream = reason
	m.mu.Unlock()
	m.notify()
}

// upstreamReason is why the upstream cannot serve; "" when it can.
func (m *monitor) upstreamReason() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.upstream
}

func newMonitor(enabled bool, wait, timeout time.Duration, probe func(context.Context) error, onChange func(bool)) *monitor {
	return &monitor{
		enabled: enabled, wait: wait, timeout: timeout, probe: probe, onChange: onChange,
		kick: make(chan struct{}, 1), idleSince: time.Now(), reported: true,
	}
}

// started records a request that began running.
func (m *monitor) started() {
	m.mu.Lock()
	if m.queued {
		m.waiting++
		m.idleSince = time.Now()
	} else {
		m.begin()
	}
	m.mu.Unlock()
	m.notify()
}

// begin counts a request for progress; m.mu is held.
func (m *monitor) begin() {
	m.active++
	if m.active == 1 {
		m.progress = time.Now()
	}
}

// firstToken records a request's first token: in queued mode, from now on
// it counts for progress.
func (m *monitor) firstToken() {
	m.mu.Lock()
	queued := m.queued
	if queued {
		m.waiting--
		m.begin()
	}
	m.mu.Unlock()
	m.token()
	if queued {
		m.notify() // the progress clock starts now
	}
}

// ended records a request that stopped running; hadToken says whether it
// produced one (firstToken was called).
func (m *monitor) ended(hadToken bool) {
	m.mu.Lock()
	if m.queued && !hadToken {
		m.waiting--
		m.idleSince = time.Now()
		m.mu.Unlock()
		m.notify()
		return
	}
	m.active--
	now := time.Now()
	m.idleSince = now
	if m.active == 0 && m.stalled {
		// The stalled requests went away (fenced, cancelled, handed off)
		// without a token: nothing shows the engine works again.
		m.stalled, m.suspect = false, true
	}
	m.mu.Unlock()
	m.notify()
}

// holdBack records that an engine holds a token the worker is not ready
// to take (on), or that the worker took it (off, which is progress): while
// one waits so, the engine is not stalled, whatever the log's pace. A junk
// flood that slows the log for everyone must not take honest workers out
// of routing as stalled.
func (m *monitor) holdBack(on bool) {
	m.mu.Lock()
	if on {
		m.heldBack++
	} else {
		m.heldBack--
		m.progress = time.Now()
	}
	wake := m.stalled
	m.mu.Unlock()
	if wake {
		m.notify()
	}
}

// token records progress: a request emitted a token. It is called on the
// hot path and only wakes Run when the engine was stalled.
func (m *monitor) token() {
	m.mu.Lock()
	m.progress = time.Now()
	m.lastToken = m.progress
	wake := m.stalled
	m.mu.Unlock()
	if wake {
		m.notify()
	}
}

func (m *monitor) notify() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// state reports whether the engine is healthy and, if not, why.
func (m *monitor) state() (healthy bool, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stateLocked()
}

func (m *monitor) stateLocked() (bool, string) {
	switch {
	case m.upstream != "":
		return false, upstreamNotReady
	case m.down != "":
		return false, m.down
	case m.stalled:
		return false, engineStalled
	case m.failed || m.suspect:
		return false, canaryFailed
	}
	return true, engineOK
}

// Run checks the engine until ctx is done.
func (m *monitor) Run(ctx context.Context) {
	if !m.enabled {
		return
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next, canary := m.step()
		if canary {
			m.canary(ctx)
			continue
		}
		timer.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-m.kick:
		case <-timer.C:
		}
	}
}

// step updates the stall state, reports a change of health, and says when to
// look again or whether a canary is due now.
func (m *monitor) step() (next time.Duration, canary bool) {
	m.mu.Lock()
	now := time.Now()
	next = time.Hour
	if m.active > 0 {
		if m.heldBack > 0 {
			m.progress = now // the engine waits for the worker, not the reverse
		}
		left := m.progress.Add(m.timeout).Sub(now)
		m.stalled = left <= 0
		if !m.stalled {
			next = left
		}
	} else if m.waiting == 0 {
		left := m.idleSince.Add(m.wait).Sub(now)
		if m.suspect || left <= 0 {
			canary = true
		} else {
			next = left
		}
	}
	healthy, _ := m.stateLocked()
	changed := healthy != m.reported
	m.reported = healthy
	m.mu.Unlock()
	if changed {
		m.onChange(healthy)
	}
	return next, canary
}

// canary sends the engine one request and records the outcome.
func (m *monitor) canary(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, m.timeout)
	err := m.probe(cctx)
	cancel()
	if ctx.Err() != nil {
		return // stopping: the outcome means nothing
	}
	now := time.Now()
	m.mu.Lock()
	m.failed, m.suspect = err != nil, false
	m.idleSince = now
	m.mu.Unlock()
	if m.onCanary != nil {
		m.onCanary(err == nil, now)
	}
}

// errCanaryEmpty means a canary finished without a token.
var errCanaryEmpty = errors.New("worker: canary produced no token")

// canaryProbe returns a probe that asks eng for one token. A server that
// answers it 429, 503 or 4xx about the request passes: it answered. An error
// wrapping engine.ErrFatal is passed to fatal as well.
func canaryProbe(eng engine.Engine, workerID string, fatal func(error)) func(context.Context) error {
	var n int
	return func(ctx context.Context) error {
		n++
		req := engine.Request{
			RequestID: fmt.Sprintf("canary-%s-%d", workerID, n), Prompt: canaryPrompt,
			PromptTokens: engine.CountTokens(canaryPrompt), MaxTokens: 1,
		}
		tokens := 0
		_, err := eng.Generate(engine.WithCanary(ctx), req, func(engine.Token) error { tokens++; return nil })
		var ue *engine.UpstreamError
		switch {
		case errors.As(err, &ue) && (ue.Class == events.FailureUnavailable || ue.Class == events.FailureClient):
			return nil // the server answered, busy or about the request: it is alive
		case errors.Is(err, engine.ErrFatal):
			fatal(err)
			return err
		case err != nil:
			return fmt.Errorf("worker: canary: %w", err)
		case tokens == 0:
			return errCanaryEmpty
		}
		return nil
	}
}

// healthChanged is the monitor's report of a change of engine health.
func (w *Worker) healthChanged(healthy bool) {
	if healthy {
		w.log.Info("engine healthy again; back in routing")
	} else {
		_, why := w.health.state()
		w.log.Warn("engine not ready; out of routing until a canary passes", "reason", why,
			"timeout", w.cfg.HealthCheckTimeout)
	}
	w.registration.syncReady()
}

// canaryDone records a canary's outcome in the metrics.
func (w *Worker) canaryDone(ok bool, at time.Time) {
	outcome := "success"
	if ok {
		w.metrics.canaryOK.Set(float64(at.UnixNano()) / 1e9)
	} else {
		outcome = "failure"
		w.log.Warn("canary failed")
	}
	w.metrics.canaries.WithLabelValues(w.cfg.Model, outcome).Inc()
}
