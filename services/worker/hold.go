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
//     dispatch itself: different subscriptions, see earlyNotices);
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
// the loser's dispatch started may be the one the winner's relies on).
// The winner's dispatch may also come after the loser's fence, which then
// ended the job: a job so forsaken stores nothing, and the winner's
// dispatch starts a job of its own instead of finding one that ends. A
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
// released, and no other held dispatch pending. Such a job is forsaken: a
// dispatch of the same attempt that comes after it (the racing winner's,
// which may travel behind the loser's fence) starts a job of its own
// rather than being refused by one that ends.
func (j *job) withdraw(hold string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.holds, hold)
	if len(j.holds) == 0 && !j.released() {
		j.forsaken = true
	}
	return j.forsaken
}

// isForsaken reports whether every held dispatch of j was withdrawn before
// it was released: it stores nothing, and nobody waits for it.
func (j *job) isForsaken() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.forsaken
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

// earlyNotices are the routed notices that came before their dispatch,
// when each came. The Worker's mu guards them.
type earlyNotices map[jobKey]time.Time

// note keeps a routed notice for an attempt the worker runs no job of
// (yet): the notice and the dispatch travel on different subscriptions, so
// the notice can be handled first.
func (e earlyNotices) note(k jobKey, now time.Time) {
	if len(e) >= maxEarly {
		for key, at := range e {
			if now.Sub(at) > earlyTTL || len(e) >= maxEarly {
				delete(e, key)
			}
		}
	}
	e[k] = now
}

// take reports whether a routed notice for k came before its dispatch, and
// forgets it.
func (e earlyNotices) take(k jobKey) bool {
	at, ok := e[k]
	if ok {
		delete(e, k)
	}
	return ok && time.Since(at) <= earlyTTL
}

// guardRouted asks the frontends about held job j until it is released or
// ends (see above).
func (cs *checks) guardRouted(j *job) {
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
		r, err := cs.check(ctx, j, false)
		cancel()
		switch {
		case err != nil:
			cs.log.Debug("check held attempt", "request_id", j.d.RequestID, "attempt", j.d.Attempt, "err", err)
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
			cs.log.Warn("held attempt never routed here: dropped", "request_id", j.d.RequestID, "attempt", j.d.Attempt)
			j.cancel(errNotRouted)
			return
		}
		timer.Reset(holdCheckEvery)
	}
}
