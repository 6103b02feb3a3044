package openai

import (
	"encoding/json"
	"net/http"

	"github.com/baton-dev/baton/events"
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
