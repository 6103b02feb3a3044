package worker

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
)

// FinishCancelled is the finish reason of a request stopped by a cancel
// command in "stop" mode.
const FinishCancelled = "cancelled"

// Why a generation was stopped (context causes).
var (
	errHandOff    = errors.New("worker: handed off at shutdown")
	errCancelStop = errors.New("worker: cancelled (stop)")
	errCancelKill = errors.New("worker: cancelled (kill)")
	errFenced     = errors.New("worker: attempt fenced by a migration")
	// errLogFull: the request log refused the attempt's tokens at its
	// limits; the frontend ends the request with log_full.
	errLogFull = errors.New("worker: the request log is full")
	// errNotRouted: a held attempt's routed decision was never stored
	// (hold.go): nothing of it is.
	errNotRouted = errors.New("worker: the attempt was never routed here")
)

type jobKey struct {
	requestID string
	attempt   int
}

// job is one accepted dispatch.
type job struct {
	d      events.Dispatch
	ctx    context.Context
	cancel context.CancelCauseFunc

	// routed is closed once the attempt's routed decision is known to be
	// stored; until then nothing of the attempt is (hold.go). Closed from
	// the start for a dispatch sent after its decision was stored.
	routed      chan struct{}
	releaseOnce sync.Once

	mu        sync.Mutex
	holds     map[string]bool // the held dispatches of the attempt it answers (hold.go); nil: none
	ownerID   string          // the frontend that owns the request, as the last check answered
	ownerMove chan struct{}   // closed and replaced when the owner changes
}

// owner returns the owning frontend and a channel closed when it changes.
func (j *job) owner() (string, <-chan struct{}) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.ownerID, j.ownerMove
}

func (j *job) setOwner(id string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.ownerID != id {
		j.ownerID = id
		close(j.ownerMove)
		j.ownerMove = make(chan struct{})
	}
}

// onDispatch answers a dispatch: refuse it, or accept it and start generating.
// It runs on the subscription's goroutine and never blocks on the network.
func (w *Worker) onDispatch(m *nats.Msg) {
	var d events.Dispatch
	if err := json.Unmarshal(m.Data, &d); err != nil || !validDispatch(d) {
		w.log.Warn("malformed dispatch", "err", err)
		w.reply(m, d, streams.RefusedBadRequest)
		return
	}
	if d.Model != w.cfg.Model {
		w.reply(m, d, streams.RefusedWrongModel)
		return
	}
	if !w.upstreamReady() {
		w.reply(m, d, streams.RefusedNotReady)
		return
	}
	key := jobKey{d.RequestID, d.Attempt}
	w.mu.Lock()
	running, dup := w.jobs[key]
	switch {
	case w.draining:
		w.mu.Unlock()
		w.reply(m, d, streams.RefusedDraining)
		return
	case dup && running.ctx.Err() != nil: // ending: another worker takes it
		w.mu.Unlock()
		w.reply(m, d, streams.RefusedBusy)
		return
	case dup: // another dispatch of what already runs: accept it too
		w.mu.Unlock()
		running.join(d.Hold)
		w.reply(m, d, "")
		return
	case w.cfg.MaxConcurrentRequests > 0 && len(w.jobs) >= w.cfg.MaxConcurrentRequests:
		w.mu.Unlock()
		w.reply(m, d, streams.RefusedBusy)
		return
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	j := &job{d: d, ctx: ctx, cancel: cancel, ownerID: d.Frontend, ownerMove: make(chan struct{}), routed: make(chan struct{})}
	if d.Hold != "" {
		j.holds = map[string]bool{d.Hold: true}
	}
	w.jobs[key] = j
	w.gens.Add(1)
	early := w.takeEarly(key)
	w.mu.Unlock()
	if d.Hold == "" || early {
		j.release()
	}

	w.metrics.inflight.WithLabelValues(w.cfg.Model).Inc()
	w.health.started()
	go w.generate(j) // before the answer: the engine's time to first token starts now
	w.reply(m, d, "")
	go w.guardDetach(j)
	if d.Hold != "" && !early {
		go w.guardRouted(j)
	}
}

func validDispatch(d events.Dispatch) bool {
	return streams.ValidRequestID(d.RequestID) && d.Attempt >= 0 && d.StartOffset >= 0 &&
		d.MaxTokens >= d.StartOffset && d.PromptTokens >= 0
}

func (w *Worker) reply(m *nats.Msg, d events.Dispatch, refused string) {
	r := streams.DispatchReply{Accepted: refused == "", Reason: refused}
	if refused != "" {
		w.metrics.refused.WithLabelValues(w.cfg.Model, refused).Inc()
		w.log.Debug("refused dispatch", "request_id", d.RequestID, "attempt", d.Attempt, "reason", refused)
	}
	data, _ := json.Marshal(r)
	if err := m.Respond(data); err != nil {
		w.log.Debug("reply to dispatch", "request_id", d.RequestID, "err", err)
	}
}

// generate runs one accepted dispatch to its end and records the outcome on
// the attempt's tokens subject.
func (w *Worker) generate(j *job) {
	d := j.d
	log := w.log.With("request_id", d.RequestID, "attempt", d.Attempt)
	var out *deltas
	defer func() {
		j.cancel(nil)
		w.mu.Lock()
		delete(w.jobs, jobKey{d.RequestID, d.Attempt})
		w.mu.Unlock()
		w.metrics.inflight.WithLabelValues(w.cfg.Model).Dec()
		w.health.ended(out.sawToken)
		w.notifyLoad()
		w.gens.Done()
	}()
	w.notifyLoad()

	out = newDeltas(w.logOff.sink(w.events), w.events.Source(), streams.RequestTokens(d.RequestID, d.Attempt, w.cfg.ID), d.RequestID, d.Attempt, d.StartOffset)
	mode := continuation(w.eng, d)
	out.exact = exactAtStart(mode)
	res, genErr := w.produce(j.ctx, j.cancel, d, j.routed, out)
	if errors.Is(context.Cause(j.ctx), errLogFull) {
		// Nothing more of this attempt can be stored, its end included:
		// say so once, and leave the request's end to its frontend.
		log.Warn("request log full: stopped generating", "tokens", out.offset())
		w.metrics.requests.WithLabelValues(w.cfg.Model, statusFailed).Inc()
		return
	}

	// Appends below outlive the job's context: they record how it ended.
	// settle may retry a failed append through a leader election.
	ctx, cancel := context.WithTimeout(context.Background(), streams.AppendBudget+2*streams.DefaultTimeout)
	defer cancel()
	status, final, fatal := w.outcome(j, res, genErr, out, log)
	if c, ok := final.(events.RequestCompleted); ok {
		c.Exact = exactAtEnd(mode, d, res)
		final = c
	}
	if !j.released() {
		final = nil // held to its end: nothing of it is stored (hold.go)
	}
	if fatal {
		defer w.fail(genErr) // after the attempt_failed is stored
	}

	if err := out.settle(ctx); err != nil {
		log.Error("store token deltas", "err", err)
		status, final = statusFailed, w.attemptFailed(j, out, "append_failed")
	}
	if final != nil {
		id := events.ID(d.RequestID, d.Attempt, "completed")
		if _, ok := final.(events.AttemptFailed); ok {
			id = events.ID(d.RequestID, d.Attempt, "failed")
		}
		if _, err := out.log.Append(ctx, out.subject, out.log.Envelope(id, d.RequestID, final), -1); err != nil {
			log.Error("store outcome", "event", final.EventType(), "err", err)
			status = statusFailed
		}
	}
	w.metrics.requests.WithLabelValues(w.cfg.Model, status).Inc()
	log.Debug("generation ended", "status", status, "tokens", out.offset())
}

// outcome says how job j ended, from what the engine returned and why its
// context ended: the status for the metrics, the event that records the end
// (nil when another event already did: a kill, a fence), and whether the
// engine failed fatally (the worker shuts down once the event is stored).
func (w *Worker) outcome(j *job, res engine.Result, genErr error, out *deltas, log *slog.Logger) (status string, final events.Event, fatal bool) {
	d := j.d
	status = statusCompleted
	cause := context.Cause(j.ctx)
	completed := func(reason string) events.Event {
		return events.RequestCompleted{RequestID: d.RequestID, Attempt: d.Attempt, FinishReason: reason,
			PromptTokens: promptTokens(d, res, out), CompletionTokens: completionTokens(d, res, out)}
	}
	failed := func(reason string) events.AttemptFailed { return w.attemptFailed(j, out, reason) }
	var upstream *engine.UpstreamError
	switch {
	case genErr == nil:
		final = completed(res.FinishReason)
	case errors.Is(cause, errCancelStop):
		w.metrics.cancellation.WithLabelValues(w.cfg.Model, events.CancelStop).Inc()
		final = completed(FinishCancelled)
	case errors.Is(cause, errCancelKill):
		w.metrics.cancellation.WithLabelValues(w.cfg.Model, events.CancelKill).Inc()
		status = statusCancelled // the cancelled event already ended the request
	case errors.Is(cause, errFenced), errors.Is(cause, errNotRouted):
		status = statusHandedOff // the frontend fenced this attempt already, or never routed it here
	case errors.Is(cause, errHandOff):
		status, final = statusHandedOff, failed("shutdown")
	case errors.Is(cause, errNoFrontend):
		status, final = statusCancelled, failed("detached")
	case errors.Is(cause, errEngineHung):
		f := failed(engineHung)
		f.Message = "the engine's server stopped answering"
		status, final = statusFailed, f
	case errors.As(genErr, &upstream):
		// The upstream failed: never a reason for this worker to exit.
		f := failed(failureReason(upstream.Class))
		f.Class, f.Status, f.Code, f.Message = upstream.Class, upstream.Status, upstream.Code, upstream.Message
		f.RetryAfterMS = upstream.RetryAfter.Milliseconds()
		status, final = statusFailed, f
		switch {
		case upstream.Class == events.FailureNotReady:
			w.upstreamNotReady(upstream)
		case upstream.Class == "" && out.offset() == d.StartOffset:
			w.recheckUpstream()
		}
		log.Warn("upstream failed", "class", upstream.Class, "status", upstream.Status, "code", upstream.Code, "err", genErr)
	default:
		f := failed("engine_error")
		f.Message = genErr.Error()
		status, final = statusFailed, f
		fatal = errors.Is(genErr, engine.ErrFatal)
		log.Error("generation failed", "err", genErr)
	}
	return status, final, fatal
}

// attemptFailed is the event that reports job j's attempt failed for reason
// after the tokens out has stored.
func (w *Worker) attemptFailed(j *job, out *deltas, reason string) events.AttemptFailed {
	return events.AttemptFailed{RequestID: j.d.RequestID, Attempt: j.d.Attempt, WorkerID: w.cfg.ID,
		Offset: out.offset(), Reason: reason}
}

// produce runs the engine and coalesces its tokens into deltas, as Nagle's
// algorithm does: a token is sent at once when none of the attempt's appends
// is in flight; otherwise tokens wait, and a delta is flushed at
// DeltaMaxTokens tokens or DeltaMaxDelay after its first token. So an idle
// log costs no latency, and a busy one gets fewer, fuller deltas. The rest
// is flushed at the end, unless a kill cancelled the job: then nothing more
// is appended once the kill is seen.
//
// Nothing is appended before routed is closed (a held dispatch, hold.go):
// tokens wait for it, and if the job ends first, they are dropped.
//
// When the log refuses the attempt's tokens at its limits, produce stops
// the engine (stop with errLogFull) and drops what is not stored.
//
// The engine hands its tokens over through a channel of DeltaMaxTokens:
// while a flush waits for room in the append window (a saturated log), the
// engine goes on and its tokens go out together. Flushing from the engine's
// goroutine instead saves a wake-up per token but blocks the engine at
// every one, so nothing coalesces under load: at 1,000 streams × 50
// tokens/s it cost NATS 1.5x the CPU per token (BENCHMARKS.md).
func (w *Worker) produce(ctx context.Context, stop context.CancelCauseFunc, req engine.Request, routed <-chan struct{}, out *deltas) (engine.Result, error) {
	toks := make(chan engine.Token, w.cfg.DeltaMaxTokens)
	var res engine.Result
	var genErr error
	go func() {
		defer close(toks)
		res, genErr = w.eng.Generate(ctx, req, func(t engine.Token) error {
			select {
			case toks <- t:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var timerC <-chan time.Time
	held := routed
	select {
	case <-held:
		held = nil
	default:
	}
	flush := func() {
		if held != nil {
			return // nothing is stored before the routed decision
		}
		timer.Stop()
		timerC = nil
		if c := context.Cause(ctx); errors.Is(c, errCancelKill) || errors.Is(c, errLogFull) {
			out.drop() // a kill aborts at once: what was not sent yet is dropped
			return
		}
		out.flush()
		if out.logFull() {
			stop(errLogFull)
			out.drop()
			return
		}
		w.notifyLoad()
		if out.pending() > 0 { // held back by a repair: look again soon
			timer.Reset(w.cfg.DeltaMaxDelay)
			timerC = timer.C
		}
	}
	for {
		select {
		case t, ok := <-toks:
			if !ok {
				if held != nil {
					// Ended while held: what it made is stored once the
					// decision is, and never if the job ends first.
					select {
					case <-held:
					case <-ctx.Done():
					}
					select {
					case <-held: // a cancel releases before it cancels
						held = nil
					default:
						out.drop()
						return res, genErr
					}
				}
				flush()
				return res, genErr
			}
			if out.sawToken {
				w.health.token()
			} else {
				out.sawToken = true
				w.health.firstToken()
			}
			out.add(t)
			switch n := out.pending(); {
			case n >= w.cfg.DeltaMaxTokens, n == 1 && out.idle():
				flush()
			case n == 1:
				timer.Reset(w.cfg.DeltaMaxDelay)
				timerC = timer.C
			}
		case <-timerC:
			flush()
		case <-held:
			held = nil
			flush()
		}
	}
}

// promptTokens is the prompt's length to report at completion: the engine's
// count when it gave one for the original prompt (its usage on a first
// attempt, the recorded prompt ids or an earlier engine's count on a
// continuation); on a prefill continuation with neither, its server's
// count of the prompt and the text so far less the tokens so far (the
// prompt in the server's tokens: exact when the continuation was, off by
// the re-tokenization when not, and closer than a word count either way);
// else the frontend's.
func promptTokens(d events.Dispatch, res engine.Result, out *deltas) int {
	switch {
	case d.StartOffset == 0 && res.PromptTokens > 0:
		return res.PromptTokens
	case d.StartOffset == 0 && out.promptIDs != nil:
		return len(out.promptIDs)
	case d.PromptIDs != nil:
		return len(d.PromptIDs)
	case d.EnginePromptTokens > 0:
		return d.EnginePromptTokens
	case d.StartOffset > 0 && res.PromptTokens > d.StartOffset:
		return res.PromptTokens - d.StartOffset
	}
	return d.PromptTokens
}

// completionTokens is the answer's length to report at completion: the
// tokens of the earlier attempts (the continuation's start offset: the
// server's ids where it gave them, else its streamed events) plus this
// attempt's as its server counted them (its usage), else as streamed. A
// server may merge tokens into one streamed event or hide a matched stop
// sequence, so its count is the truth where it gave one.
func completionTokens(d events.Dispatch, res engine.Result, out *deltas) int {
	if res.CompletionTokens > 0 {
		return d.StartOffset + res.CompletionTokens
	}
	return out.offset()
}

// failureReason is AttemptFailed.Reason for an upstream failure of class.
func failureReason(class string) string {
	if class == "" {
		return "engine_error"
	}
	return class
}
