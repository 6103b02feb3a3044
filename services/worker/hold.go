package worker

import (
	"context"
	"time"

	"github.com/baton-dev/baton/streams"
)

// A frontend may send a dispatch before the log acknowledged its routed
// decision (events.Dispatch.Hold), so that the engine starts one
// acknowledgement sooner. The attempt's output must not be stored before
// that decision is: a delta of an attempt the log never routed here would
// be junk, and a reader folding in log order would skip it. So the job runs
// the engine at once and holds what it makes (produce appends nothing
// while job.routed is open) until one of:
//   - streams.CommandRouted for the attempt, which the frontend sends as
//     soon as the decision is acknowledged (it may come before the
//     dispatch itself: different subscriptions, see noteEarly);
//   - a cancel for the attempt: a frontend sends one only for an attempt
//     its fold routed here;
//   - a check (guardRouted) whose answer names this worker the attempt's:
//     the notice was lost (a reconnect) or its frontend died after the
//     decision was stored.
//
// A fence that names a held dispatch (its hold) says that dispatch's
// decision was not stored (another writer came first, the log refused it,
// the id was taken): it ends the job with nothing stored, unless the job is
// released already (some decision routes the attempt here) or another
// dispatch of the same attempt reached the worker and is still pending
// (two frontends racing to create one request both dispatch it; the job
// the loser's dispatch started may be the one the winner's relies on). A
// dispatch without a hold joining a job releases it: it is sent only once
// its decision is stored. A job whose decision no check confirms within
// holdLimit ends with nothing stored too.

// Hold timings: the first check after holdCheckAfter (a notice takes well
// under a millisecond), then one every holdCheckEvery, until holdLimit,
// which outlasts a frontend's append with all its retries.
const (
	holdCheckAfter = 500 * time.Millisecond
	holdCheckEvery = time.Second
	holdLimit      = streams.AppendBudget + 2*streams.DefaultTimeout
)

// maxEarly bounds the routed notices kept for dispatches not (yet) seen;
// earlyTTL is how long one is kept.
const (
	maxEarly = 4096
	earlyTTL = 10 * time.Second
)

// release lets job j store its output: its routed decision is stored.
func (j *job) release() {
	j.releaseOnce.Do(func() { close(j.routed) })
}

// join adds another dispatch of j's attempt: held by hold, or (hold empty)
// sent once its decision was stored.
func (j *job) join(hold string) {
	if hold == "" {
		j.release()
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.holds == nil {
		j.holds = map[string]bool{}
	}
	j.holds[hold] = true
}

// withdraw takes the dispatch held by hold out of j, whose decision was
// not stored, and reports whether j is left with nothing to store: not
// released, and no other held dispatch pending.
func (j *job) withdraw(hold string) bool {
	j.mu.Lock()
	delete(j.holds, hold)
	left := len(j.holds)
	j.mu.Unlock()
	return left == 0 && !j.released()
}

// released reports whether j may store its output.
func (j *job) released() bool {
	select {
	case <-j.routed:
		return true
	default:
		return false
	}
}

// noteEarly keeps a routed notice for an attempt the worker runs no job of
// (yet): the notice and the dispatch travel on different subscriptions, so
// the notice can be handled first. Called with w.mu held.
func (w *Worker) noteEarly(k jobKey, now time.Time) {
	if len(w.early) >= maxEarly {
		for key, at := range w.early {
			if now.Sub(at) > earlyTTL || len(w.early) >= maxEarly {
				delete(w.early, key)
			}
		}
	}
	w.early[k] = now
}

// takeEarly reports whether a routed notice for k came before its
// dispatch, and forgets it. Called with w.mu held.
func (w *Worker) takeEarly(k jobKey) bool {
	at, ok := w.early[k]
	if ok {
		delete(w.early, k)
	}
	return ok && time.Since(at) <= earlyTTL
}

// guardRouted asks the frontends about held job j until it is released or
// ends (see above).
func (w *Worker) guardRouted(j *job) {
	start := time.Now()
	timer := time.NewTimer(holdCheckAfter)
	defer timer.Stop()
	for {
		select {
		case <-j.routed:
			return
		case <-j.ctx.Done():
			return
		case <-timer.C:
		}
		ctx, cancel := context.WithTimeout(j.ctx, streams.DefaultTimeout)
		r, err := w.check(ctx, j, false)
		cancel()
		switch {
		case err != nil:
			w.log.Debug("check held attempt", "request_id", j.d.RequestID, "attempt", j.d.Attempt, "err", err)
		case r.Command != nil:
			obey(j, *r.Command)
		case r.Owner != "": // the log routes the attempt here
			j.setOwner(r.Owner)
			j.release()
		}
		if j.released() {
			return
		}
		if time.Since(start) >= holdLimit {
			w.log.Warn("held attempt never routed here: dropped", "request_id", j.d.RequestID, "attempt", j.d.Attempt)
			j.cancel(errNotRouted)
			return
		}
		timer.Reset(holdCheckEvery)
	}
}
