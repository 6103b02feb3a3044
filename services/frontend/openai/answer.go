package openai

import (
	"encoding/json"
	"net/http"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

// Choice is what the answer of one choice is made of: a request's tokens,
// what the engine said about them, and how it ended.
type Choice struct {
	Tokens       []string          // from the client's offset on
	Details      []json.RawMessage // the tokens' details (nil: none)
	FinishReason string
	Total        int // tokens generated in all
	PromptTokens int // the engine's count when it reported one
	// Usage is the answer's length for its usage: the servers' counts when
	// they reported them (projections.Request.CompletionTokens), 0: Total.
	Usage int
	// Exact is whether the choice's continuations were exact
	// (projections.Request.Exact), nil when none ran (ExactOf).
	Exact *bool
}

// MarkField is the name of baton's own field in an answer, a stream's
// final chunk and a response object: OpenAI's SDKs keep fields they do
// not know (they drop SSE comments), and a name of baton's own cannot
// collide with a field OpenAI adds.
const MarkField = "baton"

// Mark is the value of MarkField for a request whose continuations were
// exact or not (exact), and nil (no field) when no continuation ran: an
// answer that did not migrate is the engine's own and carries nothing.
func Mark(exact *bool) map[string]any {
	if exact == nil {
		return nil
	}
	return map[string]any{"exact": *exact}
}

// ExactOf is p's verdict as Choice.Exact and Mark take it: nil when no
// continuation contributed to its answer.
func ExactOf(p *projections.Request) *bool {
	if !p.Continued() {
		return nil
	}
	exact := p.Exact()
	return &exact
}

// MarkOf is the mark of choices: exact when every choice that continued
// was; nil when none did.
func MarkOf(choices []Choice) map[string]any {
	var all *bool
	for _, c := range choices {
		if c.Exact == nil {
			continue
		}
		v := *c.Exact && (all == nil || *all)
		all = &v
	}
	return Mark(all)
}

// UsageTokens is the choice's length for its usage: the engine's count
// when it reported one, else the tokens produced.
func (c Choice) UsageTokens() int {
	if c.Usage > 0 {
		return c.Usage
	}
	return c.Total
}

// Response is request p's answer as its client gets it from a frontend,
// rendered from its projection alone, for every endpoint, so that a
// frontend and tools such as baton replay say the same:
//   - a response (events.EndpointResponses): its response object as it
//     stands, whatever its status, as GET /v1/responses/{id} answers it,
//     named public: the id its reader knows it by ("": its client's own);
//   - a chat or text completion: the non-streaming answer of a completed
//     request of one choice (chat.completion or text_completion), named by
//     its client's id whatever public says.
func Response(p *projections.Request, public string) map[string]any {
	acc := p.Accepted
	if acc.Endpoint == events.EndpointResponses {
		if public == "" {
			public = openaiID(acc)
		}
		obj, _ := renderResponse(public, p, nil)
		return obj
	}
	acc.Model = p.ResponseModel()
	return Answer(acc, []Choice{{
		Tokens: p.Tokens(0), Details: p.Details(0), FinishReason: p.FinishReason, Total: p.Len(), PromptTokens: p.PromptTokens(),
		Usage: p.CompletionTokens(), Exact: ExactOf(p),
	}})
}

// Answer is the non-streaming response of acc with one choice per entry of
// choices. acc.Model is the model the answer names (the upstream's, see
// projections.Request.ResponseModel).
func Answer(acc events.RequestAccepted, choices []Choice) map[string]any {
	list := make([]map[string]any, 0, len(choices))
	completion, prompt := 0, acc.PromptTokens
	for i, s := range choices {
		if i == 0 && s.PromptTokens > 0 {
			prompt = s.PromptTokens // the engine's count
		}
		completion += s.UsageTokens()
		list = append(list, merge(s.Tokens, s.Details).answerChoice(acc.Endpoint, i, s.FinishReason))
	}
	usage := map[string]any{
		"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
	}
	answer := map[string]any{
		"id": "cmpl-" + openaiID(acc), "object": "text_completion", "created": acc.Created, "model": acc.Model,
		"choices": list, "usage": usage,
	}
	if acc.Endpoint == events.EndpointChat {
		answer["id"], answer["object"] = "chatcmpl-"+openaiID(acc), "chat.completion"
	}
	if mark := MarkOf(choices); mark != nil {
		answer[MarkField] = mark
	}
	return answer
}

// FailureBody is the HTTP status and OpenAI error body of failure f.
func FailureBody(f *events.RequestFailed) (int, map[string]any) {
	status := f.Status
	if status == 0 {
		status = http.StatusInternalServerError
	}
	typ := "server_error"
	switch {
	case status == http.StatusServiceUnavailable:
		typ = "service_unavailable"
	case status >= 400 && status < 500:
		typ = "invalid_request_error"
	}
	return status, ErrorBody(typ, f.Code, f.Message)
}

// ErrorBody is OpenAI's error object: {"message","type","code"}.
func ErrorBody(typ, code, message string) map[string]any {
	return map[string]any{"message": message, "type": typ, "code": code}
}

// WriteError answers with status and {"error": ErrorBody(typ, code,
// message)} as JSON.
func WriteError(w http.ResponseWriter, status int, typ, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": ErrorBody(typ, code, message)})
}
