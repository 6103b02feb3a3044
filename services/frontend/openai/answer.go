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
		Usage: p.CompletionTokens(),
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
	if acc.Endpoint == events.EndpointChat {
		return map[string]any{
			"id": "chatcmpl-" + openaiID(acc), "object": "chat.completion", "created": acc.Created, "model": acc.Model,
			"choices": list, "usage": usage,
		}
	}
	return map[string]any{
		"id": "cmpl-" + openaiID(acc), "object": "text_completion", "created": acc.Created, "model": acc.Model,
		"choices": list, "usage": usage,
	}
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
