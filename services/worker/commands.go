package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
)

// A worker never reads a request's log (its NATS user may not: it would
// see every prompt). What it must obey reaches it on its own subject,
// streams.CommandSubject(id): the frontends publish there each cancel, and
// each fence of an attempt the request moved away from, for the attempts
// routed to this worker. What it may have missed (a command published while
// its connection was down) it asks a live frontend about on
// streams.CheckSubject(id), which answers from the log.

// onCommand obeys a command for one of the worker's jobs; commands for
// attempts it does not run are ignored.
func (w *Worker) onCommand(m *nats.Msg) {
	var c streams.Command
	if err := json.Unmarshal(m.Data, &c); err != nil {
		w.log.Warn("malformed command", "err", err)
		return
	}
	key := jobKey{c.RequestID, c.Attempt}
	w.mu.Lock()
	j := w.jobs[key]
	if c.Kind == streams.CommandRouted && (j == nil || j.isForsaken()) {
		w.early.note(key, time.Now()) // its dispatch is still on the way (hold.go)
	}
	w.mu.Unlock()
	if j != nil {
		obey(j, c)
	}
}

// obey applies command c to job j. The first cause of a job's cancellation
// wins, so a command seen twice is obeyed once. A cancel is sent only for
// an attempt the log routes here, so a stop releases a held job first: it
// stores what was made and the end (hold.go).
func obey(j *job, c streams.Command) {
	switch {
	case c.Kind == streams.CommandRouted:
		j.release()
	case c.Kind == streams.CommandCancel && c.Mode == events.CancelKill:
		j.overrule(errCancelKill) // stores nothing more, held or not
	case c.Kind == streams.CommandCancel:
		j.release()
		j.cancel(errCancelStop)
	case c.Kind == streams.CommandFence && c.Hold == "":
		j.overrule(errFenced)
	case c.Kind == streams.CommandFence && j.withdraw(c.Hold):
		j.overrule(errFenced) // no dispatch of the attempt is left whose decision may be stored
	}
}

// checks asks a live frontend about the worker's jobs (streams.Check), on
// the control connection, and obeys what the answers say. It is safe for
// concurrent use.
type checks struct {
	ctl *nats.Conn // the control connection, set by Worker.openControl before anything asks
	id  string     // the worker's
	log *slog.Logger
}

// check asks a live frontend about job j (see streams.Check).
func (cs *checks) check(ctx context.Context, j *job, detach bool) (streams.CheckReply, error) {
	owner, _ := j.owner()
	data, err := json.Marshal(streams.Check{RequestID: j.d.RequestID, Attempt: j.d.Attempt, Owner: owner, Detach: detach})
	if err != nil {
		return streams.CheckReply{}, err
	}
	var r streams.CheckReply
	for {
		m, err := cs.ctl.RequestWithContext(ctx, streams.CheckSubject(cs.id), data)
		if err != nil {
			return streams.CheckReply{}, fmt.Errorf("check %s: %w", j.d.RequestID, err)
		}
		r = streams.CheckReply{}
		if err := json.Unmarshal(m.Data, &r); err != nil {
			return streams.CheckReply{}, fmt.Errorf("check %s: bad reply: %w", j.d.RequestID, err)
		}
		if r.RetryAfterMS <= 0 {
			break
		}
		// Refused unread (this worker's checks are over the frontend's
		// rate): ask again when it says, within ctx.
		t := time.NewTimer(time.Duration(r.RetryAfterMS) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return r, fmt.Errorf("check %s: %s, and %w before the retry", j.d.RequestID, r.Error, ctx.Err())
		case <-t.C:
		}
	}
	if r.Error != "" {
		return r, fmt.Errorf("check %s: %s", j.d.RequestID, r.Error)
	}
	if r.Command != nil {
		obey(j, *r.Command)
	}
	if r.Owner != "" {
		j.setOwner(r.Owner)
	}
	return r, nil
}

// checkOnReconnect asks about every running job each time the control
// connection, which carries the commands, comes back, until ctx is done:
// commands published while it was down never reached it.
func (w *Worker) checkOnReconnect(ctx context.Context) {
	ch := w.ctl.StatusChanged(nats.CONNECTED)
	defer w.ctl.RemoveStatusListener(ch)
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
			cctx, cancel := context.WithTimeout(j.ctx, streams.DefaultTimeout)
			if _, err := w.checks.check(cctx, j, false); err != nil && j.ctx.Err() == nil {
				w.log.Warn("check a job after reconnecting", "request_id", j.d.RequestID, "err", err)
			}
			cancel()
		}
	}
}

// subscribeCommands listens on the worker's command subject, on the control
// connection: a command must not queue behind the worker's token deltas.
func (w *Worker) subscribeCommands() (*nats.Subscription, error) {
	sub, err := w.ctl.Subscribe(streams.CommandSubject(w.cfg.ID), w.onCommand)
	if err != nil {
		return nil, fmt.Errorf("worker: subscribe to commands: %w", err)
	}
	return sub, nil
}

// errNoFrontend means no frontend was there to answer a detach check.
var errNoFrontend = errors.New("worker: no frontend answered")
