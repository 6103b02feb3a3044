package runner

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/migrations"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/fleet"
	"github.com/baton-dev/baton/streams"
)

// run is the runner of request t: until t ends, another frontend owns it,
// or ctx is done, it observes, asks migrations.Policy.Step what to do, and
// carries that out. Decisions are appended with the expected sequence of the
// events subject, so two frontends never both decide for one request.
func (rn *Runner) run(ctx context.Context, t *Request) {
	defer t.settle()
	defer func() { rn.dispatcher.abandon(t.takeEarly()) }() // if the policy never dispatched
	var (
		mem     migrations.Memory
		tr      = tracking{attempt: -1}
		relayed relay // the command last relayed to the current attempt's worker
	)
	defer tr.end()
	outcome := rn.routedWithAcceptance(ctx, t, &tr)
	for ctx.Err() == nil {
		fch, dch, tch := rn.wakes(t, mem)
		obs := migrations.Observation{DetachedSince: rn.requests.detachedSince(t), Dispatch: outcome, LogFull: rn.room.Full(t.id)}
		lch := rn.room.Changed()
		a, model, endpoint, firstPending := rn.observe(t, mem, obs, &relayed)
		// Whatever closed a batched attempt in what the step saw is
		// copied to the partition before the step stores anything.
		due := rn.batches.consolidate(ctx, t)
		rn.commands.relay(&relayed)
		mem, outcome = a.Next, nil
		if firstPending && mem.Watch.Active {
			// Wake at the attempt's first token: the stall timeout starts
			// there (migrations.Policy's rule for queued engines).
			fch = tch
		}
		if !mem.Watch.Active || mem.Watch.Attempt != tr.attempt {
			tr.end()
		}
		rn.report(model, endpoint, a.Report)
		switch a.Kind {
		case migrations.Stop:
			if !rn.lifecycle.compact(ctx, t) {
				rn.lifecycle.storeEnd(ctx, t) // not the last word of its events subject: eviction finds it there
			}
			return
		case migrations.Wait:
			waitStep(ctx, earliest(a.Until, due), fch, dch, lch)
		case migrations.DispatchNext:
			var done func()
			outcome, done = rn.carryDispatch(ctx, t, a)
			if rn.waitForPlace(ctx, t, outcome, a.Exclude) {
				// Dispatch again, as if the refusals had not been.
				outcome, mem.Exclude = nil, nil
				continue
			}
			if outcome.Result == migrations.DispatchAccepted {
				tr.took(t, outcome, done)
			}
		case migrations.CatchUp:
			if t.f.catchUp(ctx) != nil {
				waitStep(ctx, time.Now().Add(retryCatchUp), nil, nil, nil)
			}
		case migrations.Fence:
			rn.carryFence(ctx, t, a)
		case migrations.Migrate:
			if !rn.carryMigrate(ctx, t, a.Migrated) {
				waitStep(ctx, time.Now().Add(retryAfterError), fch, dch, lch)
			}
		case migrations.Fail:
			if !rn.appendFailure(ctx, t, a.Failed) {
				waitStep(ctx, time.Now().Add(retryAfterError), fch, dch, lch)
			}
		case migrations.Detach:
			rn.carryDetach(ctx, t)
		}
	}
}

// wakes are the channels a Wait of t's runner is woken by: what can change
// the next step. Decisions (fch; not every token: a stall has its own
// timer, unless --migration-max-seq-len makes every token count), tokens
// (tch), and discovery's workers (dch), only its members while an attempt
// runs (not their load reports, which only choosing a worker needs).
func (rn *Runner) wakes(t *Request, mem migrations.Memory) (fch, dch, tch <-chan struct{}) {
	fch, dch, tch = t.f.decided.C(), rn.fleet.WorkersChanged(), t.f.changed.C()
	if rn.cfg.MigrationMaxSeqLen > 0 {
		fch = tch
	}
	if mem.Watch.Active {
		dch = rn.fleet.MembersChanged()
	}
	return fch, dch, tch
}

// tracking is the attempt whose dispatch the router counts as running on
// its worker (-1: none), and what ends that count.
type tracking struct {
	attempt int
	untrack func()
}

// took starts tracking the attempt out reports its worker took; done ends
// the router's count of it. t's first dispatch has settled.
func (tr *tracking) took(t *Request, out *migrations.DispatchOutcome, done func()) {
	tr.attempt, tr.untrack = out.Attempt, done
	if !t.acceptedAt.IsZero() {
		t.noteDispatched(time.Since(t.acceptedAt))
	}
	t.settle()
}

// end ends the router's count of the tracked attempt, if any.
func (tr *tracking) end() {
	if tr.untrack != nil {
		tr.untrack()
	}
	tr.attempt, tr.untrack = -1, nil
}

// routedWithAcceptance carries out t's first dispatch when its routed
// decision was stored in the accepted event (nil otherwise): attempt 0 is
// routed already, so the policy would watch it rather than dispatch, and
// the dispatch's outcome is taken before the first step.
func (rn *Runner) routedWithAcceptance(ctx context.Context, t *Request, tr *tracking) *migrations.DispatchOutcome {
	h := t.takeEarlyRouted()
	if h == nil {
		return nil
	}
	out, done := rn.routeHeld(ctx, t, h)
	if out.Result == migrations.DispatchAccepted {
		tr.took(t, out, done)
	}
	return out
}

// waitForPlace waits, when out found no worker free to take t because every
// one is busy (its load report says so, or its last attempt was refused
// busy: those are in exclude) and t has produced nothing, within
// Config.BusyWait of t's accepted event, until some worker of t's model
// has a free place; it reports whether one came in time (the caller
// dispatches again). Two frontends that admit on one free worker both
// dispatch; the worker takes one and refuses the other busy: that one was
// admitted, and waits here as it would have waited in the queue.
func (rn *Runner) waitForPlace(ctx context.Context, t *Request, out *migrations.DispatchOutcome, exclude []string) bool {
	if rn.cfg.BusyWait <= 0 || out.Result != migrations.DispatchUnroutable {
		return false
	}
	var model string
	var produced int
	busy := out.Busy
	t.f.view(func(p *projections.Request) {
		model, produced = p.Accepted.Model, p.Len()
		busy = busy || refusedBusy(p, exclude)
	})
	if !busy || produced > 0 || model == "" {
		return false
	}
	out.Busy = true // if no place comes: 503 all_workers_busy, as at admission
	if t.busySince.IsZero() {
		t.busySince = time.Now()
	}
	start := t.acceptedAt
	if start.IsZero() { // taken over: from the first time it found the pool busy
		start = t.busySince
	}
	deadline := start.Add(rn.cfg.BusyWait)
	// The refusing worker's report may not show it busy yet: look no
	// sooner than a back-off, which doubles with each refusal, so that a
	// stale view cannot turn into a dispatch (an attempt) a millisecond.
	floor := time.Now().Add(min(busyBackoffMin<<min(t.busyWaits, 6), busyBackoffMax))
	t.busyWaits++
	for ctx.Err() == nil && time.Now().Before(deadline) {
		changed := rn.fleet.WorkersChanged()
		if !time.Now().Before(floor) && rn.fleet.Free(model) {
			rn.log.Info("dispatching again: a worker freed up after the pool was found busy", "request_id", t.id, "model", model)
			return true
		}
		// A load report wakes it; so does a poll, as a request's end
		// reaches the router a little after the worker's report of it.
		next := time.Now().Add(busyPoll)
		if next.Before(floor) {
			next = floor
		}
		if deadline.Before(next) {
			next = deadline
		}
		waitStep(ctx, next, nil, changed, nil)
	}
	return false
}

// refusedBusy reports whether the last attempt of each of workers (at least
// one) was refused busy: the policy tried them all, and all were full.
func refusedBusy(p *projections.Request, workers []string) bool {
	for _, w := range workers {
		last := ""
		for _, a := range p.Attempts {
			if a.WorkerID == w {
				last = a.CloseReason
			}
		}
		if last != "refused_"+streams.RefusedBusy {
			return false
		}
	}
	return len(workers) > 0
}

// How waitForPlace paces itself: a poll without a fleet change, and the
// back-off after a refusal (doubling from min up to max).
const (
	busyPoll       = 5 * time.Millisecond
	busyBackoffMin = 10 * time.Millisecond
	busyBackoffMax = 500 * time.Millisecond
)

// observe reads t's fold under its lock and asks the policy's Step with
// mem and obs (completed from the fold and the fleet view): it returns the
// action, the request's model and endpoint, and whether the running attempt
// has no token yet, and notes in relayed what the current attempt must obey.
func (rn *Runner) observe(t *Request, mem migrations.Memory, obs migrations.Observation, relayed *relay) (a migrations.Action, model, endpoint string, firstPending bool) {
	t.f.read(func(p *projections.Request, progress, unread time.Time) {
		model, endpoint = p.Accepted.Model, p.Accepted.Endpoint
		relayed.note(p)
		obs.LastProgress, obs.Unread = progress, unread
		if cur, ok := p.Current(); ok {
			w, present := rn.fleet.Worker(cur.WorkerID)
			// A quarantined worker's output is not to be waited for.
			present = present && w.State != projections.WorkerQuarantined
			obs.Worker = migrations.WorkerSeen{Present: present, LeaseID: w.LeaseID, FirstTokenTimeout: w.FirstTokenTimeout}
			firstPending = !cur.Closed && p.Len() == cur.StartOffset
		}
		a = rn.policy.Step(migrations.State{Request: p, Memory: mem}, obs, time.Now())
	})
	return a, model, endpoint, firstPending
}

// carryMigrate records migration m of t. It reports false when the log
// refused it (not when another writer came first: the next step looks
// again).
func (rn *Runner) carryMigrate(ctx context.Context, t *Request, m events.RequestMigrated) bool {
	ok, err := rn.decisions.append(ctx, t, events.ID(t.id, "migrated", m.FromAttempt, rn.id), m)
	switch {
	case ok:
		rn.log.Info("migrating request", "request_id", t.id, "from_worker", m.FromWorker,
			"migration_type", m.MigrationType, "reason", m.Reason, "offset", m.Cut)
	case err != nil:
		rn.log.Warn("record migration", "request_id", t.id, "err", err)
		return false
	}
	return true
}

// retryAfterError is how long a runner waits before deciding again when the
// log refused a decision for another reason than a concurrent writer.
const retryAfterError = time.Second

// retryCatchUp is how long a runner waits before reading the log again
// when a catch-up failed.
const retryCatchUp = 250 * time.Millisecond

// earliest is the earlier of two times, the zero time being never.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// waitStep blocks until ctx is done, until (if set), or the request,
// discovery or the log's room changed (a nil channel never does).
func waitStep(ctx context.Context, until time.Time, request, discovery, room <-chan struct{}) {
	var timeout <-chan time.Time
	if !until.IsZero() {
		timer := time.NewTimer(time.Until(until))
		defer timer.Stop()
		timeout = timer.C
	}
	select {
	case <-ctx.Done():
	case <-timeout:
	case <-request:
	case <-discovery:
	case <-room:
	}
}

// report counts what a step reports.
func (rn *Runner) report(model, endpoint string, r migrations.Report) {
	if r.MaxSeqLenExceeded {
		rn.metrics.maxSeqLenExceeded.WithLabelValues(model).Inc()
	}
	if r.Rejected {
		rn.metrics.rejections.WithLabelValues(model, endpoint).Inc()
	}
	if f := r.Migrated; f != nil {
		rn.metrics.migrations.WithLabelValues(model, f.MigrationType).Inc()
		rn.metrics.migrationDuration.WithLabelValues(model, f.MigrationType, "success").Observe(time.Since(f.At).Seconds())
	}
	if f := r.MigrationFailed; f != nil {
		rn.metrics.migrationDuration.WithLabelValues(model, f.MigrationType, "failed").Observe(time.Since(f.At).Seconds())
	}
}

// carryDispatch carries out one DispatchNext: pick a worker, record the routed
// decision, send the command. An attempt that never ran (refused, or not
// answered) is closed at once, so its subject stays empty for good. done
// ends the router's count of the dispatch; the caller owns it if the worker
// accepted.
//
// To a worker that holds an attempt's output until its decision is stored
// (projections.Worker.HoldsUntilRouted) the dispatch goes at once, with the
// append rather than after it (routeHeld); the first dispatch of a request
// accepted here may even have left with the accepted event's append
// (dispatchEarly), and is used if the policy still asks for it.
func (rn *Runner) carryDispatch(ctx context.Context, t *Request, a migrations.Action) (*migrations.DispatchOutcome, func()) {
	d := a.Dispatch
	if h := t.takeEarly(); h != nil {
		if h.d.Attempt == d.Attempt && h.d.StartOffset == d.StartOffset && (a.Pinned == "" || a.Pinned == h.w.ID) && !slices.Contains(a.Exclude, h.w.ID) {
			return rn.routeHeld(ctx, t, h)
		}
		rn.dispatcher.abandon(h)
	}
	w, done, err := rn.fleet.Pick(d, a.Pinned, a.Exclude)
	rn.batches.ask(w, &d)
	if err != nil {
		return &migrations.DispatchOutcome{Result: migrations.DispatchUnroutable, Busy: errors.Is(err, fleet.ErrAllBusy),
			NotCapable: fleet.IsNotCapable(err), Err: err.Error()}, nil
	}
	if w.HoldsUntilRouted {
		return rn.routeHeld(ctx, t, rn.dispatcher.sendHeld(ctx, w, done, d))
	}
	ok, err := rn.decisions.append(ctx, t, routedID(t, d, rn.id), routedOf(t.id, w, d))
	if !ok {
		return rn.notRouted(t, done, err), nil
	}
	reply, err := rn.dispatcher.send(ctx, w.ID, d)
	return rn.dispatched(ctx, t, w, done, d, reply, err)
}

// routedOf is the routed decision of dispatch d of request id to w.
func routedOf(id string, w projections.Worker, d events.Dispatch) events.RequestRouted {
	r := events.RequestRouted{RequestID: id, Attempt: d.Attempt, WorkerID: w.ID, StartOffset: d.StartOffset}
	if d.Output == events.OutputBatched {
		r.Output, r.OutputTo = d.Output, d.Frontend
	}
	return r
}

func routedID(t *Request, d events.Dispatch, frontend string) string {
	return events.ID(t.id, "routed", d.Attempt, frontend)
}

// notRouted is the outcome of a dispatch whose routed decision was not
// stored: err, or another writer came first (a nil err).
func (rn *Runner) notRouted(t *Request, done func(), err error) *migrations.DispatchOutcome {
	done()
	if errors.Is(err, streams.ErrStreamFull) {
		rn.room.Refused(t.id)
	}
	if err != nil {
		return &migrations.DispatchOutcome{Result: migrations.DispatchUnroutable, Err: err.Error()}
	}
	return &migrations.DispatchOutcome{Result: migrations.DispatchSuperseded}
}

// dispatched is the outcome of dispatch d to w, its routed decision stored,
// from the worker's answer.
func (rn *Runner) dispatched(ctx context.Context, t *Request, w projections.Worker, done func(), d events.Dispatch, reply streams.DispatchReply, err error) (*migrations.DispatchOutcome, func()) {
	out := &migrations.DispatchOutcome{Attempt: d.Attempt, WorkerID: w.ID, LeaseID: w.LeaseID}
	if err == nil && reply.Accepted {
		out.Result = migrations.DispatchAccepted
		return out, done
	}
	done()
	reason := migrations.ReasonDispatchFailed
	out.Result = migrations.DispatchNoAnswer
	if err == nil {
		reason, out.Result, out.Reason = "refused_"+reply.Reason, migrations.DispatchRefused, reply.Reason
	} else {
		rn.metrics.dispatchUnanswered.WithLabelValues(w.ID).Inc()
		rn.log.Warn("dispatch failed", "request_id", t.id, "worker_id", w.ID, "err", err)
	}
	rn.batches.fence(ctx, t, events.AttemptFailed{RequestID: t.id, Attempt: d.Attempt, WorkerID: w.ID, Offset: d.StartOffset, Reason: reason})
	waitClosed(ctx, t, d.Attempt)
	return out, nil
}

// routeHeld records the routed decision of h, sent already. As soon as the
// decision is stored the worker is told (streams.CommandRouted); when it is
// not (another writer came first, the log refused it) and the decision the
// log holds does not route the same attempt to the same worker, the worker
// is fenced once it answered (a fence sent earlier could overtake the
// dispatch and find no job to end).
func (rn *Runner) routeHeld(ctx context.Context, t *Request, h *heldDispatch) (*migrations.DispatchOutcome, func()) {
	var seq uint64 // 0 when stored with the acceptance (folded already)
	ok, err := h.stored, error(nil)
	if !ok {
		seq, ok, err = rn.decisions.store(ctx, t, routedID(t, h.d, rn.id), routedOf(t.id, h.w, h.d))
	}
	routedHere := ok || routedTo(t, h.d.Attempt, h.w.ID)
	if routedHere {
		rn.commands.send(h.w.ID, streams.Command{RequestID: t.id, Attempt: h.d.Attempt, Kind: streams.CommandRouted})
	}
	ans := <-h.answer
	if !ok {
		if !routedHere && (ans.err != nil || ans.reply.Accepted) {
			rn.dispatcher.fenceHeld(t.id, h)
		}
		return rn.notRouted(t, h.done, err), nil
	}
	rn.decisions.awaitFolded(ctx, t, seq)
	return rn.dispatched(ctx, t, h.w, h.done, h.d, ans.reply, ans.err)
}

// routedTo reports whether this frontend's fold routes attempt k of t to
// worker.
func routedTo(t *Request, k int, worker string) bool {
	var yes bool
	t.f.view(func(p *projections.Request) {
		yes = k < len(p.Attempts) && p.Attempts[k].WorkerID == worker
	})
	return yes
}

// waitClosed waits until this frontend has folded the closure of attempt k
// (or the request moved past it), for at most streams.DefaultTimeout.
func waitClosed(ctx context.Context, t *Request, k int) {
	wctx, cancel := context.WithTimeout(ctx, streams.DefaultTimeout)
	defer cancel()
	_ = t.f.waitFor(wctx, func(p *projections.Request) bool {
		c, _ := p.Current()
		return p.Status.Terminal() || c.Attempt != k || c.Closed
	})
}

// carryFence carries out a Fence: close the attempt in the log (unless it is
// already), inhibit its worker, and wait until this frontend has folded the
// closure.
func (rn *Runner) carryFence(ctx context.Context, t *Request, a migrations.Action) {
	if a.AppendFence {
		rn.batches.fence(ctx, t, a.Fence)
	}
	if w, ok := rn.fleet.Worker(a.Fence.WorkerID); ok && a.Inhibit && rn.fleet.Inhibit(w, a.InhibitFor) {
		rn.metrics.inhibitions.WithLabelValues(w.ID).Inc()
	}
	waitClosed(ctx, t, a.Fence.Attempt)
}

// appendFailure appends the request's terminal failure, trying again (with the
// expected sequence caught up) when another writer came first. It reports
// false if the log refused it.
func (rn *Runner) appendFailure(ctx context.Context, t *Request, ev events.RequestFailed) bool {
	if ev.Code == migrations.CodeLogUnreadable {
		// Its events subject's sequence is unknown here: the end goes
		// where it needs none.
		rn.commands.fenceCurrent(t)
		rn.lifecycle.endHere(ctx, t, ev, "request log unreadable: request ended")
		return true
	}
	for range 3 {
		ok, err := rn.decisions.append(ctx, t, events.ID(t.id, "failed"), ev)
		if errors.Is(err, streams.ErrStreamFull) {
			// The request ends here even so (failUnstored, which keeps
			// trying to store the failure and relays nothing meanwhile):
			// its worker stops now, rather than store its attempt's end
			// once eviction has made room, perhaps by evicting this
			// request.
			rn.commands.fenceCurrent(t)
			return rn.lifecycle.failUnstored(ctx, t, ev)
		}
		if err != nil {
			rn.log.Error("record request failure", "request_id", t.id, "err", err)
			return false
		}
		if ok {
			return true
		}
	}
	return true // superseded three times: the next step looks again
}
