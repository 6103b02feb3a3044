package worker

import (
	"context"
	"encoding/json"
	"errors"
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

	// overruled is closed once a command or the shutdown took the attempt
	// from the worker (a fence, a kill, a hand-off), whatever ended the
	// job before: nothing more of it is to be stored (reportLogFull).
	overruled    chan struct{}
	overruleOnce sync.Once

	mu        sync.Mutex
	holds     map[string]bool // the held dispatches of the attempt it answers (hold.go); nil: none
	forsaken  bool            // every held dispatch was withdrawn before a release (job.withdraw)
	ownerID   string          // the frontend that owns the request, as the last check answered
	ownerMove chan struct{}   // closed and replaced when the owner changes
}

// owner returns the owning frontend and a channel closed when it changes.
func (j *job) owner() (string, <-chan struct{}) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.ownerID, j.ownerMove
}

// overrule ends j with cause, if nothing ended it before, and closes
// overruled either way.
func (j *job) overrule(cause error) {
	j.cancel(cause)
	j.overruleOnce.Do(func() { close(j.overruled) })
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
	if !w.upstream.ready() {
		w.reply(m, d, streams.RefusedNotReady)
		return
	}
	if d.Output == events.OutputBatched && w.batched.isFull() {
		w.reply(m, d, streams.RefusedOutputFull)
		return
	}
	key := jobKey{d.RequestID, d.Attempt}
	w.mu.Lock()
	running, dup := w.jobs[key]
	if dup && running.isForsaken() { // it stores nothing: this dispatch starts anew (hold.go)
		dup = false
	}
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
	j := &job{d: d, ctx: ctx, cancel: cancel, ownerID: d.Frontend, ownerMove: make(chan struct{}), routed: make(chan struct{}),
		overruled: make(chan struct{})}
	if d.Hold != "" {
		j.holds = map[string]bool{d.Hold: true}
	}
	w.jobs[key] = j
	w.gens.Add(1)
	early := w.early.take(key)
	w.mu.Unlock()
	if d.Hold == "" || early {
		j.release()
	}

	w.metrics.inflight.WithLabelValues(w.cfg.Model).Inc()
	w.health.started()
	go w.generate(j) // before the answer: the engine's time to first token starts now
	w.reply(m, d, "")
	go w.detacher.guard(j)
	if d.Hold != "" && !early {
		go w.checks.guardRouted(j)
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
		if key := (jobKey{d.RequestID, d.Attempt}); w.jobs[key] == j { // not a job that replaced a forsaken j
			delete(w.jobs, key)
		}
		w.mu.Unlock()
		w.metrics.inflight.WithLabelValues(w.cfg.Model).Dec()
		w.load.notify()
		w.gens.Done()
	}()
	w.load.notify()

	out = newDeltas(w.sink(d), w.events.Source(), streams.RequestTokens(d.RequestID, d.Attempt, w.cfg.ID), d.RequestID, d.Attempt, d.StartOffset)
	mode := continuation(w.eng, d)
	out.exact = exactAtStart(mode)
	res, genErr := w.produce(j.ctx, j.cancel, d, j.routed, out)
	if errors.Is(context.Cause(j.ctx), errLogFull) {
		// Nothing more of this attempt's tokens can be stored: say so
		// once, and tell the frontend why the attempt stopped.
		log.Warn("request log full: stopped generating", "tokens", out.offset())
		w.metrics.requests.WithLabelValues(w.cfg.Model, statusFailed).Inc()
		if j.released() { // held to its end: nothing of it is stored (hold.go)
			w.reportLogFull(j, out, log)
		}
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
//
// The health monitor counts the job as running until the engine returns,
// not until its output is stored.
func (w *Worker) produce(ctx context.Context, stop context.CancelCauseFunc, req engine.Request, routed <-chan struct{}, out *deltas) (engine.Result, error) {
	toks, result := w.startGenerate(ctx, req)
	b := w.newBatcher(ctx, stop, routed, out)
	defer b.timer.Stop()
	for {
		select {
		case t, ok := <-toks:
			if !ok {
				// The engine is done. What the job still waits for (its
				// routed decision, the log's acknowledgements, the
				// end's append) is not the engine's progress: a slow log
				// must not take the worker out of routing as stalled.
				w.health.ended(out.sawToken)
				b.finish()
				return result()
			}
			b.add(t)
		case <-b.timerC:
			b.flush()
		case <-b.held:
			b.held = nil
			b.flush()
		}
	}
}

// startGenerate runs the engine in a goroutine of its own. Its tokens come
// through toks, which is closed when Generate returns; result is what it
// returned, to be read only after that.
func (w *Worker) startGenerate(ctx context.Context, req engine.Request) (toks <-chan engine.Token, result func() (engine.Result, error)) {
	ch := make(chan engine.Token, w.cfg.DeltaMaxTokens)
	var res engine.Result
	var genErr error
	go func() {
		defer close(ch)
		res, genErr = w.eng.Generate(ctx, req, func(t engine.Token) error {
			select {
			case ch <- t:
				return nil
			default:
			}
			// The worker is behind (its writes to the log are): the
			// engine waits for it, which is no stall of the engine's.
			w.health.holdBack(true)
			defer w.health.holdBack(false)
			select {
			case ch <- t:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	return ch, func() (engine.Result, error) { return res, genErr }
}

// batcher is what produce keeps between tokens: the delta's timer and the
// routed decision it may still be held on.
type batcher struct {
	w      *Worker
	ctx    context.Context
	stop   context.CancelCauseFunc
	out    *deltas
	held   <-chan struct{} // routed until it is seen closed, then nil
	timer  *time.Timer
	timerC <-chan time.Time // timer.C while the timer runs, else nil
}

func (w *Worker) newBatcher(ctx context.Context, stop context.CancelCauseFunc, routed <-chan struct{}, out *deltas) *batcher {
	b := &batcher{w: w, ctx: ctx, stop: stop, out: out, held: routed, timer: time.NewTimer(time.Hour)}
	b.timer.Stop()
	select {
	case <-routed:
		b.held = nil
	default:
	}
	return b
}

// add takes one token into the pending delta, and flushes it when it is
// full, or at once when it is the first one into an idle log.
func (b *batcher) add(t engine.Token) {
	if b.out.sawToken {
		b.w.health.token()
	} else {
		b.out.sawToken = true
		b.w.health.firstToken()
	}
	b.out.add(t)
	switch n := b.out.pending(); {
	case n >= b.w.cfg.DeltaMaxTokens, n == 1 && b.out.idle():
		b.flush()
	case n == 1:
		b.arm()
	}
}

// arm starts the delay after which the pending delta goes out anyway.
func (b *batcher) arm() {
	b.timer.Reset(b.w.cfg.DeltaMaxDelay)
	b.timerC = b.timer.C
}

// flush appends the pending delta, unless the routed decision is still held
// or a kill or a full log ended the job.
func (b *batcher) flush() {
	if b.held != nil {
		return // nothing is stored before the routed decision
	}
	b.timer.Stop()
	b.timerC = nil
	if c := context.Cause(b.ctx); errors.Is(c, errCancelKill) || errors.Is(c, errLogFull) {
		b.out.drop() // a kill aborts at once: what was not sent yet is dropped
		return
	}
	b.out.flush()
	if b.out.logFull() {
		b.stop(errLogFull)
		b.out.drop()
		return
	}
	b.w.load.notify()
	if b.out.pending() > 0 { // held back by a repair: look again soon
		b.arm()
	}
}

// finish stores what is left once the engine returned. Ended while held,
// what it made is stored once the decision is, and never if the job ends
// first.
func (b *batcher) finish() {
	if b.held != nil {
		select {
		case <-b.held:
		case <-b.ctx.Done():
		}
		select {
		case <-b.held: // a cancel releases before it cancels
			b.held = nil
		default:
			b.out.drop()
			return
		}
	}
	b.flush()
}

// sink is where attempt d's output goes: batches on the worker's own output
// stream when d asks for them and the worker has that stream (batched.go),
// else messages of their own on the attempt's tokens subject.
func (w *Worker) sink(d events.Dispatch) appender {
	if d.Output == events.OutputBatched && w.batched != nil && w.output.batched() && streams.ValidID(d.Frontend) {
		return &batchedSink{out: w.batched, log: w.events, dest: d.Frontend}
	}
	return w.logOff.sink(w.events)
}
