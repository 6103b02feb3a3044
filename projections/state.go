package projections

import (
	"slices"

	"github.com/baton-dev/baton/events"
)

// State is a request's state as people and tools see it (the JSON of
// GET /v1/requests/{id} and of baton replay --json). It is a copy: it shares
// nothing with the projection.
type State struct {
	ID              string                   `json:"id"`
	Object          string                   `json:"object"`
	Status          string                   `json:"status"`
	Model           string                   `json:"model"`
	Endpoint        string                   `json:"endpoint"`
	Created         int64                    `json:"created"`
	Worker          string                   `json:"worker,omitempty"` // of the current attempt
	Owner           string                   `json:"owner"`
	PromptTokens    int                      `json:"prompt_tokens"` // the engine's count once reported
	MaxTokens       int                      `json:"max_tokens"`
	TokensGenerated int                      `json:"tokens_generated"`
	FinishReason    string                   `json:"finish_reason,omitempty"`
	Attempts        []Attempt                `json:"attempts"`
	Migrations      []Migration              `json:"migrations"`
	ParentID        string                   `json:"parent_id,omitempty"`
	Choices         int                      `json:"choices,omitempty"`
	Children        []string                 `json:"children,omitempty"`
	Cancel          *events.RequestCancelled `json:"cancel,omitempty"`
	Failure         *events.RequestFailed    `json:"failure,omitempty"`
	SkippedDeltas   int                      `json:"skipped_deltas,omitempty"`
	// Exact is false when some continuation of the request was
	// approximate, or not shown exact yet (Request.Exact).
	Exact bool `json:"exact"`
	// CompletionTokens is the answer's length as its usage says once it
	// completed (Request.CompletionTokens: the servers' counts where they
	// gave them, which can exceed the tokens streamed); 0 before.
	CompletionTokens int `json:"completion_tokens,omitempty"`
}

// State returns a copy of the request's state.
func (r *Request) State() State {
	s := State{
		ID: r.Accepted.RequestID, Object: "request", Status: string(r.Status), Model: r.Accepted.Model,
		Endpoint: r.Accepted.Endpoint, Created: r.Accepted.Created, Owner: r.Owner,
		PromptTokens: r.PromptTokens(), MaxTokens: r.Accepted.MaxTokens, TokensGenerated: r.Len(),
		FinishReason: r.FinishReason, Attempts: append([]Attempt{}, r.Attempts...),
		Migrations: append([]Migration{}, r.Migrations...), ParentID: r.Accepted.ParentID,
		Choices: r.Accepted.Choices, Children: slices.Clone(r.Children), SkippedDeltas: r.Skipped,
		Exact: r.Exact(),
	}
	if r.Status == StatusCompleted {
		s.CompletionTokens = r.CompletionTokens()
	}
	if c, ok := r.Current(); ok {
		s.Worker = c.WorkerID
	}
	if r.Cancel != nil {
		c := *r.Cancel
		s.Cancel = &c
	}
	if r.Failure != nil {
		f := *r.Failure
		s.Failure = &f
	}
	return s
}
