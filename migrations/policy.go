package migrations

import (
	"errors"
	"strings"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

// Reasons a request may not migrate.
var (
	ErrDisabled          = errors.New("migrations: migration is disabled (--migration-limit 0)")
	ErrLimitExhausted    = errors.New("migrations: migration limit exhausted")
	ErrMaxSeqLenExceeded = errors.New("migrations: sequence length exceeds --migration-max-seq-len")
	ErrPinned            = errors.New("migrations: request is pinned to a worker (X-Worker-Id)")
)

// Policy is how one frontend decides for the requests it owns. It mirrors
// Dynamo: Limit re-dispatches per request, shared by both migration types
// (0 disables); MaxSeqLen, when set, disables migration once prompt +
// generated tokens strictly exceed it (exactly at the limit still migrates).
type Policy struct {
	Limit     int
	MaxSeqLen int // 0: unset
	// Frontend is the deciding frontend's id: it acts only on requests it owns.
	Frontend string
	// StallTimeout: an attempt that produces nothing for this long failed.
	StallTimeout time.Duration
	// DetachTimeout: a request without clients for this long is cancelled.
	DetachTimeout time.Duration
	// ExactOnly (--migration-exact-only): a continuation goes only to a
	// worker that continues it exactly by construction (ContinuesExactly);
	// with none, the request fails as one no worker can continue.
	ExactOnly bool
}

// SeqLen is a request's prompt plus generated tokens, the prompt counted by
// the engine when it reported its count.
func SeqLen(r *projections.Request) int { return r.PromptTokens() + r.Len() }

// ExceedsMaxSeqLen reports whether r is past the max-seq-len limit.
func (p Policy) ExceedsMaxSeqLen(r *projections.Request) bool {
	return p.MaxSeqLen > 0 && SeqLen(r) > p.MaxSeqLen
}

// Allow returns nil if r may migrate once more, or the reason it may not.
func (p Policy) Allow(r *projections.Request) error {
	switch {
	case r.Accepted.PinnedWorker != "":
		return ErrPinned
	case p.Limit <= 0:
		return ErrDisabled
	case len(r.Migrations) >= p.Limit:
		return ErrLimitExhausted
	case p.ExceedsMaxSeqLen(r):
		return ErrMaxSeqLenExceeded
	}
	return nil
}

// FailureCode is the RequestFailed code of a request that may not migrate
// because of err (one of this package's sentinels).
func FailureCode(err error) string {
	switch {
	case errors.Is(err, ErrDisabled):
		return "migration_disabled"
	case errors.Is(err, ErrLimitExhausted):
		return "migration_exhausted"
	case errors.Is(err, ErrMaxSeqLenExceeded):
		return "migration_max_seq_len_exceeded"
	case errors.Is(err, ErrPinned):
		return "pinned_worker_failed"
	}
	return "worker_failed"
}

// Continuation builds the dispatch of the next attempt of r: the original
// prompt, the text generated so far, and the remaining budget, continuing at
// the current token offset.
//
// It carries the client's request body (or its rendering for engines,
// RequestAccepted.EngineBody), and the prompt's token ids and the
// generated tokens' ids when every one is known, so that an engine that
// takes token ids continues token-exactly.
func Continuation(r *projections.Request, attempt int, frontend string) events.Dispatch {
	d := events.Dispatch{
		RequestID:    r.Accepted.RequestID,
		Attempt:      attempt,
		Model:        r.Accepted.Model,
		Prompt:       r.Accepted.Prompt,
		PromptTokens: r.Accepted.PromptTokens,
		Endpoint:     r.Accepted.Endpoint,
		Body:         r.Accepted.Body,
		Generated:    strings.Join(r.Tokens(0), ""),
		StartOffset:  r.Len(),
		MaxTokens:    r.Accepted.MaxTokens,
		Frontend:     frontend,
	}
	if r.Accepted.EngineBody != nil {
		d.Endpoint, d.Body = r.Accepted.EngineEndpoint, r.Accepted.EngineBody
	}
	if ids, ok := r.TokenIDs(); ok && r.PromptIDs != nil && r.Len() > 0 {
		d.PromptIDs, d.GeneratedIDs = r.PromptIDs, ids
	}
	switch {
	case r.Len() == 0:
	case r.EnginePromptTokens > 0:
		d.EnginePromptTokens = r.EnginePromptTokens
	case r.PromptIDs != nil:
		d.EnginePromptTokens = len(r.PromptIDs)
	}
	return d
}

// ContinuesExactly reports whether worker w continues dispatch d (a
// continuation) exactly by construction: from the prompt's and the
// generated tokens' ids, which d carries and w's engine takes, or on an
// engine that announces no capabilities (the mock, whose token i is a
// function of the prompt and i alone). Prefill never is: a server that
// re-tokenizes the text so far (as Ollama does) may continue another
// sequence of tokens than the one it generated, and only its usage,
// after the fact, can tell (RequestCompleted.Exact).
func ContinuesExactly(w projections.Worker, d events.Dispatch) bool {
	c := w.Capabilities
	if c == nil {
		return true
	}
	return c.TokenIDs && c.Completions && len(d.PromptIDs) > 0 && len(d.GeneratedIDs) == d.StartOffset
}
