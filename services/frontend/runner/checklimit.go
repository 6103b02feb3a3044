package runner

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
)

// Checks per worker are rate-limited (issue 23): each one costs this
// frontend a read of a request's log, and a worker credential formerly held
// a frontend at 0.62 of a core with 64 concurrent checks, slowing every
// request and timing out honest workers' checks. The cost of a check is the
// length of the request's history (about 100 ms for 2,000 tokens in a race
// build on a busy machine, well under a millisecond for a short one), so
// the limit is on time, not on count: each worker has, per frontend, a
// budget of checkShare seconds of answering per second (a burst of
// checkBurst), charged with each check's duration once it is answered, and
// at most checkInFlight checks in progress. A check beyond either is
// refused at once, before any read, with the time to wait
// (streams.CheckReply.RetryAfterMS), which an honest worker honours. An
// honest worker asks one check at a time (after a reconnect, about each of
// its jobs in turn; a detach check besides), so only a reconnect with many
// long requests is spaced out.
const (
	checkShare    = 0.05                   // seconds of answering per second per worker: 5% of a core
	checkBurst    = 500 * time.Millisecond // answering time at once per worker
	checkInFlight = 2                      // checks per worker being answered at once
	// checkWorkersMax bounds the budgets kept: beyond it they are all
	// forgotten (a shared worker user may name any worker id).
	checkWorkersMax = 4096
)

// checkLimiter is a budget of answering time and an in-progress count per
// worker. It is safe for concurrent use.
type checkLimiter struct {
	mu      sync.Mutex
	share   float64 // seconds of budget per second
	burst   time.Duration
	now     func() time.Time
	budgets map[string]*checkBudget
}

type checkBudget struct {
	left     time.Duration
	at       time.Time
	inFlight int
	// refusals answered in the second that began at second: past
	// checkRefusals a refusal is not even answered (the asker waits for
	// its own timeout), so that a flood that ignores retry_after_ms is
	// throttled by its timeouts rather than by this frontend's replies.
	refusals int
	second   time.Time
}

// checkRefusals is how many refusals a second a worker is answered.
const checkRefusals = 20

func newCheckLimiter(share float64, burst time.Duration, now func() time.Time) *checkLimiter {
	return &checkLimiter{share: share, burst: burst, now: now, budgets: map[string]*checkBudget{}}
}

// refill brings worker's budget up to now; the caller holds l.mu.
func (l *checkLimiter) refill(worker string) *checkBudget {
	now := l.now()
	b, ok := l.budgets[worker]
	if !ok {
		if len(l.budgets) >= checkWorkersMax {
			clear(l.budgets)
		}
		b = &checkBudget{left: l.burst, at: now}
		l.budgets[worker] = b
	}
	b.left = min(l.burst, b.left+time.Duration(float64(now.Sub(b.at))*l.share))
	b.at = now
	return b
}

// allow admits a check of worker (call done with what it cost once it is
// answered), or says how long to wait.
func (l *checkLimiter) allow(worker string) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.refill(worker)
	switch {
	case b.left <= 0:
		return time.Duration(float64(-b.left)/l.share) + time.Millisecond, false
	case b.inFlight >= checkInFlight:
		return 10 * time.Millisecond, false
	}
	b.inFlight++
	return 0, true
}

// answerRefusal reports whether a refusal of worker's check is to be
// answered (at most checkRefusals a second), or dropped.
func (l *checkLimiter) answerRefusal(worker string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.refill(worker)
	if now := l.now(); now.Sub(b.second) >= time.Second {
		b.second, b.refusals = now, 0
	}
	b.refusals++
	return b.refusals <= checkRefusals
}

// done ends a check that allow admitted, charging its cost.
func (l *checkLimiter) done(worker string, cost time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.refill(worker)
	b.left -= cost
	if b.inFlight > 0 {
		b.inFlight--
	}
}

// admitCheck queues check m for the checkers, or refuses it at once, unread:
// when its worker is over its rate or its checks in progress, or when the
// queue is full (the checkers are behind). A queued check is the
// limiter's until done is called for its worker.
func admitCheck(l *checkLimiter, queue chan<- *nats.Msg, m *nats.Msg) {
	worker, err := streams.CheckWorker(m.Subject)
	if err != nil {
		return
	}
	wait, ok := l.allow(worker)
	if ok {
		select {
		case queue <- m:
			return
		default:
			l.done(worker, 0)
			wait = 100 * time.Millisecond
		}
	}
	if !l.answerRefusal(worker) {
		return // a flood that ignores retry_after_ms: let it time out
	}
	data, _ := json.Marshal(streams.CheckReply{Error: "too many checks", RetryAfterMS: max(1, wait.Milliseconds())})
	_ = m.Respond(data)
}
