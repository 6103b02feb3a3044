package events

import (
	"encoding/json"
	"fmt"
)

// Request event types. Lifecycle decisions live on a request's events subject;
// what a worker produces for dispatch attempt k lives on its tokens subject k.
const (
	TypeRequestAccepted  = "baton.request.accepted.v1"
	TypeRequestRouted    = "baton.request.routed.v1"
	TypeTokensGenerated  = "baton.request.tokens.v1"
	TypeRequestCompleted = "baton.request.completed.v1"
	TypeAttemptFailed    = "baton.request.attempt_failed.v1"
	TypeRequestMigrated  = "baton.request.migrated.v1"
	TypeRequestFailed    = "baton.request.failed.v1"
	TypeRequestAttached  = "baton.request.attached.v1"
	TypeRequestCancelled = "baton.request.cancelled.v1"
	TypeChildAdded       = "baton.request.child_added.v1"
	TypeAttemptFenced    = "baton.request.attempt_fenced.v1"
)

// RequestEvent is an event of a request's history. Every request event type
// implements it; Request is its RequestID, the request the event is about
// (for ChildAdded, the parent).
type RequestEvent interface {
	Event
	Request() string
}

// Endpoints a request can arrive on.
const (
	EndpointChat        = "chat_completions"
	EndpointCompletions = "completions"
)

// Message is one chat message of a request.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// RequestAccepted records a request the frontend took on: everything needed to
// run it again from scratch, so the log alone can rebuild and resume it.
type RequestAccepted struct {
	RequestID    string    `json:"request_id"`
	Model        string    `json:"model"`
	Endpoint     string    `json:"endpoint"`
	Messages     []Message `json:"messages,omitempty"` // chat only; builds that record Body leave it out
	Prompt       string    `json:"prompt"`             // the text the engine sees
	PromptTokens int       `json:"prompt_tokens"`
	MaxTokens    int       `json:"max_tokens"`
	Stream       bool      `json:"stream"`
	IncludeUsage bool      `json:"include_usage,omitempty"`
	Created      int64     `json:"created"` // unix seconds, the OpenAI "created" field
	Frontend     string    `json:"frontend"`
	ParentID     string    `json:"parent_id,omitempty"`
	PinnedWorker string    `json:"pinned_worker,omitempty"`
	Resumable    bool      `json:"resumable,omitempty"`
	// Choices > 1 marks a parent of n choices: it is not dispatched itself;
	// each choice runs as a child request.
	Choices int `json:"choices,omitempty"`
	// Body is the client's request body as sent (at most --max-body-bytes),
	// every field included: engines build the upstream request from it.
	// Absent in events of older builds.
	Body json.RawMessage `json:"body,omitempty"`
	// Tenant is the API key's tenant that sent the request; empty when the
	// API has no keys. Only it (and the tenant "admin") may see the request.
	Tenant string `json:"tenant,omitempty"`
	// BodySHA256 is the hex SHA-256 of the request body as the client sent
	// it: a re-POST under the same id must send the same body.
	BodySHA256 string `json:"body_sha256,omitempty"`
	// EngineEndpoint and EngineBody, when EngineBody is set, are what
	// engines are sent instead of Endpoint and Body: the request rendered
	// on an endpoint engines serve. A response (EndpointResponses) goes to
	// chat, its input items as messages and the turns of its previous
	// responses resolved from the log when it was accepted.
	EngineEndpoint string          `json:"engine_endpoint,omitempty"`
	EngineBody     json.RawMessage `json:"engine_body,omitempty"`
	// Background marks a request that runs with no client attached (a
	// background response): it is not cancelled when no client follows it.
	Background bool `json:"background,omitempty"`
	// ClientModel: answers name the model as the client did (Model), not
	// as the upstream server that produced them did (the frontend's
	// --response-model client). Recorded here so that every rendering of
	// the request, on any frontend, says the same.
	ClientModel bool `json:"client_model,omitempty"`
	// Route, when set, is the routed decision of attempt 0, stored with
	// the acceptance rather than after it: the first dispatch left with
	// the accepted event's append (it is held), and its worker may store
	// output one acknowledgement sooner. Readers fold it as the
	// RequestRouted it is. A frontend writes it only while every live
	// frontend says FrontendPresence.ReadsAcceptedRoute: an earlier
	// release would see attempt 0 unrouted and ignore its output.
	Route *RequestRouted `json:"route,omitempty"`
}

func (RequestAccepted) EventType() string { return TypeRequestAccepted }
func (e RequestAccepted) Request() string { return e.RequestID }

func (e *RequestAccepted) validate() error {
	if e.RequestID == "" || e.Model == "" {
		return fmt.Errorf("missing request_id or model")
	}
	if e.MaxTokens < 0 || e.PromptTokens < 0 {
		return fmt.Errorf("negative token count")
	}
	if r := e.Route; r != nil && (r.RequestID != e.RequestID || r.Attempt != 0 || r.StartOffset != 0 || r.WorkerID == "") {
		return fmt.Errorf("route: not attempt 0 of this request from token 0 to a worker")
	}
	return nil
}

// RequestRouted records that dispatch attempt Attempt went to WorkerID and
// starts producing at token offset StartOffset.
type RequestRouted struct {
	RequestID   string `json:"request_id"`
	Attempt     int    `json:"attempt"`
	WorkerID    string `json:"worker_id"`
	StartOffset int    `json:"start_offset"`
	// Output is the dispatch's Output: OutputBatched when the attempt's
	// worker writes it in batches to its own output stream, on the subject
	// streams.WorkerOutput(WorkerID, OutputTo), rather than per token on
	// the request's partition. Absent: per token. Older readers ignore it,
	// which is why a frontend asks for batches only while every live
	// frontend reads them (FrontendPresence.ReadsBatched).
	Output string `json:"output,omitempty"`
	// OutputTo is the frontend the worker sends the attempt's batches to
	// (the dispatch's Frontend), with Output.
	OutputTo string `json:"output_to,omitempty"`
}

func (RequestRouted) EventType() string { return TypeRequestRouted }
func (e RequestRouted) Request() string { return e.RequestID }

func (e *RequestRouted) validate() error {
	if e.Attempt < 0 || e.StartOffset < 0 || e.WorkerID == "" {
		return fmt.Errorf("bad attempt, offset or worker")
	}
	if e.Output == OutputBatched && e.OutputTo == "" {
		return fmt.Errorf("batched output without output_to")
	}
	return nil
}

// TokensGenerated is a delta: the tokens of attempt Attempt starting at
// absolute token offset Offset. Deltas coalesce several tokens.
type TokensGenerated struct {
	RequestID string   `json:"request_id"`
	Attempt   int      `json:"attempt"`
	Offset    int      `json:"offset"`
	Tokens    []string `json:"tokens"`
	// IDs are the tokens' ids in the engine's vocabulary, one per token,
	// when the engine reported every one of them.
	IDs []int `json:"ids,omitempty"`
	// Details, when present, has one entry per token: what the engine said
	// about it beyond its text (tool-call deltas, logprobs, reasoning), as
	// the JSON of engine.Details, or null.
	Details []json.RawMessage `json:"details,omitempty"`
	// PromptIDs, on an attempt's first delta, are the prompt's token ids
	// as the engine reported them.
	PromptIDs []int `json:"prompt_ids,omitempty"`
	// Model, on an attempt's first delta, is the model the engine's server
	// named in its answer (the "model" of its chunks), when it named one.
	Model string `json:"model,omitempty"`
	// Exact, on a continuation's first delta (an attempt with a start
	// offset > 0), is the worker's verdict when it is known before the
	// engine answers: true for a continuation from token ids, or on an
	// engine that continues exactly by construction (the mock). Absent:
	// not known yet (prefill: see RequestCompleted.Exact), or an older
	// worker.
	Exact *bool `json:"exact,omitempty"`
}

func (TokensGenerated) EventType() string { return TypeTokensGenerated }
func (e TokensGenerated) Request() string { return e.RequestID }

func (e *TokensGenerated) validate() error {
	if e.Attempt < 0 || e.Offset < 0 {
		return fmt.Errorf("negative attempt or offset")
	}
	if (e.IDs != nil && len(e.IDs) != len(e.Tokens)) || (e.Details != nil && len(e.Details) != len(e.Tokens)) {
		return fmt.Errorf("ids or details do not match the tokens")
	}
	return nil
}

// RequestCompleted records that attempt Attempt finished generating; the
// request's output is Total tokens long.
type RequestCompleted struct {
	RequestID        string `json:"request_id"`
	Attempt          int    `json:"attempt"`
	FinishReason     string `json:"finish_reason"`
	PromptTokens     int    `json:"prompt_tokens"`
	CompletionTokens int    `json:"completion_tokens"`
	// Exact, on a continuation (an attempt with a start offset > 0), is
	// whether it continued exactly the answer so far: from token ids, or
	// by prefill that the engine's own usage shows it took token for token
	// (docs/fault-tolerance.md, "Exact and approximate continuations").
	// Absent on a first attempt, and from older workers.
	Exact *bool `json:"exact,omitempty"`
	// Offset is the request's token offset at the attempt's end: the
	// worker stored every token before it ahead of this event, so a
	// reader that has folded fewer missed some, and must not end the
	// request on them (projections.Request folds it as a gap). Absent
	// from older workers, and from an attempt that produced nothing at
	// offset 0.
	Offset int `json:"offset,omitempty"`
}

func (RequestCompleted) EventType() string { return TypeRequestCompleted }
func (e RequestCompleted) Request() string { return e.RequestID }

func (e *RequestCompleted) validate() error {
	if e.Attempt < 0 || e.CompletionTokens < 0 || e.Offset < 0 {
		return fmt.Errorf("negative attempt, token count or offset")
	}
	return nil
}

// AttemptFailed records that the worker of attempt Attempt could not go on
// (engine error, hand-off at shutdown). It is a worker's report, not a decision:
// the owning frontend decides whether to migrate.
type AttemptFailed struct {
	RequestID string `json:"request_id"`
	Attempt   int    `json:"attempt"`
	WorkerID  string `json:"worker_id"`
	Offset    int    `json:"offset"` // tokens produced when it stopped
	Reason    string `json:"reason"`
	// Class says what kind of failure the worker saw. Empty: the worker or
	// its engine failed (migrate as ongoing_request, inhibit the worker).
	Class string `json:"class,omitempty"`
	// Status, Code and Message are the upstream engine's HTTP status, error
	// code and message, when it answered with an error.
	Status  int    `json:"status,omitempty"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
	// RetryAfterMS is the upstream's Retry-After, when it sent one.
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
}

func (AttemptFailed) EventType() string { return TypeAttemptFailed }
func (e AttemptFailed) Request() string { return e.RequestID }

// Failure classes of AttemptFailed.Class.
const (
	// FailureClient: the upstream rejected the request itself (400, 413,
	// 422: invalid, context too long, content policy). The request fails
	// with the upstream's Status, Code and Message; no migration, no
	// inhibition, the worker stays ready.
	FailureClient = "client_error"
	// FailureUnavailable: the upstream is overloaded (429, 503). The request
	// migrates as new_request; the worker is inhibited for RetryAfterMS when
	// set, else the default inhibition.
	FailureUnavailable = "upstream_unavailable"
	// FailureNotReady: the upstream cannot serve at all (401, 403, 404
	// model). The worker turns not ready; the request migrates as new_request.
	FailureNotReady = "worker_not_ready"
	// FailureLogFull: the request log refused the attempt's tokens at its
	// limits, so the worker stopped. The request fails with log_full (503);
	// no migration, no inhibition: the worker is healthy. A frontend of a
	// release before this class takes it for a worker failure.
	FailureLogFull = "log_full"
)

// CodeEmptyAnswer is the AttemptFailed.Code of an upstream server that
// answered 200 and then ended its stream before any token, with neither a
// finish reason nor [DONE] (Ollama's answer, streamed, to an invalid JSON
// schema): an answer, like an error status, so possibly the request's own.
const CodeEmptyAnswer = "upstream_empty_answer"

// AttemptFenced is a frontend's fence of attempt Attempt, stored among its
// worker's output (an entry of a batch on the worker's subject, so that it
// is ordered with the worker's batches): a reader accepts nothing of the
// attempt stored after it. Issue 33's design (docs/internals.md) closes an
// attempt this way; nothing writes it yet.
type AttemptFenced struct {
	RequestID string `json:"request_id"`
	Attempt   int    `json:"attempt"`
	Frontend  string `json:"frontend"`
}

func (AttemptFenced) EventType() string { return TypeAttemptFenced }
func (e AttemptFenced) Request() string { return e.RequestID }

func (e *AttemptFenced) validate() error {
	if e.RequestID == "" || e.Attempt < 0 {
		return fmt.Errorf("missing request_id or negative attempt")
	}
	return nil
}

// Migration types, as in Dynamo's dynamo_frontend_model_migration_total.
const (
	MigrationNewRequest     = "new_request"
	MigrationOngoingRequest = "ongoing_request"
)

// RequestMigrated records the decision to abandon attempt FromAttempt at token
// offset Cut and continue as attempt FromAttempt+1. Tokens of FromAttempt at or
// past Cut are never read (fencing).
type RequestMigrated struct {
	RequestID     string `json:"request_id"`
	FromAttempt   int    `json:"from_attempt"`
	FromWorker    string `json:"from_worker"`
	Cut           int    `json:"cut"`
	MigrationType string `json:"migration_type"`
	Reason        string `json:"reason"`
	Frontend      string `json:"frontend"`
}

func (RequestMigrated) EventType() string { return TypeRequestMigrated }
func (e RequestMigrated) Request() string { return e.RequestID }

// RequestFailed records the terminal failure of a request: no further tokens
// will be accepted for it.
type RequestFailed struct {
	RequestID string `json:"request_id"`
	Code      string `json:"code"`    // machine-readable cause, e.g. "migration_exhausted"
	Message   string `json:"message"` // for people
	Status    int    `json:"status"`  // HTTP status a non-streaming client gets
	Offset    int    `json:"offset"`  // tokens delivered before the failure
}

func (RequestFailed) EventType() string { return TypeRequestFailed }
func (e RequestFailed) Request() string { return e.RequestID }

// RequestAttached records that Frontend took ownership of the request: it
// serves a client and makes the request's migration decisions.
type RequestAttached struct {
	RequestID string `json:"request_id"`
	Frontend  string `json:"frontend"`
	Offset    int    `json:"offset"` // the client's resume point
}

func (RequestAttached) EventType() string { return TypeRequestAttached }
func (e RequestAttached) Request() string { return e.RequestID }

// Cancellation modes.
const (
	CancelStop = "stop"
	CancelKill = "kill"
)

// RequestCancelled records a cancel command: stop ends at the next token
// boundary, kill aborts at once.
type RequestCancelled struct {
	RequestID string `json:"request_id"`
	Mode      string `json:"mode"`
	Reason    string `json:"reason"`
	// Tenant is the API tenant that asked for the cancel; empty for the
	// frontend's own cancels (client gone, detached, parent cancelled) and
	// when the API has no keys.
	Tenant string `json:"tenant,omitempty"`
}

func (RequestCancelled) EventType() string { return TypeRequestCancelled }
func (e RequestCancelled) Request() string { return e.RequestID }

// ChildAdded records that request ChildID was started as a child of
// RequestID (a choice of n > 1, or a request sent with X-Parent-Request-Id),
// so that cancelling RequestID cancels ChildID too.
type ChildAdded struct {
	RequestID string `json:"request_id"`
	ChildID   string `json:"child_id"`
}

func (ChildAdded) EventType() string { return TypeChildAdded }
func (e ChildAdded) Request() string { return e.RequestID }

func init() {
	register[ChildAdded]()
	register[RequestAccepted]()
	register[RequestRouted]()
	register[TokensGenerated]()
	register[RequestCompleted]()
	register[AttemptFailed]()
	register[AttemptFenced]()
	register[RequestMigrated]()
	register[RequestFailed]()
	register[RequestAttached]()
	register[RequestCancelled]()
}

// AttemptOutput reports whether ev is what an attempt produces (a delta, its
// completion, its failure), stored on the attempt's tokens subject, and
// which attempt: every other event of a request is a decision.
func AttemptOutput(ev Event) (attempt int, ok bool) {
	switch ev := ev.(type) {
	case TokensGenerated:
		return ev.Attempt, true
	case RequestCompleted:
		return ev.Attempt, true
	case AttemptFailed:
		return ev.Attempt, true
	}
	return 0, false
}
