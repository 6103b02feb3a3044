package projections

import (
	"fmt"
	"strings"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
)

// TimelineEntry is one stored event of a request's history as the replay
// fold saw it (the JSON of each element of `baton replay --json`'s timeline
// and of the console's timeline).
type TimelineEntry struct {
	Seq     uint64       `json:"seq"`
	Time    time.Time    `json:"time"`
	Since   float64      `json:"since_accepted_seconds"`
	Subject string       `json:"subject"` // "events" or "tokens.<attempt>.<worker>"
	Type    string       `json:"type"`
	ID      string       `json:"id"`
	Source  string       `json:"source"`
	Applied bool         `json:"applied"`        // the fold changed the state
	Note    string       `json:"note,omitempty"` // why it did not, e.g. "ignored (fenced)"
	Summary string       `json:"summary"`
	Event   events.Event `json:"event"`
	// Len is the number of tokens accepted once this event was applied, so a
	// reader can show the text as it grew.
	Len int `json:"len"`
	// Carry is set for an event of a compaction's carry (CarryID): the
	// answer written again as one delta and a completion on the last
	// attempt's subject for readers that predate compact records, not what
	// that attempt produced (the compact record's entry says what each
	// attempt did).
	Carry bool `json:"carry,omitempty"`
}

// Replay folds a request's stored events, in stream order, into its state
// and timeline. ok is false when the history has no accepted event.
func Replay(envs []events.Envelope) (r *Request, timeline []TimelineEntry, ok bool) {
	r = NewRequest()
	var start time.Time
	for _, e := range envs {
		if a, isAccepted := e.Event.(events.RequestAccepted); isAccepted && start.IsZero() && a.RequestID != "" {
			start = e.Time
		}
	}
	if start.IsZero() && len(envs) > 0 {
		start = envs[0].Time
	}
	timeline = make([]TimelineEntry, 0, len(envs))
	for _, e := range envs {
		applied, note := r.Fold(e)
		entry := TimelineEntry{
			Seq: e.Seq, Time: e.Time, Since: e.Time.Sub(start).Seconds(), Subject: SubjectKind(e),
			Type: e.Type(), ID: e.ID, Source: e.Source, Applied: applied, Note: note,
			Summary: Describe(e), Event: e.Event, Len: r.Len(), Carry: r.isCarry(e.ID),
		}
		if _, ok := e.Event.(events.RequestCompacted); ok && applied {
			// The deltas are gone: the record says what each attempt produced.
			entry.Summary += ": " + attemptRanges(r)
		}
		timeline = append(timeline, entry)
	}
	if !r.Known() {
		return nil, nil, false
	}
	return r, timeline, true
}

// SubjectKind names the subject e is stored on, below
// baton.requests.<slot>.<id>.: "events", or "tokens.<k>.<worker>" for what
// attempt k, routed to worker, produces. For an envelope whose subject is
// unknown it names the kind from the event: "events" or "tokens.<k>".
func SubjectKind(e events.Envelope) string {
	if _, ok := e.Event.(events.RequestEnded); ok {
		return "end" // baton.ends.<slot>.<id>, beside the request log
	}
	if s, err := streams.ParseRequestSubject(e.Stored); err == nil {
		return s.Tail()
	}
	const id, worker = "_", "_"
	subj := strings.TrimPrefix(streams.SubjectOf(id, worker, e.Event), strings.TrimSuffix(streams.RequestEvents(id), "events"))
	return strings.TrimSuffix(subj, "."+worker)
}

// FencedBy reports the frontend that wrote an AttemptFailed marker, if a
// frontend (rather than the attempt's worker) wrote it: a fence.
func FencedBy(e events.Envelope) (string, bool) {
	if rest, ok := strings.CutPrefix(e.Source, "baton/frontend/"); ok {
		return rest, true
	}
	return "", false
}

// Kind shortens an event type to what the console and `baton events` show:
// "baton.request.migrated.v1" → "migrated", "baton.worker.lost.v1" → "lost".
// A type of another namespace is returned whole.
func Kind(typ string) string {
	for _, p := range []string{"baton.request.", "baton.worker."} {
		if rest, ok := strings.CutPrefix(typ, p); ok {
			if i := strings.LastIndex(rest, ".v"); i > 0 {
				return rest[:i]
			}
			return rest
		}
	}
	return typ
}

// Describe is a one-line, plain-words summary of an event.
func Describe(e events.Envelope) string {
	switch ev := e.Event.(type) {
	case events.RequestAccepted:
		return describeAccepted(ev)
	case events.RequestRouted:
		s := fmt.Sprintf("attempt %d → worker %s, from token %d", ev.Attempt, ev.WorkerID, ev.StartOffset)
		if ev.Output == events.OutputBatched {
			s += ", batched (its output in the worker's stream, for frontend " + ev.OutputTo + ")"
		}
		return s
	case events.TokensGenerated:
		if IsCarry(ev.RequestID, e.ID) {
			return CarryPrefix + TokenRange(ev.Offset, len(ev.Tokens), 1)
		}
		if IsConsolidation(e.ID) {
			return fmt.Sprintf("attempt %d: %s, copied from its worker's stream", ev.Attempt, TokenRange(ev.Offset, len(ev.Tokens), 1))
		}
		return fmt.Sprintf("attempt %d: %s", ev.Attempt, TokenRange(ev.Offset, len(ev.Tokens), 1))
	case events.RequestCompleted:
		if IsCarry(ev.RequestID, e.ID) {
			return fmt.Sprintf("%scompleted, finish reason %s, %d completion tokens", CarryPrefix, ev.FinishReason, ev.CompletionTokens)
		}
		return fmt.Sprintf("attempt %d completed: finish reason %s, %d completion tokens",
			ev.Attempt, ev.FinishReason, ev.CompletionTokens)
	case events.AttemptFailed:
		return describeFailed(e, ev)
	case events.RequestMigrated:
		return fmt.Sprintf("%s migration: attempt %d (worker %s) cut at token %d by frontend %s: %s",
			ev.MigrationType, ev.FromAttempt, ev.FromWorker, ev.Cut, ev.Frontend, ev.Reason)
	case events.RequestAttached:
		return fmt.Sprintf("attached to frontend %s (client at token %d)", ev.Frontend, ev.Offset)
	case events.RequestCancelled:
		return fmt.Sprintf("cancel (%s): %s", ev.Mode, ev.Reason)
	case events.RequestFailed:
		return fmt.Sprintf("failed: %s (status %d) after %d tokens: %s", ev.Code, ev.Status, ev.Offset, ev.Message)
	case events.ChildAdded:
		return "child request " + ev.ChildID
	case events.ResponseDeleted:
		return "response deleted: every reader answers 404 for it"
	case events.RequestEnded:
		inner := ""
		if end := ev.End(); end != nil {
			inner = Describe(events.Envelope{Event: end})
		}
		return fmt.Sprintf("ended in the ends place by frontend %s, after sequence %d of the log: %s", ev.Frontend, ev.Through, inner)
	case events.RequestCompacted:
		return fmt.Sprintf("compacted: %d tokens, the history through sequence %d in one record", ev.Tokens, ev.Through)
	case events.WorkerRegistered:
		return fmt.Sprintf("worker %s registered: model %s, pid %d on %s, lease ttl %v, %d KV blocks",
			ev.WorkerID, ev.Model, ev.PID, ev.Host, time.Duration(ev.LeaseTTLMS)*time.Millisecond, ev.KVBlocks)
	case events.WorkerDraining:
		return fmt.Sprintf("worker %s draining: %s", ev.WorkerID, ev.Reason)
	case events.WorkerDeregistered:
		return fmt.Sprintf("worker %s deregistered", ev.WorkerID)
	case events.WorkerLost:
		return fmt.Sprintf("worker %s lost: %s", ev.WorkerID, ev.Reason)
	case nil:
		return ""
	}
	return fmt.Sprintf("%+v", e.Event)
}

// describeAccepted is Describe of an accepted event: what was asked, and of
// whom.
func describeAccepted(ev events.RequestAccepted) string {
	parts := []string{fmt.Sprintf("model %s (%s), %d prompt tokens, max_tokens %d, owner %s",
		ev.Model, ev.Endpoint, ev.PromptTokens, ev.MaxTokens, ev.Frontend)}
	if ev.Stream {
		parts = append(parts, "streaming")
	}
	if ev.Resumable {
		parts = append(parts, "resumable")
	}
	if ev.Background {
		parts = append(parts, "background")
	}
	if ev.ParentID != "" {
		parts = append(parts, "parent "+ev.ParentID)
	}
	if r := ev.Route; r != nil {
		route := "attempt 0 → worker " + r.WorkerID
		if r.Output == events.OutputBatched {
			route += ", batched"
		}
		parts = append(parts, route)
	}
	if ev.PinnedWorker != "" {
		parts = append(parts, "pinned to "+ev.PinnedWorker)
	}
	if ev.Choices > 1 {
		parts = append(parts, fmt.Sprintf("n=%d", ev.Choices))
	}
	return strings.Join(parts, ", ")
}

// describeFailed is Describe of an attempt's failure: a frontend's fence, or
// what the worker reported, with the upstream's status when it had one.
func describeFailed(e events.Envelope, ev events.AttemptFailed) string {
	if fe, ok := FencedBy(e); ok {
		return fmt.Sprintf("attempt %d (worker %s) fenced by frontend %s at token %d: %s",
			ev.Attempt, ev.WorkerID, fe, ev.Offset, ev.Reason)
	}
	line := fmt.Sprintf("attempt %d failed, reported by worker %s at token %d: %s",
		ev.Attempt, ev.WorkerID, ev.Offset, ev.Reason)
	if ev.Status != 0 {
		line += fmt.Sprintf(" (upstream %d", ev.Status)
		if ev.Code != "" {
			line += " " + ev.Code
		}
		if ev.RetryAfterMS > 0 {
			line += fmt.Sprintf(", retry after %d ms", ev.RetryAfterMS)
		}
		line += ")"
	}
	if ev.Message != "" {
		line += ": " + ev.Message
	}
	return line
}

// CarryPrefix begins the summary of an event of a compaction's carry
// (IsCarry), which is no attempt's work.
const CarryPrefix = "carry for older readers: "

// attemptRanges says which tokens each of r's attempts produced: from its
// start to where it was cut, or to where the next one started, the last
// one to the end ("attempt 0: tokens 0-59 (60), attempt 1: tokens 60-199
// (140)").
func attemptRanges(r *Request) string {
	if len(r.Attempts) == 0 {
		return "no attempts"
	}
	parts := make([]string, 0, len(r.Attempts))
	for i, a := range r.Attempts {
		end := r.Len()
		switch {
		case a.Closed:
			end = a.Cut
		case i+1 < len(r.Attempts):
			end = r.Attempts[i+1].StartOffset
		}
		parts = append(parts, fmt.Sprintf("attempt %d: %s", a.Attempt, TokenRange(a.StartOffset, max(0, end-a.StartOffset), 1)))
	}
	return strings.Join(parts, ", ")
}

// TokenRange describes n tokens at offset, received in deltas deltas.
func TokenRange(offset, n, deltas int) string {
	var s string
	switch n {
	case 0:
		s = fmt.Sprintf("no tokens at %d", offset)
	case 1:
		s = fmt.Sprintf("token %d", offset)
	default:
		s = fmt.Sprintf("tokens %d-%d", offset, offset+n-1)
	}
	if deltas > 1 {
		s += fmt.Sprintf(" (%d tokens in %d deltas)", n, deltas)
	} else if n > 1 {
		s += fmt.Sprintf(" (%d)", n)
	}
	return s
}
