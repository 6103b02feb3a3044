package streams

import (
	"encoding/json"
	"errors"
)

// Dispatch is the command a frontend sends to a worker over core NATS request
// /reply on Dispatch(workerID): run attempt Attempt of a request, producing tokens
// from StartOffset on. It is a command, not a fact: the facts (routed, tokens,
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
	// (events.RequestAccepted), so that a worker needs no read of the log to
	// build the engine's request.
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
	// MaxPromptTokens, if positive, is the frontend's prompt limit: an engine
	// that learns the prompt's length in its server's tokens (its prompt
	// ids) fails a first attempt over it as a client error (413).
	MaxPromptTokens int    `json:"max_prompt_tokens,omitempty"`
	StartOffset     int    `json:"start_offset"` // tokens already produced
	MaxTokens       int    `json:"max_tokens"`   // total budget, including StartOffset
	Frontend        string `json:"frontend"`
	// DetachTimeoutMS, if positive, is how long the worker keeps generating
	// once the owning frontend is gone (its presence key expired) and no
	// other frontend attached, before it cancels the request.
	DetachTimeoutMS int64 `json:"detach_timeout_ms,omitempty"`
}

// DispatchReply is a worker's answer to a Dispatch.
type DispatchReply struct {
	Accepted bool   `json:"accepted"`
	Reason   string `json:"reason,omitempty"` // why it refused: RefusedBusy, RefusedDraining, ...
}

// Reasons a worker refuses a dispatch.
const (
	RefusedBusy       = "busy"        // at --max-concurrent-requests
	RefusedDraining   = "draining"    // shutting down
	RefusedWrongModel = "wrong_model" // does not serve the model
	RefusedBadRequest = "bad_request" // malformed dispatch
)

// ErrRefused marks a dispatch the worker declined.
var ErrRefused = errors.New("streams: dispatch refused")
