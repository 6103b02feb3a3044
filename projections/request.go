package projections

import (
	"encoding/json"
	"slices"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
)

// Status of a request.
type Status string

// Request statuses.
const (
	StatusUnknown   Status = ""
	StatusPending   Status = "pending"   // accepted, not yet routed
	StatusRunning   Status = "running"   // an attempt is generating
	StatusCompleted Status = "completed" // finished; FinishReason says why
	StatusFailed    Status = "failed"    // ended by RequestFailed
	StatusCancelled Status = "cancelled" // ended by a kill
)

// Terminal reports whether no further tokens will be accepted.
func (s Status) Terminal() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusCancelled
}

// Attempt is one dispatch of a request to a worker.
type Attempt struct {
	Attempt     int    `json:"attempt"`
	WorkerID    string `json:"worker_id"`
	StartOffset int    `json:"start_offset"`
	// Closed is set once the attempt was fenced (AttemptFailed on its subject):
	// nothing it stores afterwards is read.
	Closed bool `json:"closed,omitempty"`
	// Cut is the token offset at which the attempt was closed (valid if Closed).
	Cut         int    `json:"cut,omitempty"`
	CloseReason string `json:"close_reason,omitempty"`
	// CloseClass, CloseStatus, CloseCode, CloseMessage and RetryAfterMS are
	// the worker's report of the failure (events.AttemptFailed), if it gave one.
	CloseClass   string `json:"close_class,omitempty"`
	CloseStatus  int    `json:"close_status,omitempty"`
	CloseCode    string `json:"close_code,omitempty"`
	CloseMessage string `json:"close_message,omitempty"`
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
	// Exact is a continuation's verdict (StartOffset > 0), as its worker
	// reported it on its first delta or its completion: whether it
	// continued the answer so far exactly. Nil: not reported (yet).
	Exact *bool `json:"exact,omitempty"`
	// Output and OutputTo are the routed decision's (events.RequestRouted):
	// a batched attempt's output is in its worker's output stream, on the
	// subject of the frontend OutputTo, until it is consolidated here.
	Output   string `json:"output,omitempty"`
	OutputTo string `json:"output_to,omitempty"`
}

// Batched reports whether the attempt's worker writes it in batches.
func (a Attempt) Batched() bool { return a.Output == events.OutputBatched }

// Migration is one re-dispatch of a request.
type Migration struct {
	FromAttempt   int    `json:"from_attempt"`
	FromWorker    string `json:"from_worker"`
	MigrationType string `json:"migration_type"`
	Offset        int    `json:"offset"`
	Reason        string `json:"reason"`
}

// Request is the replay state of one request, folded from the events on its
// subjects in stream order. The fold implements fencing: an attempt contributes
// tokens only while it is the current attempt and until its AttemptFailed
// marker, so every reader of the log, live or replaying, accepts exactly the
// same tokens in the same order, once.
//
// A Request is not safe for concurrent use.
type Request struct {
	lastSeq uint64
	// acceptedSeq is the stream sequence of the accepted event (0 when it
	// was applied as this process appended it): an end in the ends place
	// whose Through is below it is an earlier request's of the same id.
	acceptedSeq uint64
	// covered is the last sequence of what a compact record of this state
	// covers: every event folded but a compaction's carry (CarryID), which
	// the record's purge must leave for the readers that fold it.
	covered uint64

	Accepted     events.RequestAccepted
	Status       Status
	Owner        string
	Attempts     []Attempt
	Migrations   []Migration
	FinishReason string
	Failure      *events.RequestFailed
	Cancel       *events.RequestCancelled
	Children     []string // child requests, in the order they were added
	CompletedAt  int64    // unix seconds, from the completion event's time
	// Deleted is set by a response's tombstone (events.ResponseDeleted):
	// readers answer for the request as for an unknown id.
	Deleted bool

	tokens []string
	// ids parallels tokens while every token's id is known (idsLost: not).
	ids     []int
	idsLost bool
	// details parallels tokens once any token has details (nil entries:
	// none).
	details []json.RawMessage
	// PromptIDs are the prompt's token ids, from the first delta at offset 0
	// that carried them; nil when no engine reported them.
	PromptIDs []int
	// EnginePromptTokens is the prompt's length as the completing worker
	// reported it (its engine's count when it had one); 0 until completion.
	EnginePromptTokens int
	// UpstreamModel is the model the first engine's server that named one
	// said produced the answer; "" when none did (the mock).
	UpstreamModel string
	// EngineCompletionTokens is the answer's length as the completing
	// worker reported it (its server's usage for its attempt, plus the
	// tokens before it); 0 until completion.
	EngineCompletionTokens int
	n                      int // tokens accepted: len(tokens), unless countOnly
	// countOnly keeps no token text (NewRequestCounter).
	countOnly bool
	// compacted: the state came from a compact record (applyCompacted),
	// which covers the stream up to compactedThrough.
	compacted        bool
	compactedThrough uint64
	// subject is the stored subject misplaced parsed last, and parsed what
	// it parsed to: an attempt's deltas all come on one subject, so every
	// delta after its first costs a comparison, not a parse.
	subject string
	parsed  streams.RequestSubject
	// Skipped counts deltas that arrived ahead of a gap and were not applied.
	// It is not a loss: when an append fails (a leader election, a
	// reconnect), the worker re-sends the tokens from the missing delta's
	// offset to the last it flushed, and the fold takes them from there
	// (deltas stored after the gap are covered by it). The output is complete
	// whenever the request completed.
	Skipped int
	// gapEnd is the furthest token offset a delta or an end of the
	// current attempt ignored as a gap reached (Gapped).
	gapEnd int
}

// Gapped reports whether the running request's current attempt has output
// past a gap that was ignored and is not filled yet: a reader missed some
// of it, and should read it back.
func (r *Request) Gapped() bool { return !r.Status.Terminal() && r.gapEnd > r.n }

// NewRequest returns an empty projection.
func NewRequest() *Request { return &Request{} }

// NewRequestCounter returns an empty projection that keeps no token text (its
// state and Len are NewRequest's; Tokens and Text are empty), for views of many.
func NewRequestCounter() *Request { return &Request{countOnly: true} }

// LastSeq is the stream sequence of the last applied event.
func (r *Request) LastSeq() uint64 { return r.lastSeq }

// Known reports whether the request's accepted event has been applied.
func (r *Request) Known() bool { return r.Accepted.RequestID != "" }

// Apply folds e into the state and reports whether anything changed. Events
// with a sequence not newer than the last applied one are skipped (replays and
// redeliveries); events with Seq 0 (not yet stored, e.g. just appended by this
// process) are applied as they come.
func (r *Request) Apply(e events.Envelope) (changed bool) {
	changed, _ = r.Fold(e)
	return changed
}

// Fold is Apply that also says why an event changed nothing: one of the
// Ignored and NoEffect reasons (empty when it changed something).
func (r *Request) Fold(e events.Envelope) (changed bool, why string) {
	if ev, ok := e.Event.(events.RequestEnded); ok {
		return r.applyEnded(e, ev) // its Seq is the ends place's, not this log's
	}
	if why := r.admit(e); why != "" {
		return false, why
	}
	return r.applyEvent(e)
}

// admit moves the log position past e and says why e is not folded: a
// replay, an unreadable record, or an event on the wrong subject ("" when
// it is to be folded).
func (r *Request) admit(e events.Envelope) string {
	if e.Seq != 0 {
		if e.Seq <= r.lastSeq {
			return IgnoredReplayed
		}
		r.lastSeq = e.Seq
		if !r.isCarry(e.ID) {
			r.covered = e.Seq
		}
	}
	if u, ok := e.Event.(events.Unreadable); ok {
		return SkippedPrefix + u.Reason + ")"
	}
	return r.misplaced(e)
}

// applyEvent folds one admitted event by its type.
func (r *Request) applyEvent(e events.Envelope) (bool, string) {
	switch ev := e.Event.(type) {
	case events.RequestAccepted:
		return r.applyAccepted(e.Seq, ev)
	case events.RequestRouted:
		return r.applyRouted(ev)
	case events.TokensGenerated:
		return r.applyTokens(ev)
	case events.RequestCompleted:
		return r.applyCompleted(e, ev)
	case events.AttemptFailed:
		return r.applyFailed(ev)
	case events.RequestMigrated:
		return r.applyMigrated(ev)
	case events.RequestFailed:
		return r.applyRequestFailed(ev)
	case events.RequestAttached:
		if r.Owner == ev.Frontend {
			return false, NoEffectOwner
		}
		r.Owner = ev.Frontend
	case events.ChildAdded:
		if slices.Contains(r.Children, ev.ChildID) {
			return false, NoEffectApplied
		}
		r.Children = append(r.Children, ev.ChildID)
	case events.RequestCancelled:
		return r.applyCancel(ev)
	case events.RequestCompacted:
		return r.applyCompacted(ev)
	case events.ResponseDeleted:
		if r.Deleted {
			return false, NoEffectApplied
		}
		r.Deleted = true
	default:
		return false, IgnoredUnknownType
	}
	return true, ""
}

// applyAccepted starts the request; seq is where its acceptance is stored.
func (r *Request) applyAccepted(seq uint64, ev events.RequestAccepted) (bool, string) {
	if r.Known() {
		if r.acceptedSeq == 0 {
			r.acceptedSeq = seq // the stored copy of what this process appended
		}
		return false, NoEffectApplied
	}
	r.Accepted = ev
	r.Owner = ev.Frontend
	r.Status = StatusPending
	r.acceptedSeq = seq
	if ev.Route != nil {
		r.applyRouted(*ev.Route) // validated with the event: attempt 0, from token 0
	}
	return true, ""
}

// applyRouted opens the next attempt.
func (r *Request) applyRouted(ev events.RequestRouted) (bool, string) {
	switch {
	case r.Status.Terminal():
		return false, IgnoredAfterEnd
	case ev.Attempt < len(r.Attempts):
		return false, NoEffectApplied
	case ev.Attempt != len(r.Attempts):
		return false, IgnoredOutOfOrder
	}
	r.Attempts = append(r.Attempts, Attempt{Attempt: ev.Attempt, WorkerID: ev.WorkerID, StartOffset: ev.StartOffset,
		Output: ev.Output, OutputTo: ev.OutputTo})
	r.Status = StatusRunning
	r.gapEnd = 0 // what an earlier attempt left past a gap is not this one's
	return true, ""
}

// applyCompleted ends the request with the current attempt's answer.
func (r *Request) applyCompleted(e events.Envelope, ev events.RequestCompleted) (bool, string) {
	if why := r.closedFor(ev.Attempt); why != "" {
		return false, why
	}
	if end := ev.Offset; end > 0 {
		if limit := r.Accepted.MaxTokens; limit > 0 && end > limit {
			end = limit // the fold keeps no token past max_tokens
		}
		if r.n < end {
			// Tokens the worker stored before its end are missing here:
			// ending now would end the answer without them. The attempt
			// stays open: a read back fills the gap, or the owner finds
			// it stalled and migrates from what it has.
			r.Skipped++
			r.gapEnd = max(r.gapEnd, end)
			return false, IgnoredGap
		}
	}
	r.Status = StatusCompleted
	r.FinishReason = ev.FinishReason
	if ev.PromptTokens > 0 {
		r.EnginePromptTokens = ev.PromptTokens
	}
	r.EngineCompletionTokens = ev.CompletionTokens
	r.CompletedAt = e.Time.Unix()
	r.noteExact(ev.Attempt, ev.Exact)
	return true, ""
}

// applyRequestFailed ends the request with the failure ev names.
func (r *Request) applyRequestFailed(ev events.RequestFailed) (bool, string) {
	if r.Status.Terminal() {
		return false, IgnoredAfterEnd
	}
	f := ev
	r.Failure = &f
	r.Status = StatusFailed
	return true, ""
}

// applyFailed closes the attempt ev names at the tokens folded so far.
func (r *Request) applyFailed(ev events.AttemptFailed) (bool, string) {
	if ev.Attempt < 0 || ev.Attempt >= len(r.Attempts) {
		return false, IgnoredBadAttempt
	}
	if r.Attempts[ev.Attempt].Closed {
		return false, NoEffectClosed
	}
	a := &r.Attempts[ev.Attempt]
	a.Closed = true
	a.Cut = r.n
	a.CloseReason = ev.Reason
	a.CloseClass, a.CloseStatus, a.CloseCode, a.CloseMessage = ev.Class, ev.Status, ev.Code, ev.Message
	a.RetryAfterMS = ev.RetryAfterMS
	return true, ""
}

// applyMigrated moves the request off the attempt ev abandons, back to
// pending.
func (r *Request) applyMigrated(ev events.RequestMigrated) (bool, string) {
	switch {
	case r.Status.Terminal():
		return false, IgnoredAfterEnd
	case r.migrated(ev.FromAttempt):
		return false, NoEffectApplied
	}
	// The decision fences the attempt it abandons, whether or not its
	// AttemptFailed marker came first: nothing it stores later is read.
	if k := ev.FromAttempt; k >= 0 && k < len(r.Attempts) && !r.Attempts[k].Closed {
		a := &r.Attempts[k]
		a.Closed = true
		a.Cut = r.n
		a.CloseReason = ev.Reason
	}
	r.Migrations = append(r.Migrations, Migration{
		FromAttempt: ev.FromAttempt, FromWorker: ev.FromWorker,
		MigrationType: ev.MigrationType, Offset: ev.Cut, Reason: ev.Reason,
	})
	if ev.Frontend != "" {
		r.Owner = ev.Frontend
	}
	r.Status = StatusPending
	return true, ""
}

func (r *Request) applyCancel(ev events.RequestCancelled) (bool, string) {
	if r.Status.Terminal() {
		return false, IgnoredAfterEnd
	}
	// A kill escalates an earlier stop; anything else repeats a cancel.
	escalates := r.Cancel != nil && r.Cancel.Mode == events.CancelStop && ev.Mode == events.CancelKill
	if r.Cancel != nil && !escalates {
		return false, NoEffectApplied
	}
	c := ev
	r.Cancel = &c
	if ev.Mode == events.CancelKill {
		r.Status = StatusCancelled
	}
	return true, ""
}

// migrated reports whether a migration away from attempt k was already
// applied (an event applied twice, e.g. once as appended and once as stored).
func (r *Request) migrated(k int) bool {
	return slices.ContainsFunc(r.Migrations, func(m Migration) bool { return m.FromAttempt == k })
}

// closedFor says why attempt k may not contribute, or "" if it may: it must
// be the current attempt, not fenced, and the request must not have ended.
func (r *Request) closedFor(k int) string {
	switch {
	case r.Status.Terminal():
		return IgnoredAfterEnd
	case k < 0 || k != len(r.Attempts)-1 || r.Attempts[k].Closed:
		return IgnoredFenced
	}
	return ""
}

func (r *Request) applyTokens(ev events.TokensGenerated) (bool, string) {
	if why := r.closedFor(ev.Attempt); why != "" {
		return false, why
	}
	if r.Known() && deltaWeight(ev) > AttemptBound(r.Accepted) {
		return false, IgnoredOversize
	}
	have := r.n
	if ev.Offset > have {
		r.Skipped++ // a gap: never accept tokens out of order
		r.gapEnd = max(r.gapEnd, ev.Offset+len(ev.Tokens))
		return false, IgnoredGap
	}
	skip := have - ev.Offset // already accepted (a retried or overlapping delta)
	if skip >= len(ev.Tokens) {
		return false, IgnoredDuplicate
	}
	add := ev.Tokens[skip:]
	if limit := r.Accepted.MaxTokens; limit > 0 && have+len(add) > limit {
		add = add[:max(0, limit-have)]
	}
	if len(add) == 0 {
		return false, IgnoredPastMax
	}
	r.n += len(add)
	r.noteExact(ev.Attempt, ev.Exact)
	if r.countOnly {
		return true, ""
	}
	if ev.Offset == 0 && r.PromptIDs == nil && ev.PromptIDs != nil {
		r.PromptIDs = ev.PromptIDs
	}
	if r.UpstreamModel == "" {
		r.UpstreamModel = ev.Model
	}
	switch {
	case r.idsLost:
	case ev.IDs == nil:
		r.idsLost, r.ids = true, nil
	default:
		r.ids = append(r.ids, ev.IDs[skip:skip+len(add)]...)
	}
	if ev.Details != nil || r.details != nil {
		if r.details == nil {
			r.details = make([]json.RawMessage, have, have+len(add))
		}
		if ev.Details != nil {
			r.details = append(r.details, ev.Details[skip:skip+len(add)]...)
		} else {
			r.details = append(r.details, make([]json.RawMessage, len(add))...)
		}
	}
	r.tokens = append(r.tokens, add...)
	return true, ""
}

// noteExact keeps a continuation's verdict, when its worker reported one.
func (r *Request) noteExact(k int, exact *bool) {
	if exact != nil && k >= 0 && k < len(r.Attempts) && r.Attempts[k].StartOffset > 0 {
		v := *exact
		r.Attempts[k].Exact = &v
	}
}

// applyEnded applies ev, a request's end from the ends place (stored on
// streams.RequestEnd, which only frontends may write, or appended by this
// process): the end it carries, as if it had been stored in the log just
// after Through. Its reader yields it there (streams.ReadRequest). An end
// before the request is known, or older than its accepted event, changes
// nothing.
func (r *Request) applyEnded(e events.Envelope, ev events.RequestEnded) (bool, string) {
	switch {
	case e.Stored != "" && !streams.IsEndSubject(e.Stored), ev.RequestID != r.Accepted.RequestID && r.Known():
		return false, IgnoredWrongSubject
	case !r.Known():
		return false, NoEffect
	case ev.Through < r.acceptedSeq:
		return false, IgnoredStaleEnd
	}
	end := ev.End()
	if end == nil {
		return false, NoEffect
	}
	return r.Fold(events.Envelope{ID: e.ID, Source: e.Source, Subject: e.Subject, Time: e.Time, Event: end})
}
