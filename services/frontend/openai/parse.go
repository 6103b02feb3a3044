package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/baton-dev/baton/events"
)

// sampling are the sampling parameters checked on chat and completions, as
// on /v1/responses, with OpenAI's ranges: a number from min to max.
var sampling = []struct {
	name     string
	min, max float64
}{{"temperature", 0, 2}, {"top_p", 0, 1}}

// completionRequest is the subset of OpenAI's chat completion and completion
// requests that baton reads; other fields are accepted and ignored.
type completionRequest struct {
	Model               *string         `json:"model"`
	Messages            json.RawMessage `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              *bool           `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
	N           *int     `json:"n"`
	Temperature *float64 `json:"temperature"`
	TopP        *float64 `json:"top_p"`
	Seed        *int64   `json:"seed"`
}

// Completion is a validated chat completion or completion request.
type Completion struct {
	Model        string
	Messages     []events.Message // a chat's; nil for a completion
	Prompt       string           // the text the engine sees (renderChat for a chat)
	MaxTokens    int
	Stream       bool
	IncludeUsage bool
	N            int // choices, 1 to MaxChoices
}

// MaxChoices is the largest n accepted.
const MaxChoices = 16

// ParseCompletion decodes and validates a request body for endpoint
// (events.EndpointChat or events.EndpointCompletions): max_tokens is
// defaultMaxTokens when the body does not set it, and at most
// maxTokensLimit.
func ParseCompletion(endpoint string, body []byte, defaultMaxTokens, maxTokensLimit int) (Completion, *ParamError) {
	var req completionRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&req); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			if typeErr.Field == "" {
				return Completion{}, BadParam("", "invalid_type", "request body must be a JSON object, got %s", typeErr.Value)
			}
			return Completion{}, typeError(typeErr, maxTokensLimit)
		}
		return Completion{}, BadParam("", "invalid_json", "request body is not valid JSON: %v", err)
	}
	if dec.More() {
		return Completion{}, BadParam("", "invalid_json", "request body has data after the JSON object")
	}
	var p Completion
	if req.Model == nil || *req.Model == "" {
		return p, BadParam("", "missing_model", "'model' is required")
	}
	p.Model = *req.Model
	switch endpoint {
	case events.EndpointChat:
		msgs, err := parseMessages(req.Messages)
		if err != nil {
			return p, err
		}
		p.Messages = msgs
		p.Prompt = renderChat(msgs)
	default:
		prompt, err := parsePrompt(req.Prompt)
		if err != nil {
			return p, err
		}
		p.Prompt = prompt
	}
	p.MaxTokens = defaultMaxTokens
	for _, mt := range []struct {
		name string
		v    *int
	}{{"max_tokens", req.MaxTokens}, {"max_completion_tokens", req.MaxCompletionTokens}} {
		if mt.v == nil {
			continue
		}
		if *mt.v < 1 || *mt.v > maxTokensLimit {
			return p, BadParam("", "invalid_value", "'%s' must be an integer from 1 to %d, got %d", mt.name, maxTokensLimit, *mt.v)
		}
		p.MaxTokens = *mt.v
	}
	p.N = 1
	if req.N != nil {
		if *req.N < 1 || *req.N > MaxChoices {
			return p, BadParam("", "invalid_value", "'n' must be an integer from 1 to %d, got %d", MaxChoices, *req.N)
		}
		p.N = *req.N
	}
	for i, v := range []*float64{req.Temperature, req.TopP} {
		if s := sampling[i]; v != nil && (*v < s.min || *v > s.max) {
			e := BadParam("", "invalid_value", "'%s' must be a number from %g to %g, got %g", s.name, s.min, s.max, *v)
			e.Param = s.name
			return p, e
		}
	}
	p.Stream = req.Stream != nil && *req.Stream
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage != nil {
		p.IncludeUsage = *req.StreamOptions.IncludeUsage
	}
	return p, nil
}

// typeError describes a JSON value of the wrong type: for the integer
// fields, with their range, since a number that is not an integer in range
// (2.5, 1e3, 99999999999999999999) is as wrong as a string.
func typeError(e *json.UnmarshalTypeError, maxTokensLimit int) *ParamError {
	got := strings.TrimPrefix(e.Value, "number ")
	for _, s := range sampling {
		if e.Field == s.name {
			err := BadParam("", "invalid_type", "'%s' must be a number from %g to %g, got %s", s.name, s.min, s.max, got)
			err.Param = s.name
			return err
		}
	}
	switch e.Field {
	case "seed":
		err := BadParam("", "invalid_type", "'seed' must be an integer, got %s", got)
		err.Param = "seed"
		return err
	case "max_tokens", "max_completion_tokens":
		return BadParam("", "invalid_type", "'%s' must be an integer from 1 to %d, got %s", e.Field, maxTokensLimit, got)
	case "n":
		return BadParam("", "invalid_type", "'n' must be an integer from 1 to %d, got %s", MaxChoices, got)
	case "stream_options":
		return BadParam("", "invalid_type", `'stream_options' must be an object such as {"include_usage": true}, got %s`, e.Value)
	}
	return BadParam("", "invalid_type", "invalid type for '%s': expected %s, got %s", e.Field, jsonKind(e.Type), e.Value)
}

// jsonKind names the JSON kind that decodes into t.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "a boolean"
	case reflect.String:
		return "a string"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return t.String()
}

func parseMessages(raw json.RawMessage) ([]events.Message, *ParamError) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, BadParam("", "missing_messages", "'messages' is required")
	}
	var items []struct {
		Role    *string         `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, BadParam("", "invalid_type", "'messages' must be an array of {role, content} objects")
	}
	if len(items) == 0 {
		return nil, BadParam("", "invalid_value", "'messages' must not be empty")
	}
	out := make([]events.Message, 0, len(items))
	for i, m := range items {
		if m.Role == nil || *m.Role == "" {
			return nil, BadParam("", "invalid_value", "'messages[%d].role' is required", i)
		}
		switch *m.Role {
		case "system", "developer", "user", "assistant", "tool":
		default:
			return nil, BadParam("", "invalid_value", "'messages[%d].role' %q is not one of system, developer, user, assistant, tool", i, *m.Role)
		}
		content, err := parseContent(m.Content)
		if err != nil {
			return nil, BadParam("", "invalid_type", "'messages[%d].content': %v", i, err)
		}
		out = append(out, events.Message{Role: *m.Role, Content: content})
	}
	return out, nil
}

// parseContent accepts a string, null, or an array of text parts.
func parseContent(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("must be a string or an array of text parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("content part type %q is not supported (only text)", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// renderChat is the prompt text the engine sees for a chat: one
// "role: content" line per message.
func renderChat(msgs []events.Message) string {
	var b strings.Builder
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(m.Role)
		b.WriteString(": ")
		b.WriteString(m.Content)
	}
	return b.String()
}

func parsePrompt(raw json.RawMessage) (string, *ParamError) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", BadParam("", "missing_prompt", "'prompt' is required")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", BadParam("", "invalid_type", "'prompt' must be a string or an array of one string")
	}
	if len(list) != 1 {
		return "", BadParam("", "unsupported_value", "'prompt' must hold exactly one string (got %d): batched prompts are not supported", len(list))
	}
	return list[0], nil
}

// EstimateTokens is the frontend's count of a prompt's tokens, for
// admission (--max-prompt-tokens) and --migration-max-seq-len before an
// engine has counted them: its whitespace-separated words, which is exact
// for the mock engine. Once an engine reports its own count (its prompt
// token ids, its usage), usage and --migration-max-seq-len use that instead.
func EstimateTokens(prompt string) int { return len(strings.Fields(prompt)) }

// ChoiceBody is the body choice i of a request with n > 1 runs with: the
// client's body, with a seed s made s+i, so that seeded choices differ (as
// the n choices of one request do on the model server) while each stays
// reproducible. Choice 0 and bodies without an integer seed are unchanged.
func ChoiceBody(body json.RawMessage, i int) json.RawMessage {
	if i == 0 || len(body) == 0 {
		return body
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return body
	}
	var seed *int64
	if json.Unmarshal(fields["seed"], &seed) != nil || seed == nil {
		return body
	}
	fields["seed"], _ = json.Marshal(*seed + int64(i))
	out, err := json.Marshal(fields)
	if err != nil {
		return body
	}
	return out
}
