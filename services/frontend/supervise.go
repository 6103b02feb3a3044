package frontend

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/migrations"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

// tracked is a request this frontend follows: its follower, shared by every
// client stream of the request here, and, while this frontend owns it, the
// supervisor that dispatches it and decides its migrations.
type tracked struct {
	id         string
	f          *follower
	dispatched chan struct{} // closed once the first dispatch settled (accepted or failed)
	settleOnce sync.Once

	// Guarded by Frontend.mu.
	refs          int       // holders: clients, the supervisor, lookups
	supervising   bool      // a supervisor runs for it here
	clients       int       // client responses being written
	detachedSince time.Time // when the last client left (zero while one is attached)
}

// settle marks the first dispatch settled.
func (t *tracked) settle() { t.settleOnce.Do(func() { close(t.dispatched) }) }

// failure is why an attempt stopped producing, as the supervisor saw it.
type failure struct {
	migrationType string // events.MigrationNewRequest or events.MigrationOngoingRequest
	reason        string
	at            time.Time
	upstream      *events.AttemptFailed // the worker's report of its upstream's failure, if any
}

// supervise drives request t until it ends or ctx is done: dispatch, watch
// the attempt, fence and migrate it when its worker fails. Decisions are
// appended with the expected sequence of the events subject, so two frontends
// never both decide for one request.
func (fe *Frontend) supervise(ctx context.Context, t *tracked) {
	settle := t.settle
	defer settle()

	var model, endpoint string
	var choices int
	t.f.view(func(p *projections.Request) {
		model, endpoint, choices = p.Accepted.Model, p.Accepted.Endpoint, p.Accepted.Choices
	})
	if choices > 1 {
		return // a parent of choices runs nothing itself
	}
	exceeded := false
	var lastFailed string // the worker that just failed: never the continuation's target
	for ctx.Err() == nil {
		var (
			st      projections.Status
			cur     projections.Attempt
			hasCur  bool
			pinned  string
			owner   string
			overMax bool
		)
		t.f.view(func(p *projections.Request) {
			st, pinned, owner = p.Status, p.Accepted.PinnedWorker, p.Owner
			cur, hasCur = p.Current()
			overMax = fe.policy.ExceedsMaxSeqLen(p)
		})
		if overMax && !exceeded {
			exceeded = true
			fe.metrics.maxSeqLenExceeded.WithLabelValues(model).Inc()
		}
		if st.Terminal() || owner != fe.id {
			return // ended, or another frontend took it over
		}
		var fail *failure
		if !hasCur || cur.Closed {
			// Pending: dispatch the next attempt.
			w, err := fe.dispatch(ctx, t, pinned, lastFailed)
			switch {
			case err == nil:
				settle()
				fail = fe.watch(ctx, t, w, &exceeded, model)
			case errors.Is(err, errSuperseded):
				continue
			case errors.As(err, &fail):
				// The dispatch itself failed: a new_request failure.
			default:
				// Nothing produced yet: the client may simply retry (503).
				// Tokens already delivered: the answer is truncated (500).
				status := http.StatusServiceUnavailable
				var produced int
				t.f.view(func(p *projections.Request) { produced = p.Len() })
				if produced > 0 {
					status = http.StatusInternalServerError
				}
				if errors.Is(err, errAllBusy) && produced == 0 && lastFailed == "" {
					// Admitted, but every worker turned busy before the
					// first dispatch (a load report arrived in between):
					// to the client and the metrics this is the same
					// rejection as at admission.
					fe.metrics.rejections.WithLabelValues(model, endpoint).Inc()
					fe.fail(ctx, t, "all_workers_busy", busyMessage, status)
					settle()
					return
				}
				msg := "no worker available for model " + model + ": " + err.Error()
				if lastFailed != "" {
					msg = fmt.Sprintf("worker %s failed and no other worker is available for model %s: %v", lastFailed, model, err)
				}
				fe.fail(ctx, t, "no_worker", msg, status)
				settle()
				return
			}
		} else {
			// Running (e.g. taken over after a restart): watch it.
			w, ok := fe.disc.get(cur.WorkerID)
			if !ok {
				fail = &failure{migrationType: events.MigrationOngoingRequest, reason: "worker_lost", at: time.Now()}
			} else {
				fail = fe.watch(ctx, t, routedWorker{Worker: w, attempt: cur.Attempt}, &exceeded, model)
			}
		}
		if fail == nil {
			continue // ended, or the state moved on: look again
		}
		if u := fail.upstream; u != nil && u.Class == events.FailureClient {
			// The upstream rejected the request itself: the client gets its answer.
			code, status := cmp.Or(u.Code, "upstream_rejected"), cmp.Or(u.Status, http.StatusBadRequest)
			fe.fail(ctx, t, code, u.Message, status)
			settle()
			return
		}
		lastFailed = fe.fence(ctx, t, fail)
		if err := fe.migrate(ctx, t, fail, model); err != nil {
			settle()
			return
		}
	}
}

// errSuperseded means another writer changed the request first; re-read it.
var errSuperseded = errors.New("frontend: request changed concurrently")

func (f *failure) Error() string { return f.migrationType + ": " + f.reason }

// dispatch routes the next attempt and hands it to a worker. Refusals (busy,
// draining, wrong model) move on to another worker without counting as a
// failure; a worker that does not answer is a new_request failure.
func (fe *Frontend) dispatch(ctx context.Context, t *tracked, pinned, avoid string) (routedWorker, error) {
	exclude := map[string]bool{}
	if avoid != "" {
		exclude[avoid] = true
	}
	for {
		var d streams.Dispatch
		var attempt int
		t.f.view(func(p *projections.Request) {
			attempt = len(p.Attempts)
			d = migrations.Continuation(p, attempt, fe.id)
		})
		d.DetachTimeoutMS = fe.cfg.DetachTimeout.Milliseconds()
		w, err := fe.pickWorker(d, pinned, exclude)
		if err != nil {
			return routedWorker{}, err
		}
		routed := events.RequestRouted{RequestID: t.id, Attempt: attempt, WorkerID: w.ID, StartOffset: d.StartOffset}
		if err := fe.decide(ctx, t, events.ID(t.id, "routed", attempt), routed); err != nil {
			return routedWorker{}, err
		}
		d.EventsSeq = t.f.eventsSeq()
		done := fe.router.track(w.ID)
		reply, err := fe.sendDispatch(ctx, w.ID, d)
		if err == nil && reply.Accepted {
			return routedWorker{Worker: w.Worker, attempt: attempt, untrack: done}, nil
		}
		done()
		reason := "dispatch_failed"
		if err == nil {
			reason = "refused_" + reply.Reason
		}
		// Close the attempt that never ran, so its subject stays empty for good.
		fe.appendFence(ctx, t.id, attempt, w.ID, d.StartOffset, reason)
		if err == nil || pinned != "" {
			// Refused: try another worker (not a failure, no inhibition).
			exclude[w.ID] = true
			if pinned != "" {
				return routedWorker{}, fmt.Errorf("pinned worker %s refused: %s", w.ID, reply.Reason)
			}
			continue
		}
		fe.router.inhibit(w.Worker)
		fe.log.Warn("dispatch failed", "request_id", t.id, "worker_id", w.ID, "err", err)
		return routedWorker{}, &failure{migrationType: events.MigrationNewRequest, reason: reason, at: time.Now()}
	}
}

type routedWorker struct {
	projections.Worker
	attempt int
	untrack func()
}

func (fe *Frontend) pickWorker(d streams.Dispatch, pinned string, exclude map[string]bool) (routedWorker, error) {
	model := d.Model
	if pinned != "" {
		w, ok := fe.disc.get(pinned)
		if !ok || !w.Routable() || w.Model != model {
			return routedWorker{}, fmt.Errorf("%w: %s", errNotPinned, pinned)
		}
		return routedWorker{Worker: w}, nil
	}
	var cands []projections.Worker
	fe.disc.read(func(v *projections.Discovery) { cands = v.Routable(model) })
	cands, err := capable(cands, d)
	if err != nil {
		return routedWorker{}, err
	}
	w, err := fe.router.pick(cands, exclude)
	if err != nil {
		return routedWorker{}, err
	}
	return routedWorker{Worker: w}, nil
}

func (fe *Frontend) sendDispatch(ctx context.Context, workerID string, d streams.Dispatch) (streams.DispatchReply, error) {
	data, err := json.Marshal(d)
	if err != nil {
		return streams.DispatchReply{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, fe.cfg.DispatchTimeout)
	defer cancel()
	msg, err := fe.nc.RequestWithContext(ctx, streams.DispatchSubject(workerID), data)
	if err != nil {
		return streams.DispatchReply{}, fmt.Errorf("dispatch %s to %s: %w", d.RequestID, workerID, err)
	}
	var reply streams.DispatchReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return streams.DispatchReply{}, fmt.Errorf("dispatch %s to %s: bad reply: %w", d.RequestID, workerID, err)
	}
	return reply, nil
}

// watch waits while attempt w runs. It returns nil when the request ended or
// its state moved on (look again), or the failure that stopped the attempt:
// its worker left discovery or re-registered, it reported a failure, or it
// produced nothing for the stall timeout.
func (fe *Frontend) watch(ctx context.Context, t *tracked, w routedWorker, exceeded *bool, model string) *failure {
	if w.untrack != nil {
		defer w.untrack()
	}
	stall := time.NewTimer(fe.cfg.StallTimeout)
	defer stall.Stop()
	// The stall clock starts when watching starts: the last accepted token
	// may be older than this attempt (a continuation that has produced
	// nothing yet must get the full stall timeout, not the remainder of the
	// failed attempt's).
	watching := time.Now()
	caughtUp := false // the log was read after the worker left discovery
	for {
		fch, dch := t.f.changed.C(), fe.disc.changed.C()
		var (
			st      projections.Status
			cur     projections.Attempt
			owner   string
			overMax bool
		)
		t.f.view(func(p *projections.Request) {
			st, owner = p.Status, p.Owner
			cur, _ = p.Current()
			overMax = fe.policy.ExceedsMaxSeqLen(p)
		})
		if overMax && !*exceeded {
			*exceeded = true
			fe.metrics.maxSeqLenExceeded.WithLabelValues(model).Inc()
		}
		if st.Terminal() || cur.Attempt != w.attempt || owner != fe.id {
			return nil
		}
		wait := fe.cfg.StallTimeout
		if since := fe.detachedSince(t); !since.IsZero() {
			left := fe.cfg.DetachTimeout - time.Since(since)
			if left <= 0 {
				fe.detach(ctx, t)
				return nil
			}
			wait = min(wait, left)
		}
		if cur.Closed {
			f := &failure{migrationType: events.MigrationOngoingRequest, reason: cur.CloseReason, at: time.Now(), upstream: cur.Failure}
			if u := cur.Failure; u != nil && (u.Class == events.FailureUnavailable || u.Class == events.FailureNotReady) {
				f.migrationType = events.MigrationNewRequest
			}
			return f
		}
		if now, ok := fe.disc.get(w.ID); !ok || now.LeaseID != w.LeaseID {
			if !caughtUp {
				// A worker that leaves in order (a shutdown hand-off, an
				// engine error) closes its attempt in the log before its
				// lease goes, but the two reach this frontend on separate
				// subscriptions: read the log once, so that its reason,
				// not the lease's, is the one recorded.
				caughtUp = true
				fe.catchUp(ctx, t)
				continue
			}
			return &failure{migrationType: events.MigrationOngoingRequest, reason: "worker_lost", at: time.Now()}
		}
		last := t.f.lastProgress()
		if last.Before(watching) {
			last = watching
		}
		idle := time.Since(last)
		if idle >= fe.cfg.StallTimeout {
			return &failure{migrationType: events.MigrationOngoingRequest, reason: "stalled", at: time.Now()}
		}
		stall.Reset(min(wait, fe.cfg.StallTimeout-idle))
		select {
		case <-ctx.Done():
			return nil
		case <-fch:
		case <-dch:
		case <-stall.C:
		}
	}
}

// fence closes the current attempt in the log (unless it already is), waits
// until this frontend has folded the marker, and inhibits the worker. It
// returns the failed worker's id.
func (fe *Frontend) fence(ctx context.Context, t *tracked, fail *failure) string {
	var cur projections.Attempt
	var n int
	t.f.view(func(p *projections.Request) { cur, _ = p.Current(); n = p.Len() })
	if !cur.Closed {
		fe.appendFence(ctx, t.id, cur.Attempt, cur.WorkerID, n, fail.reason)
	}
	if w, ok := fe.disc.get(cur.WorkerID); ok && fail.reason != "shutdown" {
		fe.router.inhibit(w)
	}
	wctx, cancel := context.WithTimeout(ctx, streams.DefaultTimeout)
	defer cancel()
	_ = t.f.waitFor(wctx, func(p *projections.Request) bool {
		c, _ := p.Current()
		return p.Status.Terminal() || c.Attempt != cur.Attempt || c.Closed
	})
	return cur.WorkerID
}

func (fe *Frontend) appendFence(ctx context.Context, id string, attempt int, workerID string, offset int, reason string) {
	ev := events.AttemptFailed{RequestID: id, Attempt: attempt, WorkerID: workerID, Offset: offset, Reason: reason}
	env := fe.events.Envelope(events.ID(id, attempt, "fenced"), id, ev)
	if _, err := fe.events.Append(ctx, streams.RequestTokens(id, attempt), env, -1); err != nil {
		fe.log.Warn("fence attempt", "request_id", id, "attempt", attempt, "err", err)
	}
}

// migrate records the decision to continue a failed request elsewhere, or
// its terminal failure when migration is not allowed. A non-nil error means
// the request ended.
func (fe *Frontend) migrate(ctx context.Context, t *tracked, fail *failure, model string) error {
	var (
		allow    error
		from     projections.Attempt
		cut      int
		terminal bool
	)
	t.f.view(func(p *projections.Request) {
		terminal = p.Status.Terminal()
		from, _ = p.Current()
		cut = p.Len()
		allow = fe.policy.Allow(p)
	})
	if terminal {
		return errors.New("ended")
	}
	if allow != nil {
		fe.metrics.migrationDuration.WithLabelValues(model, fail.migrationType, "failed").Observe(time.Since(fail.at).Seconds())
		msg := fmt.Sprintf("worker %s failed (%s) and the request cannot migrate: %v", from.WorkerID, fail.reason, allow)
		fe.fail(ctx, t, failureCode(allow), msg, http.StatusInternalServerError)
		return allow
	}
	ev := events.RequestMigrated{
		RequestID: t.id, FromAttempt: from.Attempt, FromWorker: from.WorkerID, Cut: cut,
		MigrationType: fail.migrationType, Reason: fail.reason, Frontend: fe.id,
	}
	if err := fe.decide(ctx, t, events.ID(t.id, "migrated", from.Attempt), ev); err != nil {
		return nil // superseded: look again
	}
	fe.metrics.migrations.WithLabelValues(model, fail.migrationType).Inc()
	fe.metrics.migrationDuration.WithLabelValues(model, fail.migrationType, "success").Observe(time.Since(fail.at).Seconds())
	fe.log.Info("migrating request", "request_id", t.id, "from_worker", from.WorkerID, "migration_type", fail.migrationType, "reason", fail.reason, "offset", cut)
	return nil
}

func failureCode(err error) string {
	switch {
	case errors.Is(err, migrations.ErrDisabled):
		return "migration_disabled"
	case errors.Is(err, migrations.ErrLimitExhausted):
		return "migration_exhausted"
	case errors.Is(err, migrations.ErrMaxSeqLenExceeded):
		return "migration_max_seq_len_exceeded"
	case errors.Is(err, migrations.ErrPinned):
		return "pinned_worker_failed"
	}
	return "worker_failed"
}

// decide appends a decision to the request's events subject, expecting the
// last sequence this frontend has seen there, and waits until the follower
// has folded it. errSuperseded means someone else wrote first.
func (fe *Frontend) decide(ctx context.Context, t *tracked, id string, ev events.Event) error {
	expect := int64(t.f.eventsSeq())
	seq, err := fe.events.Append(ctx, streams.RequestEvents(t.id), fe.events.Envelope(id, t.id, ev), expect)
	if errors.Is(err, streams.ErrConflict) {
		fe.catchUp(ctx, t)
		return errSuperseded
	}
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, streams.DefaultTimeout)
	defer cancel()
	if err := t.f.waitFor(wctx, func(p *projections.Request) bool { return p.LastSeq() >= seq }); err != nil {
		fe.catchUp(ctx, t)
	}
	return nil
}

// catchUp reads whatever the follower missed.
func (fe *Frontend) catchUp(ctx context.Context, t *tracked) {
	t.f.mu.Lock()
	_ = t.f.catchUpLocked(ctx)
	t.f.mu.Unlock()
	t.f.changed.Notify()
}

// fail appends the request's terminal failure.
func (fe *Frontend) fail(ctx context.Context, t *tracked, code, msg string, status int) {
	var n int
	t.f.view(func(p *projections.Request) { n = p.Len() })
	ev := events.RequestFailed{RequestID: t.id, Code: code, Message: msg, Status: status, Offset: n}
	for range 3 {
		err := fe.decide(ctx, t, events.ID(t.id, "failed"), ev)
		if err == nil || !errors.Is(err, errSuperseded) {
			if err != nil {
				fe.log.Error("record request failure", "request_id", t.id, "err", err)
			}
			return
		}
	}
}
