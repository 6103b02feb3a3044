package projections

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/baton-dev/baton/events"
)

// compactVersion is the version of the state a compact record carries. A
// reader that meets a newer one ignores the record (IgnoredCompactVersion)
// and keeps what it folded from the deltas, if they are still there.
const compactVersion = 1

// compactState is what a finished request's history folds to, less its
// accepted event (which stays in the log): the state of events.RequestCompacted.
// Tokens are stored as one text with each token's byte length, so a token
// costs its text and a few bytes.
type compactState struct {
	V                  int                      `json:"v"`
	Status             Status                   `json:"status"`
	Owner              string                   `json:"owner,omitempty"`
	Attempts           []Attempt                `json:"attempts,omitempty"`
	Migrations         []Migration              `json:"migrations,omitempty"`
	FinishReason       string                   `json:"finish_reason,omitempty"`
	Failure            *events.RequestFailed    `json:"failure,omitempty"`
	Cancel             *events.RequestCancelled `json:"cancel,omitempty"`
	Children           []string                 `json:"children,omitempty"`
	CompletedAt        int64                    `json:"completed_at,omitempty"`
	N                  int                      `json:"n"`
	Text               string                   `json:"text,omitempty"`
	Lens               []int                    `json:"lens,omitempty"`
	IDs                []int                    `json:"ids,omitempty"`
	IDsLost            bool                     `json:"ids_lost,omitempty"`
	Details            []json.RawMessage        `json:"details,omitempty"`
	PromptIDs          []int                    `json:"prompt_ids,omitempty"`
	EnginePromptTokens int                      `json:"engine_prompt_tokens,omitempty"`
	// EngineCompletionTokens: added after version 1; older readers render
	// the usage of a compacted request from its token count.
	EngineCompletionTokens int    `json:"engine_completion_tokens,omitempty"`
	UpstreamModel          string `json:"upstream_model,omitempty"`
	Skipped                int    `json:"skipped,omitempty"`
}

// Compact returns the compact record of a finished request: the state its
// history has folded to, from which every reader folds the same request
// once the token deltas are gone. It fails for a request that is not
// terminal (its deltas are still being written) or that keeps no token
// text (NewRequestCounter).
func (r *Request) Compact() (events.RequestCompacted, error) {
	switch {
	case !r.Known():
		return events.RequestCompacted{}, fmt.Errorf("projections: compact: unknown request")
	case !r.Status.Terminal():
		return events.RequestCompacted{}, fmt.Errorf("projections: compact %s: not finished (%s)", r.Accepted.RequestID, r.Status)
	case r.countOnly:
		return events.RequestCompacted{}, fmt.Errorf("projections: compact %s: a counter keeps no tokens", r.Accepted.RequestID)
	}
	s := compactState{
		V: compactVersion, Status: r.Status, Owner: r.Owner, Attempts: r.Attempts, Migrations: r.Migrations,
		FinishReason: r.FinishReason, Failure: r.Failure, Cancel: r.Cancel, Children: r.Children,
		CompletedAt: r.CompletedAt, N: r.n, Text: r.Text(), IDs: r.ids, IDsLost: r.idsLost,
		Details: r.details, PromptIDs: r.PromptIDs, EnginePromptTokens: r.EnginePromptTokens, Skipped: r.Skipped,
		EngineCompletionTokens: r.EngineCompletionTokens, UpstreamModel: r.UpstreamModel,
	}
	if len(r.tokens) > 0 {
		s.Lens = make([]int, len(r.tokens))
		for i, t := range r.tokens {
			s.Lens[i] = len(t)
		}
	}
	data, err := json.Marshal(s)
	if err != nil {
		return events.RequestCompacted{}, fmt.Errorf("projections: compact %s: %w", r.Accepted.RequestID, err)
	}
	return events.RequestCompacted{RequestID: r.Accepted.RequestID, Through: r.covered, Tokens: r.n, State: data}, nil
}

// CarryID is the event id of event i of request id's carry (Carry): a
// compaction appends them under these ids, so that a second compaction's
// carry is a duplicate JetStream drops, and a record's fold leaves them out
// of what it covers (Compact's Through): a compaction that read the
// request after another one's carry was stored, and stores its record
// first, must not purge that carry.
func CarryID(id string, i int) string { return events.ID(id, carrySuffix, i) }

const carrySuffix = "carried"

// isCarry reports whether evid is the id of an event of this request's
// carry (CarryID).
func (r *Request) isCarry(evid string) bool { return IsCarry(r.Accepted.RequestID, evid) }

// IsCarry reports whether evid is the id of an event of request id's carry
// (CarryID), without building one: what a compaction wrote again for
// readers that predate compact records, not what an attempt produced.
func IsCarry(id, evid string) bool {
	rest, ok := strings.CutPrefix(evid, id)
	return ok && id != "" && len(rest) > len(carrySuffix)+1 && rest[0] == '.' &&
		rest[1:1+len(carrySuffix)] == carrySuffix && rest[1+len(carrySuffix)] == '.'
}

// IsConsolidation reports whether evid is the id of a consolidated delta:
// a batched attempt's tokens, copied by its owner from the worker's stream
// to the partition ("<request>.<attempt>.<from>.<to>.c").
func IsConsolidation(evid string) bool { return strings.HasSuffix(evid, ".c") }

// Compacted reports whether the state came from a compact record.
func (r *Request) Compacted() bool { return r.compacted }

// CompactedThrough is the last stream sequence the compact record covers
// (events.RequestCompacted.Through), 0 unless Compacted.
func (r *Request) CompactedThrough() uint64 { return r.compactedThrough }

// Carry is what a completed request's compaction leaves for readers that
// predate compact records (and skip them, as an unknown type): the whole
// answer as one delta of its last attempt, from offset 0 (its tokens,
// details and prompt ids; no token ids, which only a continuation needs),
// and its completion. Such a reader folds the lifecycle events, which stay,
// and these to the same text, status and usage; every other reader takes
// them as duplicates of what it folded, and then takes the record. Nothing
// is carried for a request that failed or was killed (its end is on its
// events subject, before where a carry would go: such a reader shows the
// failure without its partial text), nor for one killed after it completed
// (the kill would end it first). attempt is -1 when nothing is carried.
func (r *Request) Carry() (attempt int, worker string, evs []events.Event) {
	cur, ok := r.Current()
	if !ok || r.countOnly || r.Status != StatusCompleted || (r.Cancel != nil && r.Cancel.Mode == events.CancelKill) {
		return -1, "", nil
	}
	id := r.Accepted.RequestID
	if r.n > 0 {
		evs = append(evs, events.TokensGenerated{RequestID: id, Attempt: cur.Attempt, Offset: 0, Tokens: slices.Clone(r.tokens),
			PromptIDs: r.PromptIDs, Details: r.details})
	}
	evs = append(evs, events.RequestCompleted{RequestID: id, Attempt: cur.Attempt, FinishReason: r.FinishReason,
		PromptTokens: r.EnginePromptTokens, CompletionTokens: r.EngineCompletionTokens})
	return cur.Attempt, cur.WorkerID, evs
}

// Why a compact record changed nothing.
const (
	IgnoredCompactUnreadable = "ignored (unreadable compact record)"
	IgnoredCompactVersion    = "ignored (compact record of a newer version)"
)

// applyCompacted replaces everything but the accepted event with the
// record's state: the record is what the whole history before it folds to,
// whatever of that history a reader still saw (all of it, part of it while
// it was being purged, or none).
func (r *Request) applyCompacted(ev events.RequestCompacted) (bool, string) {
	if r.compacted {
		return false, NoEffectApplied
	}
	var s compactState
	if err := json.Unmarshal(ev.State, &s); err != nil {
		return false, IgnoredCompactUnreadable
	}
	if s.V > compactVersion {
		return false, IgnoredCompactVersion
	}
	tokens := make([]string, 0, len(s.Lens))
	off := 0
	for _, n := range s.Lens {
		if n < 0 || off+n > len(s.Text) {
			return false, IgnoredCompactUnreadable
		}
		tokens = append(tokens, s.Text[off:off+n])
		off += n
	}
	if off != len(s.Text) || (!r.countOnly && len(tokens) != s.N) ||
		(s.IDs != nil && len(s.IDs) != s.N) || (s.Details != nil && len(s.Details) != s.N) {
		return false, IgnoredCompactUnreadable
	}
	r.Status, r.Owner, r.Attempts, r.Migrations = s.Status, s.Owner, s.Attempts, s.Migrations
	r.FinishReason, r.Failure, r.Cancel, r.Children = s.FinishReason, s.Failure, s.Cancel, s.Children
	r.CompletedAt, r.n, r.PromptIDs = s.CompletedAt, s.N, s.PromptIDs
	r.EnginePromptTokens, r.Skipped = s.EnginePromptTokens, s.Skipped
	r.EngineCompletionTokens, r.UpstreamModel = s.EngineCompletionTokens, s.UpstreamModel
	r.compacted, r.compactedThrough = true, ev.Through
	if r.countOnly {
		return true, ""
	}
	for i, d := range s.Details {
		if string(d) == "null" {
			s.Details[i] = nil // a token without details, as the fold keeps it
		}
	}
	r.tokens, r.ids, r.idsLost, r.details = tokens, s.IDs, s.IDsLost, s.Details
	if len(r.tokens) == 0 {
		r.tokens = nil
	}
	return true, ""
}

// Consolidation is the delta that copies attempt k's tokens from offset
// from up to where the fold has them (its cut once it is closed): how a
// batched attempt's output, folded from its worker's stream, is written to
// the request's partition (docs/internals.md). ok is false when there is
// nothing to copy. Its ids, details, prompt ids, model and verdict are the
// fold's, so that a reader of the copy folds what this fold holds.
func (r *Request) Consolidation(k, from int) (d events.TokensGenerated, ok bool) {
	if k < 0 || k >= len(r.Attempts) || r.countOnly {
		return d, false
	}
	a := r.Attempts[k]
	end := r.n
	if a.Closed {
		end = a.Cut
	}
	from = max(from, a.StartOffset)
	if end <= from || end > len(r.tokens) {
		return d, false
	}
	d = events.TokensGenerated{RequestID: r.Accepted.RequestID, Attempt: k, Offset: from, Tokens: slices.Clone(r.tokens[from:end]),
		Exact: a.Exact}
	if !r.idsLost && len(r.ids) >= end {
		d.IDs = slices.Clone(r.ids[from:end])
	}
	if len(r.details) >= end {
		d.Details = slices.Clone(r.details[from:end])
	}
	if from == 0 {
		d.PromptIDs = r.PromptIDs
	}
	d.Model = r.UpstreamModel
	return d, true
}

// Closing is the event that closed attempt k in the fold, as its worker or
// a fence stored it: the attempt's failure at its cut, or the request's
// completion by k. ok is false while k is open.
func (r *Request) Closing(k int) (ev events.Event, ok bool) {
	if k < 0 || k >= len(r.Attempts) {
		return nil, false
	}
	a := r.Attempts[k]
	id := r.Accepted.RequestID
	switch {
	case a.Closed:
		return events.AttemptFailed{RequestID: id, Attempt: k, WorkerID: a.WorkerID, Offset: a.Cut, Reason: a.CloseReason,
			Class: a.CloseClass, Status: a.CloseStatus, Code: a.CloseCode, Message: a.CloseMessage, RetryAfterMS: a.RetryAfterMS}, true
	case r.Status == StatusCompleted && k == len(r.Attempts)-1:
		return events.RequestCompleted{RequestID: id, Attempt: k, FinishReason: r.FinishReason,
			PromptTokens: r.EnginePromptTokens, CompletionTokens: r.EngineCompletionTokens, Exact: a.Exact, Offset: r.n}, true
	}
	return nil, false
}
