package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
)

type jobKey struct {
	requestID string
	attempt   int
}

// job is one accepted dispatch.
type job struct {
	d      streams.Dispatch
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu        sync.Mutex
	ownerID   string        // the frontend that owns the request (attached events move it)
	ownerMove chan struct{} // closed and replaced when the owner changes
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
	var d streams.Dispatch
	if err := json.Unmarshal(m.Data, &d); err != nil || !validDispatch(d) {
		w.log.Warn("malformed dispatch", "err", err)
		w.reply(m, d, streams.RefusedBadRequest)
		return
	}
	if d.Model != w.cfg.Model {
		w.reply(m, d, streams.RefusedWrongModel)
		return
	}
	key := jobKey{d.RequestID, d.Attempt}
	w.mu.Lock()
	_, dup := w.jobs[key]
	switch {
	case w.draining:
		w.mu.Unlock()
		w.reply(m, d, streams.RefusedDraining)
		return
	case dup: // a retried dispatch of what already runs: accept it again
		w.mu.Unlock()
		w.reply(m, d, "")
		return
	case w.cfg.MaxConcurrentRequests > 0 && len(w.jobs) >= w.cfg.MaxConcurrentRequests:
		w.mu.Unlock()
		w.reply(m, d, streams.RefusedBusy)
		return
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	j := &job{d: d, ctx: ctx, cancel: cancel, ownerID: d.Frontend, ownerMove: make(chan struct{})}
	w.jobs[key] = j
	w.gens.Add(1)
	w.mu.Unlock()

	w.metrics.inflight.WithLabelValues(w.cfg.Model).Inc()
	w.health.started()
	w.reply(m, d, "")
	go w.generate(j)
	go w.guardDetach(j)
}

func validDispatch(d streams.Dispatch) bool {
	return streams.ValidRequestID(d.RequestID) && d.Attempt >= 0 && d.StartOffset >= 0 &&
		d.MaxTokens >= d.StartOffset && d.PromptTokens >= 0
}

func (w *Worker) reply(m *nats.Msg, d streams.Dispatch, refused string) {
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
	defer func() {
		j.cancel(nil)
		w.mu.Lock()
		delete(w.jobs, jobKey{d.RequestID, d.Attempt})
		w.mu.Unlock()
		w.metrics.inflight.WithLabelValues(w.cfg.Model).Dec()
		w.health.ended()
		w.notifyLoad()
		w.gens.Done()
	}()
	w.notifyLoad()
	sub, err := w.watchCommands(j)
	if sub != nil {
		defer func() { _ = sub.Unsubscribe() }()
	}
	if err != nil {
		log.Warn("watch cancel commands", "err", err)
	}

	out := &deltas{
		log: w.events, subject: streams.RequestTokens(d.RequestID, d.Attempt),
		requestID: d.RequestID, attempt: d.Attempt, start: d.StartOffset,
	}
	req := engine.Request{
		RequestID: d.RequestID, Endpoint: d.Endpoint, Body: d.Body, Prompt: d.Prompt, PromptTokens: d.PromptTokens,
		PromptIDs: d.PromptIDs, Generated: d.Generated, GeneratedIDs: d.GeneratedIDs,
		StartOffset: d.StartOffset, MaxTokens: d.MaxTokens, MaxPromptTokens: d.MaxPromptTokens,
	}
	res, genErr := w.produce(j.ctx, req, out)

	// Appends below outlive the job's context: they record how it ended.
	// settle may retry a failed append through a leader election.
	ctx, cancel := context.WithTimeout(context.Background(), streams.AppendBudget+2*streams.DefaultTimeout)
	defer cancel()
	var final events.Event
	status := statusCompleted
	cause := context.Cause(j.ctx)
	completed := func(reason string) events.Event {
		return events.RequestCompleted{RequestID: d.RequestID, Attempt: d.Attempt, FinishReason: reason,
			PromptTokens: promptTokens(d, res, out), CompletionTokens: out.offset()}
	}
	failed := func(reason string) events.AttemptFailed {
		return events.AttemptFailed{RequestID: d.RequestID, Attempt: d.Attempt, WorkerID: w.cfg.ID,
			Offset: out.offset(), Reason: reason}
	}
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
	case errors.Is(cause, errFenced):
		status = statusHandedOff // the frontend fenced this attempt already
	case errors.Is(cause, errHandOff):
		status, final = statusHandedOff, failed("shutdown")
	case errors.As(genErr, &upstream):
		// The upstream failed: never a reason for this worker to exit.
		f := failed(failureReason(upstream.Class))
		f.Class, f.Status, f.Code, f.Message = upstream.Class, upstream.Status, upstream.Code, upstream.Message
		f.RetryAfterMS = upstream.RetryAfter.Milliseconds()
		status, final = statusFailed, f
		if upstream.Class == events.FailureNotReady {
			w.upstreamNotReady(upstream)
		}
		log.Warn("upstream failed", "class", upstream.Class, "status", upstream.Status, "code", upstream.Code, "err", genErr)
	default:
		f := failed("engine_error")
		f.Message = genErr.Error()
		status, final = statusFailed, f
		if errors.Is(genErr, engine.ErrFatal) {
			defer w.fail(genErr) // after the attempt_failed is stored
		}
		log.Error("generation failed", "err", genErr)
	}

	if err := out.settle(ctx); err != nil {
		log.Error("store token deltas", "err", err)
		status, final = statusFailed, failed("append_failed")
	}
	if final != nil {
		id := events.ID(d.RequestID, d.Attempt, "completed")
		if _, ok := final.(events.AttemptFailed); ok {
			id = events.ID(d.RequestID, d.Attempt, "failed")
		}
		if _, err := w.events.Append(ctx, out.subject, w.events.Envelope(id, d.RequestID, final), -1); err != nil {
			log.Error("store outcome", "event", final.EventType(), "err", err)
			status = statusFailed
		}
	}
	w.metrics.requests.WithLabelValues(w.cfg.Model, status).Inc()
	log.Debug("generation ended", "status", status, "tokens", out.offset())
}

// watchCommands subscribes to the request's republished lifecycle events and
// stops the job on a cancel command or a migration away from its attempt.
//
// A command stored before the subscription was active is not republished to
// it, so once the server has the subscription, the request's events already
// in the log are read and obeyed as well. A command seen both ways is obeyed
// once: the first cause of a job's cancellation wins.
func (w *Worker) watchCommands(j *job) (*nats.Subscription, error) {
	subj := strings.TrimSuffix(streams.RequestLive(j.d.RequestID), ">") + "events"
	sub, err := w.nc.Subscribe(subj, func(m *nats.Msg) {
		if e, err := streams.Decode(m); err == nil {
			obey(j, e.Event)
		}
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(j.ctx, streams.DefaultTimeout)
	defer cancel()
	if err := w.nc.FlushWithContext(ctx); err != nil {
		return sub, fmt.Errorf("flush subscription: %w", err)
	}
	return sub, w.readCommands(ctx, j)
}

// readCommands obeys the commands stored on the job's events subject: those
// stored before its subscription was active, or while the connection was
// down (commands republished then never reached it).
func (w *Worker) readCommands(ctx context.Context, j *job) error {
	if j.d.EventsSeq > 0 && w.requests != nil {
		// The common case costs one direct get: if the routed event of this
		// dispatch is still the last on the events subject, nothing came since.
		if m, err := w.requests.GetLastMsgForSubject(ctx, streams.RequestEvents(j.d.RequestID)); err == nil && m.Sequence == j.d.EventsSeq {
			return nil
		}
	}
	for e, err := range streams.ReadRequestEvents(ctx, w.js, j.d.RequestID, 1) {
		if errors.Is(err, streams.ErrNotFound) {
			break // dispatched without accepted/routed events (tests, tools)
		}
		if err != nil {
			return fmt.Errorf("read commands already stored: %w", err)
		}
		obey(j, e.Event)
	}
	return nil
}

// readCommandsOnReconnect re-reads every running job's commands each time
// the NATS connection comes back, until ctx is done.
func (w *Worker) readCommandsOnReconnect(ctx context.Context) {
	ch := w.nc.StatusChanged(nats.CONNECTED)
	defer w.nc.RemoveStatusListener(ch)
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ch:
			if !ok {
				return
			}
		}
		w.mu.Lock()
		jobs := make([]*job, 0, len(w.jobs))
		for _, j := range w.jobs {
			jobs = append(jobs, j)
		}
		w.mu.Unlock()
		for _, j := range jobs {
			rctx, cancel := context.WithTimeout(j.ctx, streams.DefaultTimeout)
			if err := w.readCommands(rctx, j); err != nil && j.ctx.Err() == nil {
				w.log.Warn("re-read commands after reconnect", "request_id", j.d.RequestID, "err", err)
			}
			cancel()
		}
	}
}

// obey applies a lifecycle event of the job's request to the job.
func obey(j *job, ev events.Event) {
	switch ev := ev.(type) {
	case events.RequestCancelled:
		if ev.Mode == events.CancelKill {
			j.cancel(errCancelKill)
		} else {
			j.cancel(errCancelStop)
		}
	case events.RequestMigrated:
		if ev.FromAttempt == j.d.Attempt {
			j.cancel(errFenced)
		}
	case events.RequestFailed:
		j.cancel(errFenced)
	case events.RequestAttached:
		j.setOwner(ev.Frontend)
	}
}

// produce runs the engine and coalesces its tokens into deltas: a delta is
// flushed at DeltaMaxTokens tokens or DeltaMaxDelay after its first token,
// and at the end, unless a kill cancelled the job: then nothing more is
// appended once the kill is seen.
func (w *Worker) produce(ctx context.Context, req engine.Request, out *deltas) (engine.Result, error) {
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
	flush := func() {
		timer.Stop()
		timerC = nil
		if errors.Is(context.Cause(ctx), errCancelKill) {
			return // a kill aborts at once: what was not sent yet is dropped
		}
		out.flush()
		w.notifyLoad()
	}
	for {
		select {
		case t, ok := <-toks:
			if !ok {
				flush()
				return res, genErr
			}
			w.health.token()
			out.add(t)
			switch n := out.pending(); {
			case n >= w.cfg.DeltaMaxTokens:
				flush()
			case n == 1:
				timer.Reset(w.cfg.DeltaMaxDelay)
				timerC = timer.C
			}
		case <-timerC:
			flush()
		}
	}
}

// deltas is the token output of one attempt: what was produced, and the
// appends that carry it to the log.
type deltas struct {
	log       *streams.Log
	subject   string
	requestID string
	attempt   int
	start     int      // StartOffset of the attempt
	tokens    []string // every token produced, from start
	ids       []int    // their ids, while every one is known
	idsLost   bool
	details   []json.RawMessage // parallel to tokens once any token had details
	promptIDs []int             // the prompt's ids, from the first token
	flushed   int               // tokens already handed to an append
	sent      []sentDelta
	acked     int       // d.sent[:acked] are acknowledged
	retryAt   time.Time // when resend may try again
	backoff   time.Duration
}

type sentDelta struct {
	offset int
	future jetstream.PubAckFuture
	err    error
}

func (d *deltas) add(t engine.Token) {
	if len(d.tokens) == 0 {
		d.promptIDs = t.PromptIDs
	}
	switch {
	case d.idsLost:
	case !t.HasID:
		d.idsLost, d.ids = true, nil
	default:
		d.ids = append(d.ids, t.ID)
	}
	if t.Details != nil && d.details == nil {
		d.details = make([]json.RawMessage, len(d.tokens), cap(d.tokens)+1)
	}
	if d.details != nil {
		d.details = append(d.details, t.Details)
	}
	d.tokens = append(d.tokens, t.Text)
}

// event is the delta of the tokens at indexes [from, to) of the attempt.
func (d *deltas) event(from, to int) events.TokensGenerated {
	ev := events.TokensGenerated{RequestID: d.requestID, Attempt: d.attempt, Offset: d.start + from, Tokens: d.tokens[from:to]}
	if !d.idsLost {
		ev.IDs = d.ids[from:to]
	}
	if d.details != nil && slices.ContainsFunc(d.details[from:to], func(r json.RawMessage) bool { return r != nil }) {
		ev.Details = d.details[from:to]
	}
	if from == 0 && d.start == 0 {
		ev.PromptIDs = d.promptIDs // a continuation's are prompt + generated ids: not the request's
	}
	return ev
}

func (d *deltas) pending() int      { return len(d.tokens) - d.flushed }
func (d *deltas) offset() int       { return d.start + len(d.tokens) }
func (d *deltas) id(off int) string { return events.ID(d.requestID, d.attempt, off) }

// flush appends the pending tokens asynchronously.
func (d *deltas) flush() {
	if d.pending() == 0 {
		return
	}
	d.resend(time.Now())
	off := d.start + d.flushed
	ev := d.event(d.flushed, len(d.tokens))
	f, err := d.log.AppendAsync(d.subject, d.log.Envelope(d.id(off), d.requestID, ev))
	d.sent = append(d.sent, sentDelta{offset: off, future: f, err: err})
	d.flushed = len(d.tokens)
}

// Spacing of resend's tries while appends fail (a leader election, a
// reconnect to another node).
const (
	resendBackoffMin = 100 * time.Millisecond
	resendBackoffMax = time.Second
)

// resend re-appends, asynchronously, the oldest delta whose append failed,
// with every token flushed since its offset, under the same id (a stored
// original deduplicates it; readers skip tokens they already have). Readers
// never accept tokens past a gap, so without it a failed append mid-stream
// (the stream leader died, the connection moved to another node) would hold
// every later token back until settle at the end of the attempt. Tries are
// spaced by a backoff; settle makes the last, synchronous and bounded, one.
func (d *deltas) resend(now time.Time) {
	for d.acked < len(d.sent) {
		s := &d.sent[d.acked]
		if s.err == nil {
			select {
			case <-s.future.Ok():
				d.acked++
				d.backoff = 0
				continue
			case err := <-s.future.Err():
				s.err = err
			default:
				return // still in flight
			}
		}
		if now.Before(d.retryAt) {
			return
		}
		d.backoff = min(max(2*d.backoff, resendBackoffMin), resendBackoffMax)
		d.retryAt = now.Add(d.backoff)
		ev := d.event(s.offset-d.start, d.flushed)
		s.future, s.err = d.log.AppendAsync(d.subject, d.log.Envelope(d.id(s.offset), d.requestID, ev))
		return
	}
}

// settle waits for every append's acknowledgement. A failed one is retried
// once, synchronously, with the same id (so a stored original deduplicates
// it) and every token from its offset to the end, so that the log has a
// contiguous run of tokens even if later deltas were stored before it.
func (d *deltas) settle(ctx context.Context) error {
	for _, s := range d.sent[d.acked:] { // resend consumed the acks before acked
		err := s.err
		if err == nil {
			select {
			case <-s.future.Ok():
			case err = <-s.future.Err():
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		if err == nil {
			continue
		}
		ev := d.event(s.offset-d.start, len(d.tokens))
		if _, rerr := d.log.Append(ctx, d.subject, d.log.Envelope(d.id(s.offset), d.requestID, ev), -1); rerr != nil {
			return fmt.Errorf("tokens at offset %d: %w (first try: %w)", s.offset, rerr, err)
		}
	}
	d.sent, d.acked = nil, 0
	return nil
}

// promptTokens is the prompt's length to report at completion: the engine's
// count when it gave one for the original prompt (its usage on a first
// attempt, the recorded prompt ids on a continuation), else the frontend's.
func promptTokens(d streams.Dispatch, res engine.Result, out *deltas) int {
	switch {
	case d.StartOffset == 0 && res.PromptTokens > 0:
		return res.PromptTokens
	case d.StartOffset == 0 && out.promptIDs != nil:
		return len(out.promptIDs)
	case d.PromptIDs != nil:
		return len(d.PromptIDs)
	}
	return d.PromptTokens
}

// failureReason is AttemptFailed.Reason for an upstream failure of class.
func failureReason(class string) string {
	if class == "" {
		return "engine_error"
	}
	return class
}
