package migrations

import (
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

// BusyMessage is the message of a request refused because every worker is
// busy, as Dynamo words it.
const BusyMessage = "Service temporarily unavailable: All workers are busy, please retry later"

// Reasons a runner records when it closes an attempt itself.
const (
	ReasonDispatchFailed = "dispatch_failed" // the worker did not answer the dispatch
	ReasonWorkerLost     = "worker_lost"     // its lease went or was replaced
	ReasonStalled        = "stalled"         // nothing produced for the stall timeout
	ReasonShutdown       = "shutdown"        // the worker handed it off while draining
)

// detachRetry is how long a runner waits for a detach cancel to take effect
// before it sends it again.
const detachRetry = time.Second

// State is what Step decides from: the request's projection, which Step only
// reads, and what the runner remembers.
type State struct {
	Request *projections.Request
	Memory
}

// Memory is what the runner of one request keeps between steps. Step
// returns the next Memory in every Action; the zero Memory starts a runner.
type Memory struct {
	Watch Watch
	// Failure is a failure detected and fenced, awaiting the decision.
	Failure *Failure
	// Migration is a migration decided and recorded, counted once a worker
	// accepts the continuation.
	Migration *Failure
	// LastFailed is the worker that failed last: never the continuation's target.
	LastFailed string
	// Exclude lists the workers that refused the dispatch being routed.
	Exclude []string
	// Exceeded is set once the request was counted past max-seq-len.
	Exceeded bool
	// DetachSent is when the detach cancel was last sent.
	DetachSent time.Time
}

// Watch is the attempt a runner watches.
type Watch struct {
	Active   bool
	Attempt  int
	WorkerID string
	LeaseID  string    // the lease the worker held when watching started
	Since    time.Time // the stall clock starts here, not at an earlier attempt's last token
	CaughtUp bool      // the log was re-read after the worker left discovery
}

// Failure is why an attempt stopped producing, as the runner saw it.
type Failure struct {
	Attempt       int
	WorkerID      string
	MigrationType string // events.MigrationNewRequest or events.MigrationOngoingRequest
	Reason        string
	At            time.Time
}

// Observation is what the runner saw outside the log just before a step.
type Observation struct {
	// Worker is the watched (or current) attempt's worker in discovery.
	Worker WorkerSeen
	// LastProgress is when the last token was accepted.
	LastProgress time.Time
	// DetachedSince is when the last client left; zero while one is attached.
	DetachedSince time.Time
	// Dispatch is the outcome of the Dispatch action just carried out; nil
	// after any other action.
	Dispatch *DispatchOutcome
	// LogFull: the request's partition of the log cannot store more (at
	// its limit, or it refused an append lately).
	LogFull bool
	// Unread is since when this frontend has failed to read the request's
	// log (its last catch-up failed); zero while it reads it.
	Unread time.Time
}

// LogFullGrace is how long a request makes no progress while the log is
// full before it fails with CodeLogFull: long enough for eviction to make
// room, short enough that no client hangs.
const LogFullGrace = time.Second

// CodeLogFull is the RequestFailed code of a request the log had no room
// for; its clients get 503 (non-streaming) or an error event.
const CodeLogFull = "log_full"

// CodeLogUnreadable is the RequestFailed code of a request whose log its
// owner could not read for the stall timeout; its clients get 503
// (non-streaming) or an error event.
const CodeLogUnreadable = "log_unreadable"

// WorkerSeen is a worker as discovery shows it.
type WorkerSeen struct {
	Present bool
	LeaseID string
	// FirstTokenTimeout is the first-token deadline the worker keeps
	// itself (its lease's); 0: none.
	FirstTokenTimeout time.Duration
}

// DispatchResult is how one dispatch try ended.
type DispatchResult int

// Dispatch results.
const (
	// DispatchAccepted: the worker accepted the attempt.
	DispatchAccepted DispatchResult = iota
	// DispatchRefused: the worker declined (busy, draining, wrong model); not a failure.
	DispatchRefused
	// DispatchNoAnswer: the worker did not answer; a new_request failure.
	DispatchNoAnswer
	// DispatchUnroutable: no worker could be picked, or the log refused the routed decision.
	DispatchUnroutable
	// DispatchSuperseded: another writer changed the request first; look again.
	DispatchSuperseded
)

// DispatchOutcome is the result of a Dispatch action.
type DispatchOutcome struct {
	Result   DispatchResult
	Attempt  int
	WorkerID string
	LeaseID  string // Accepted: the lease the worker held
	Reason   string // Refused: the worker's reason
	Busy     bool   // Unroutable: every candidate worker is busy
	// NotCapable (Unroutable): workers are routable, but none of them can
	// run this dispatch (continue it, or continue it exactly).
	NotCapable bool
	Err        string // Unroutable: why no worker could take it
}

// ActionKind is what the runner must do next.
type ActionKind int

// Actions.
const (
	// Stop: nothing is left for this runner: the request ended, another
	// frontend owns it, or it is a parent of choices.
	Stop ActionKind = iota
	// Wait for a change of the request or of discovery, or until Until (if set).
	Wait
	// DispatchNext routes Dispatch to a worker (Pinned, else any routable
	// worker not in Exclude), records the routed decision, sends it, and
	// reports the outcome in the next Observation.
	DispatchNext
	// CatchUp re-reads the request's log, then steps again (after a short
	// pause when the read failed).
	CatchUp
	// Fence closes attempt Fence.Attempt (appending Fence when AppendFence),
	// inhibits its worker when Inhibit (for InhibitFor, or the configured
	// window when zero), and waits until the closure is folded.
	Fence
	// Migrate appends Migrated as a decision (expected sequence).
	Migrate
	// Fail appends Failed as a decision (expected sequence).
	Fail
	// Detach cancels the request and its children: no client came back.
	Detach
)

// Action is the result of a step: what to do and what to remember.
type Action struct {
	Kind ActionKind
	Next Memory

	Until time.Time // Wait

	Dispatch events.Dispatch // DispatchNext
	Pinned   string
	Exclude  []string

	Fence       events.AttemptFailed // Fence
	AppendFence bool
	Inhibit     bool
	InhibitFor  time.Duration

	Migrated events.RequestMigrated // Migrate
	Failed   events.RequestFailed   // Fail

	Report Report
}

// Report lists what a step counts, for the runner's metrics.
type Report struct {
	// MaxSeqLenExceeded: the request went past max-seq-len (once per runner).
	MaxSeqLenExceeded bool
	// Rejected: every worker turned busy before the first dispatch.
	Rejected bool
	// Migrated: a worker accepted a migrated request's continuation: one
	// re-dispatch happened.
	Migrated *Failure
	// MigrationFailed: a migration ended without a re-dispatch.
	MigrationFailed *Failure
}

// Step decides the next action for the request in s, given what the runner
// observed at now. It is pure: it reads s.Request and returns a new Memory
// in the action, sharing nothing the caller may change.
func (p Policy) Step(s State, o Observation, now time.Time) Action {
	r, m := s.Request, s.Memory
	var done *Failure
	if d := o.Dispatch; d != nil && d.Result == DispatchAccepted {
		// A worker accepted the continuation: the re-dispatch happened,
		// even if the request has ended by now (a short answer).
		done, m.Migration = m.Migration, nil
	}
	if !r.Known() || r.Accepted.Choices > 1 || r.Status.Terminal() || r.Owner != p.Frontend {
		return Action{Kind: Stop, Next: m, Report: Report{Migrated: done}}
	}
	if o.LogFull && o.Dispatch == nil && !o.LastProgress.IsZero() && now.Sub(o.LastProgress) >= LogFullGrace {
		return p.failLogFull(r, m, Report{Migrated: done})
	}
	a := p.step(r, m, o, now)
	if o.LogFull && a.Kind == Wait && !o.LastProgress.IsZero() {
		// Look again when the grace ends, not at the stall timeout.
		if end := o.LastProgress.Add(LogFullGrace); a.Until.IsZero() || end.Before(a.Until) {
			a.Until = end
		}
	}
	a.Report.Migrated = done
	if p.ExceedsMaxSeqLen(r) && !a.Next.Exceeded {
		a.Next.Exceeded = true
		a.Report.MaxSeqLenExceeded = true
	}
	return a
}

func (p Policy) step(r *projections.Request, m Memory, o Observation, now time.Time) Action {
	if o.Dispatch != nil {
		return p.afterDispatch(r, m, o, now)
	}
	if !o.Unread.IsZero() {
		return p.unread(r, m, o, now)
	}
	cur, running := r.Current()
	if f := m.Failure; f != nil {
		if !migratedFrom(r, f.Attempt) {
			return p.decide(r, m, *f)
		}
		m.Migration, m.Failure = f, nil // recorded (by us, or by a racing writer)
	}
	if running && (!cur.Closed || (m.Watch.Active && m.Watch.Attempt == cur.Attempt)) {
		return p.watch(r, m, o, now, cur)
	}
	return p.dispatch(r, m)
}

// dispatch routes the next attempt.
func (p Policy) dispatch(r *projections.Request, m Memory) Action {
	m.Watch = Watch{}
	d := Continuation(r, len(r.Attempts), p.Frontend)
	if !r.Accepted.Background { // a background request runs with no client
		d.DetachTimeoutMS = p.DetachTimeout.Milliseconds()
	}
	d.ExactOnly = p.ExactOnly && d.StartOffset > 0
	exclude := slices.Clone(m.Exclude)
	if m.LastFailed != "" && !slices.Contains(exclude, m.LastFailed) {
		exclude = append(exclude, m.LastFailed)
	}
	return Action{Kind: DispatchNext, Next: m, Dispatch: d, Pinned: r.Accepted.PinnedWorker, Exclude: exclude}
}

func (p Policy) afterDispatch(r *projections.Request, m Memory, o Observation, now time.Time) Action {
	out := *o.Dispatch
	o.Dispatch = nil
	switch out.Result {
	case DispatchAccepted:
		m.Exclude = nil
		m.Watch = Watch{Active: true, Attempt: out.Attempt, WorkerID: out.WorkerID, LeaseID: out.LeaseID, Since: now}
		return p.step(r, m, o, now)
	case DispatchRefused:
		if pinned := r.Accepted.PinnedWorker; pinned != "" {
			return p.unroutable(r, m, DispatchOutcome{Err: fmt.Sprintf("pinned worker %s refused: %s", out.WorkerID, out.Reason)})
		}
		// The refused attempt never ran: route the next one, whether or
		// not its closure has been folded yet.
		m.Exclude = append(slices.Clone(m.Exclude), out.WorkerID)
		return p.dispatch(r, m)
	case DispatchNoAnswer:
		m.Exclude = nil
		f := Failure{Attempt: out.Attempt, WorkerID: out.WorkerID, MigrationType: events.MigrationNewRequest, Reason: ReasonDispatchFailed, At: now}
		a := p.fence(r, m, f, true, 0)
		a.Report.MigrationFailed = m.Migration
		a.Next.Migration = nil
		return a
	case DispatchUnroutable:
		return p.unroutable(r, m, out)
	}
	return p.step(r, m, o, now) // superseded: look again
}

// watch checks the running attempt cur: the client gone for the detach
// timeout, the worker's report, its lease, the stall clock.
func (p Policy) watch(r *projections.Request, m Memory, o Observation, now time.Time, cur projections.Attempt) Action {
	if !m.Watch.Active || m.Watch.Attempt != cur.Attempt {
		m.Watch = Watch{Active: true, Attempt: cur.Attempt, WorkerID: cur.WorkerID, LeaseID: o.Worker.LeaseID, Since: now}
		if !o.Worker.Present {
			m.Watch.LeaseID = ""
		}
	}
	limit := p.stallLimit(r, cur, o.Worker)
	wait := limit
	if since := o.DetachedSince; !since.IsZero() && !r.Accepted.Background {
		left := p.DetachTimeout - now.Sub(since)
		if left <= 0 {
			// No client came back: cancel, and again after detachRetry if
			// the cancel has not ended the request by then.
			if next := m.DetachSent.Add(detachRetry); m.DetachSent.IsZero() || !now.Before(next) {
				m.DetachSent = now
				return Action{Kind: Detach, Next: m}
			}
			left = m.DetachSent.Add(detachRetry).Sub(now)
		}
		wait = min(wait, left)
	} else {
		m.DetachSent = time.Time{}
	}
	if cur.Closed {
		return p.closed(r, m, cur, now)
	}
	if !o.Worker.Present || o.Worker.LeaseID != m.Watch.LeaseID {
		if !m.Watch.CaughtUp {
			// A worker that leaves in order (a shutdown hand-off, an engine
			// error) closes its attempt in the log before its lease goes, but
			// the two reach the runner separately: read the log once, so that
			// its reason, not the lease's, is the one recorded.
			m.Watch.CaughtUp = true
			return Action{Kind: CatchUp, Next: m}
		}
		f := Failure{Attempt: cur.Attempt, WorkerID: cur.WorkerID, MigrationType: events.MigrationOngoingRequest, Reason: ReasonWorkerLost, At: now}
		return p.fence(r, m, f, true, 0)
	}
	last := o.LastProgress
	if last.Before(m.Watch.Since) {
		last = m.Watch.Since
	}
	idle := now.Sub(last)
	if idle >= limit {
		f := Failure{Attempt: cur.Attempt, WorkerID: cur.WorkerID, MigrationType: events.MigrationOngoingRequest, Reason: ReasonStalled, At: now}
		return p.fence(r, m, f, true, 0)
	}
	return Action{Kind: Wait, Next: m, Until: now.Add(min(wait, limit-idle))}
}

// stallLimit is how long attempt cur may produce nothing before it is
// fenced as stalled. After its first token: the stall timeout, between
// tokens. Before it, time in an engine's queue is not a stall: when the
// worker keeps a first-token deadline itself (its engine fails an attempt
// without a first token by then, as the OpenAI engine's
// --first-token-timeout does), that deadline applies, and the stall timeout
// only after it, as a backstop for a worker that does not keep its word.
// A worker without one (the mock) gets the stall timeout from the start.
func (p Policy) stallLimit(r *projections.Request, cur projections.Attempt, w WorkerSeen) time.Duration {
	if r.Len() == cur.StartOffset && w.FirstTokenTimeout > 0 {
		return w.FirstTokenTimeout + p.StallTimeout
	}
	return p.StallTimeout
}

// closed handles an attempt its worker closed, by the failure's class.
func (p Policy) closed(r *projections.Request, m Memory, cur projections.Attempt, now time.Time) Action {
	f := Failure{Attempt: cur.Attempt, WorkerID: cur.WorkerID, MigrationType: events.MigrationOngoingRequest, Reason: cur.CloseReason, At: now}
	switch cur.CloseClass {
	case events.FailureClient:
		// The upstream rejected the request itself: the same request fails
		// the same way anywhere. No migration, no inhibition. The watch is
		// kept, so that if the failure cannot be recorded the next step
		// records it again instead of dispatching.
		status := cur.CloseStatus
		if status < 400 || status > 499 {
			status = http.StatusBadRequest
		}
		code, msg := cur.CloseCode, cur.CloseMessage
		if code == "" {
			code = "upstream_rejected"
		}
		if msg == "" {
			msg = fmt.Sprintf("the model server rejected the request (%s)", cur.CloseReason)
		}
		return p.fail(r, m, code, msg, status, Report{})
	case events.FailureLogFull:
		// The log had no room for the attempt's tokens: the request's
		// failure, as when the runner sees the log full (Step), not the
		// worker's, whatever the log reads by now (eviction may have made
		// room since). No migration, no inhibition.
		return p.failLogFull(r, m, Report{})
	case events.FailureUnavailable:
		f.MigrationType = events.MigrationNewRequest
		return p.fence(r, m, f, true, time.Duration(cur.RetryAfterMS)*time.Millisecond)
	case events.FailureNotReady:
		f.MigrationType = events.MigrationNewRequest
	}
	if answeredError(cur) {
		if sameAnswerElsewhere(r, cur) {
			// Two workers' servers gave the same answer to this request
			// before any token: it is the request's, not theirs.
			return p.failAnswered(r, m, cur, Report{})
		}
		return p.fence(r, m, f, false, 0)
	}
	return p.fence(r, m, f, f.Reason != ReasonShutdown, 0)
}

// fence closes the failed attempt and remembers the failure for the decision.
func (p Policy) fence(r *projections.Request, m Memory, f Failure, inhibit bool, inhibitFor time.Duration) Action {
	cur, _ := r.Current()
	m.Watch = Watch{}
	m.Failure = &f
	m.LastFailed = f.WorkerID
	return Action{
		Kind: Fence, Next: m, AppendFence: cur.Attempt != f.Attempt || !cur.Closed,
		Inhibit: inhibit, InhibitFor: inhibitFor,
		Fence: events.AttemptFailed{
			RequestID: r.Accepted.RequestID, Attempt: f.Attempt, WorkerID: f.WorkerID, Offset: r.Len(), Reason: f.Reason,
		},
	}
}

// decide records what happens to a request whose attempt failed: a
// migration, or its end when the policy forbids one.
func (p Policy) decide(r *projections.Request, m Memory, f Failure) Action {
	if err := p.Allow(r); err != nil {
		// Nothing produced yet: the client may simply retry (503).
		// Tokens already delivered: the answer is truncated (500).
		status := http.StatusInternalServerError
		if r.Len() == 0 {
			status = http.StatusServiceUnavailable
		}
		// The failure stays remembered until the request has ended: if the
		// decision cannot be recorded, the next step decides again rather
		// than dispatching past the policy.
		if a, ok := lastAnswered(r, f.WorkerID); ok && a.Attempt == f.Attempt && r.Len() == 0 {
			// Nothing produced: the server's own answer, as the client
			// would have had it from the server directly.
			return p.failAnswered(r, m, a, Report{MigrationFailed: &f})
		}
		msg := fmt.Sprintf("worker %s failed (%s) and the request cannot migrate: %v", f.WorkerID, f.Reason, err)
		return p.fail(r, m, FailureCode(err), msg, status, Report{MigrationFailed: &f})
	}
	return Action{Kind: Migrate, Next: m, Migrated: events.RequestMigrated{
		RequestID: r.Accepted.RequestID, FromAttempt: f.Attempt, FromWorker: f.WorkerID, Cut: r.Len(),
		MigrationType: f.MigrationType, Reason: f.Reason, Frontend: p.Frontend,
	}}
}

// migratedFrom reports whether a migration away from attempt k is recorded.
func migratedFrom(r *projections.Request, k int) bool {
	return slices.ContainsFunc(r.Migrations, func(m projections.Migration) bool { return m.FromAttempt == k })
}
