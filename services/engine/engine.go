package engine

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
)

// ErrFatal marks an engine that can no longer serve anything: its worker
// shuts down gracefully and the process exits 1.
var ErrFatal = errors.New("engine: fatal error")

// Endpoints of a request, as in events.EndpointChat and
// events.EndpointCompletions.
const (
	EndpointChat        = "chat_completions"
	EndpointCompletions = "completions"
)

// Request is one generation to run: the dispatch of one attempt, as the
// frontend sent it (events.Dispatch, the one record from the migration
// decision to the engine). An engine runs the tokens at offsets
// [StartOffset, MaxTokens) of the request's output; StartOffset > 0 means a
// continuation after a migration: Generated holds the text produced so far
// and, when every earlier token's id is known, GeneratedIDs their ids, with
// the prompt's ids in PromptIDs. Body is the client's request as it sent it
// (of Endpoint, EndpointChat or EndpointCompletions; "" is completions);
// nil means a request made of Prompt alone (canaries, old dispatches).
// MaxPromptTokens, if positive, bounds the prompt in the server's own
// tokens: an engine that learns that count (its prompt ids) fails a first
// attempt over it with a client-class *UpstreamError (413). An engine
// ignores the routing fields (Attempt, Model, Frontend, DetachTimeoutMS).
type Request = events.Dispatch

// Continuation modes an engine can offer for a request that migrated.
const (
	// ContinueTokenIDs: prompt ids plus generated ids, token-exact.
	ContinueTokenIDs = "token_ids"
	// ContinuePrefill: the text so far as assistant prefill (chat) or
	// appended to the prompt (completions).
	ContinuePrefill = "prefill"
)

// Continuer is an engine that can say, before it runs a continuation,
// how it will continue it (ContinueTokenIDs or ContinuePrefill). An engine
// that is not a Continuer continues exactly by construction: the mock,
// whose token i is a function of the prompt and i alone.
type Continuer interface {
	ContinuesWith(req Request) string
}

// Token is one token of output as the engine produced it. ID is its id in
// the engine's vocabulary when HasID; Details, when set, is what the
// engine said about it beyond the text (tool-call deltas, logprobs,
// reasoning), as JSON that a response can carry back verbatim.
type Token struct {
	Text    string
	ID      int
	HasID   bool
	Details json.RawMessage
	// PromptIDs, on the first token of a generation only, are the prompt's
	// token ids when the engine reports them.
	PromptIDs []int
	// Model, on the first token of a generation only, is the model the
	// engine's server named in its answer, when it named one.
	Model string
}

// Result is how a generation ended.
type Result struct {
	FinishReason string
	// PromptTokens and CompletionTokens are the engine's own counts when it
	// reported them (0: not reported).
	PromptTokens     int
	CompletionTokens int
}

// Finish reasons.
const (
	FinishLength = "length"
	FinishStop   = "stop"
)

// Stats is an engine's load, published by its worker, and its count of
// aborted generations, which the worker's status server shows.
type Stats struct {
	ActiveRequests      int
	KVBlocksUsed        int
	KVBlocksTotal       int
	QueuedPrefillTokens int
	// Aborted counts the generations that ended because their ctx was done
	// (a cancel, a client gone, a fence, a hand-off) since the engine was
	// made; LastAbort is when the latest of them let go of the engine.
	Aborted   int64
	LastAbort time.Time
}

// aborts counts aborted generations for an engine's Stats. It is safe for
// concurrent use.
type aborts struct {
	mu   sync.Mutex
	n    int64
	last time.Time
}

// record counts the end of a generation whose ctx is ctx and whose error is
// err: an abort when it failed because ctx was done.
func (a *aborts) record(ctx context.Context, err error) {
	if err == nil || ctx.Err() == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n++
	a.last = time.Now()
}

func (a *aborts) read() (int64, time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n, a.last
}

// Engine generates tokens. Implementations are safe for concurrent use.
type Engine interface {
	// Generate produces the tokens of req in order, calling emit once per
	// token, until MaxTokens, a stop, or ctx is done. It returns how the
	// generation ended, or an error: ctx's error when cancelled, ErrFatal
	// (wrapped) when the engine can no longer serve anything, an
	// *UpstreamError when a server behind the engine failed.
	Generate(ctx context.Context, req Request, emit func(Token) error) (Result, error)
	// Stats reports the current load.
	Stats() Stats
}

// canaryKey marks the context of a worker's health-check request.
type canaryKey struct{}

// WithCanary marks ctx as a worker's own health check (a canary), not a
// client's request: an engine may serve it as any other, but the mock's
// scripted faults that count requests or tokens do not count it.
func WithCanary(ctx context.Context) context.Context {
	return context.WithValue(ctx, canaryKey{}, true)
}

// IsCanary reports whether ctx is a canary's (WithCanary).
func IsCanary(ctx context.Context) bool {
	v, _ := ctx.Value(canaryKey{}).(bool)
	return v
}

// Capabilities is what an engine can do, as its worker advertises it.
type Capabilities = events.Capabilities

// Prober is an engine that can find out its capabilities (by asking the
// server behind it). Engines that are not Probers can do everything.
type Prober interface {
	Probe(ctx context.Context) (Capabilities, error)
}
