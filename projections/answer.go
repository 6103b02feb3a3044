// What a request's answer reads as: its tokens, their ids and details, its
// counts and its end, from the state Fold builds (request.go).

package projections

import (
	"encoding/json"
	"slices"

	"github.com/baton-dev/baton/events"
)

// Len is the number of tokens accepted so far (the token offset).
func (r *Request) Len() int { return r.n }

// Tokens returns a copy of the tokens at offsets [from, Len()).
func (r *Request) Tokens(from int) []string {
	if from < 0 {
		from = 0
	}
	if from >= len(r.tokens) {
		return nil
	}
	return slices.Clone(r.tokens[from:])
}

// Text is the output so far.
func (r *Request) Text() string {
	n := 0
	for _, t := range r.tokens {
		n += len(t)
	}
	b := make([]byte, 0, n)
	for _, t := range r.tokens {
		b = append(b, t...)
	}
	return string(b)
}

// Current returns the current attempt, if any.
func (r *Request) Current() (Attempt, bool) {
	if len(r.Attempts) == 0 {
		return Attempt{}, false
	}
	return r.Attempts[len(r.Attempts)-1], true
}

// Continued reports whether some continuation (an attempt that started
// after a migration, at a token offset > 0) contributed to the answer: it
// produced tokens, or it is the attempt that completed it.
func (r *Request) Continued() bool {
	for i := range r.Attempts {
		if r.contributed(i) {
			return true
		}
	}
	return false
}

// Exact reports whether the answer is what the engines would have given
// without its migrations, as far as they showed: true unless a
// continuation that contributed to it (Continued) was approximate, or has
// not been shown exact yet (a prefill continuation still running).
func (r *Request) Exact() bool {
	for i, a := range r.Attempts {
		if r.contributed(i) && (a.Exact == nil || !*a.Exact) {
			return false
		}
	}
	return true
}

// contributed reports whether attempt k is a continuation whose output is
// part of the answer.
func (r *Request) contributed(k int) bool {
	a := r.Attempts[k]
	if a.StartOffset == 0 {
		return false
	}
	end := r.n
	if a.Closed {
		end = a.Cut
	} else if k == len(r.Attempts)-1 && r.Status == StatusCompleted {
		return true
	}
	return end > a.StartOffset
}

// TokenIDs returns a copy of the ids of every token so far, and whether the
// engines reported all of them.
func (r *Request) TokenIDs() ([]int, bool) {
	if r.idsLost {
		return nil, false
	}
	return slices.Clone(r.ids), true
}

// Details returns the details of the tokens at offsets [from, Len()), nil
// when none of them has any. The entries are shared: do not modify them.
func (r *Request) Details(from int) []json.RawMessage {
	if r.details == nil || from >= len(r.details) {
		return nil
	}
	return slices.Clone(r.details[max(from, 0):])
}

// ResponseModel is the model an answer names: the upstream's, as its server
// streamed it, unless the request was accepted to name the client's
// (Accepted.ClientModel) or no server named one.
func (r *Request) ResponseModel() string {
	if r.UpstreamModel != "" && !r.Accepted.ClientModel {
		return r.UpstreamModel
	}
	return r.Accepted.Model
}

// CompletionTokens is the answer's length in tokens: the count the
// completing worker reported (its server's, where the server gave usage),
// else the tokens accepted.
func (r *Request) CompletionTokens() int {
	if r.EngineCompletionTokens > 0 {
		return r.EngineCompletionTokens
	}
	return r.n
}

// PromptTokens is the prompt's length in tokens: the engine's count when an
// engine reported one (its usage or its prompt ids), else the frontend's.
func (r *Request) PromptTokens() int {
	switch {
	case r.EnginePromptTokens > 0:
		return r.EnginePromptTokens
	case r.PromptIDs != nil:
		return len(r.PromptIDs)
	}
	return r.Accepted.PromptTokens
}

// AcceptedSeq is the stream sequence of the request's accepted event (0
// while only this process's own append of it was applied).
func (r *Request) AcceptedSeq() uint64 { return r.acceptedSeq }

// End returns the request's end as the ends place stores it (an
// events.RequestEnded of frontend, through the last sequence folded), and
// false while the request runs.
func (r *Request) End(frontend string) (events.RequestEnded, bool) {
	ev := events.RequestEnded{RequestID: r.Accepted.RequestID, Frontend: frontend, Through: r.lastSeq}
	switch r.Status {
	case StatusFailed:
		if r.Failure == nil {
			return ev, false
		}
		f := *r.Failure
		ev.Failed = &f
	case StatusCancelled:
		c := events.RequestCancelled{RequestID: ev.RequestID, Mode: events.CancelKill}
		if r.Cancel != nil {
			c = *r.Cancel
		}
		ev.Cancelled = &c
	case StatusCompleted:
		k := max(len(r.Attempts)-1, 0)
		ev.Completed = &events.RequestCompleted{RequestID: ev.RequestID, Attempt: k, FinishReason: r.FinishReason,
			PromptTokens: r.EnginePromptTokens, CompletionTokens: r.EngineCompletionTokens}
	default:
		return ev, false
	}
	return ev, true
}
