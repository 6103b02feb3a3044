// Confinement: which subject an event may be folded from, and how much one
// message of an attempt may hold (AttemptBound).

package projections

import (
	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
)

// misplaced says why e may not be applied from the subject it is stored on,
// or "" if it may: an attempt's output only from the tokens subject of that
// attempt and of the worker its routed event names, everything else only
// from the events subject. Who may write a subject is what NATS permissions
// enforce (a worker writes only the tokens subjects that name it), so this
// is the rule that confines a worker to its own attempts: every reader,
// live or replaying, ignores the rest alike. An envelope with no stored
// subject was built in this process and is trusted.
func (r *Request) misplaced(e events.Envelope) string {
	if e.Stored == "" {
		return ""
	}
	if e.Stored != r.subject {
		s, err := streams.ParseRequestSubject(e.Stored)
		if err != nil {
			return IgnoredWrongSubject
		}
		r.subject, r.parsed = e.Stored, s
	}
	s := r.parsed
	if r.Known() && s.ID != r.Accepted.RequestID {
		return IgnoredWrongSubject
	}
	k, output := events.AttemptOutput(e.Event)
	switch {
	case output != (s.Kind == "tokens"), output && s.Attempt != k:
		return IgnoredWrongSubject
	case output && k >= 0 && k < len(r.Attempts) && s.Worker != r.Attempts[k].WorkerID:
		return IgnoredNotRouted
	}
	return ""
}

// What one message of an attempt may hold (AttemptBound): AttemptFixedBytes,
// plus MaxTokenBytes for each token the request may generate (its
// max_tokens: the text, the id and the engine's details, logprobs and
// tool-call deltas, of each), plus PromptIDBytes for each token of its
// prompt (an attempt's first delta carries the prompt's token ids). An
// honest worker's deltas are far within, whatever it coalesces into one.
const (
	AttemptFixedBytes = 64 << 10
	MaxTokenBytes     = 4 << 10
	PromptIDBytes     = 16
	// attemptDefaultMax stands for the max_tokens of a request that
	// recorded none.
	attemptDefaultMax = 1 << 12
)

// AttemptBound is the most bytes one message of an attempt of a request
// accepted as acc may hold. The fold ignores a delta whose tokens' text and
// details come to more (IgnoredOversize); the junk guard takes a message
// of more on a worker's own attempt for junk, and quarantines the worker.
func AttemptBound(acc events.RequestAccepted) int {
	maxTokens := acc.MaxTokens
	if maxTokens <= 0 {
		maxTokens = attemptDefaultMax
	}
	return AttemptFixedBytes + maxTokens*MaxTokenBytes + max(acc.PromptTokens, 0)*PromptIDBytes
}

// deltaWeight is what a delta's tokens' text and details come to, in bytes:
// less than its message's size.
func deltaWeight(ev events.TokensGenerated) int {
	n := 0
	for _, t := range ev.Tokens {
		n += len(t)
	}
	for _, d := range ev.Details {
		n += len(d)
	}
	return n
}
