package events

import "encoding/json"

// Dispatch is the one record of a dispatch attempt, from the decision to the
// engine: migrations.Policy builds it (the original prompt, what earlier
// attempts produced, the budget, continuing at StartOffset), the frontend
// sends it as the command to a worker over core NATS request/reply on
// streams.DispatchSubject(workerID), and the worker hands it to its engine
// (engine.Request). It is a command, not a fact: the facts (routed, tokens,
// completed) are in the log. It carries everything the worker needs (the
// request as the client sent it, what earlier attempts produced): a worker
// never reads a request's log.
type Dispatch struct {
	RequestID    string `json:"request_id"`
	Attempt      int    `json:"attempt"`
	Model        string `json:"model"`
	Prompt       string `json:"prompt"`
	PromptTokens int    `json:"prompt_tokens"`
	// Endpoint and Body are the request as the client sent it
	// (RequestAccepted), so that a worker needs no read of the log to
	// build the engine's request. Body nil means a request made of Prompt
	// alone (canaries, old dispatches).
	Endpoint string          `json:"endpoint,omitempty"`
	Body     json.RawMessage `json:"body,omitempty"`
	// PromptIDs are the prompt's token ids as an earlier attempt's engine
	// reported them; GeneratedIDs the ids of the tokens produced so far, when
	// every one is known. Together they let an engine continue token-exactly.
	PromptIDs    []int `json:"prompt_ids,omitempty"`
	GeneratedIDs []int `json:"generated_ids,omitempty"`
	// Generated is the text of the tokens produced by earlier attempts, for an
	// engine that continues from prompt + generated text.
	Generated string `json:"generated,omitempty"`
	// EnginePromptTokens, on a continuation, is the prompt's length as an
	// earlier attempt's engine counted it (its prompt ids or usage), when
	// one did: what a prefill continuation's own prompt_tokens are
	// compared with, plus StartOffset, to tell whether it was exact.
	EnginePromptTokens int `json:"engine_prompt_tokens,omitempty"`
	// ExactOnly, on a continuation, forbids an inexact one (the frontend's
	// --migration-exact-only): the engine continues from token ids or by
	// construction, never by prefill, and fails the attempt otherwise.
	// Older workers ignore it; frontends route such a dispatch only to
	// workers that continue it exactly (migrations.ContinuesExactly).
	ExactOnly bool `json:"exact_only,omitempty"`
	// MaxPromptTokens, if positive, is the frontend's prompt limit: an engine
	// that learns the prompt's length in its server's tokens (its prompt
	// ids) fails a first attempt over it as a client error (413). The
	// frontend sets it when it sends the dispatch.
	MaxPromptTokens int    `json:"max_prompt_tokens,omitempty"`
	StartOffset     int    `json:"start_offset"` // tokens already produced
	MaxTokens       int    `json:"max_tokens"`   // total budget, including StartOffset
	Frontend        string `json:"frontend"`
	// DetachTimeoutMS, if positive, is how long the worker keeps generating
	// once the owning frontend is gone (its presence key expired) and no
	// other frontend attached, before it cancels the request.
	DetachTimeoutMS int64 `json:"detach_timeout_ms,omitempty"`
	// Hold, when set, means the frontend sent the dispatch before the log
	// acknowledged its routed decision (so that the engine starts one
	// acknowledgement sooner): the worker runs the engine but stores
	// nothing of the attempt, no token and no end, until it knows the
	// decision is stored: a streams.CommandRouted, a cancel, or a check
	// that names it the attempt's worker. Hold is unique to the dispatch:
	// a fence that names it (streams.Command.Hold) ends the job this
	// dispatch started with nothing stored, and no other job of the same
	// attempt (a duplicate dispatch is accepted without a new job).
	// Frontends set it only for workers whose lease says they hold
	// (Lease.HoldsUntilRouted).
	Hold string `json:"hold,omitempty"`
	// Output, when OutputBatched, asks a worker whose lease says
	// WritesBatched to write the attempt's output (its deltas and its end)
	// in batches to its own output stream (streams.WorkerOutput(worker,
	// Frontend)) instead of per-token messages on the request's partition.
	// Any other value, or a worker without its stream, writes per token as
	// before. No frontend sets it yet (docs/internals.md, issue 33's write
	// path); older workers ignore it.
	Output string `json:"output,omitempty"`
}

// OutputBatched is Dispatch.Output for an attempt written in batches.
const OutputBatched = "batched"
