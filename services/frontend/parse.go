package frontend

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/frontend/openai"
)

// apiError is an error answered with OpenAI's error shape.
type apiError struct {
	status  int
	typ     string
	code    string
	message string
	param   string // the request field at fault, if one is: the body's "param"
}

func (e *apiError) Error() string { return e.message }

func badRequest(code, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: code, message: fmt.Sprintf(format, args...)}
}

// writeError answers with {"error":{"message","type","code"}}.
func writeError(w http.ResponseWriter, status int, typ, code, message string) {
	if status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, status, map[string]any{"error": openai.ErrorBody(typ, code, message)})
}

func writeAPIError(w http.ResponseWriter, e *apiError) {
	if e.param == "" {
		writeError(w, e.status, e.typ, e.code, e.message)
		return
	}
	body := openai.ErrorBody(e.typ, e.code, e.message)
	body["param"] = e.param
	writeJSON(w, e.status, map[string]any{"error": body})
}

// sampling are the sampling parameters checked on chat and completions, as
// on /v1/responses, with OpenAI's ranges: a number from min to max.
var sampling = []struct {
	name     string
	min, max float64
}{{"temperature", 0, 2}, {"top_p", 0, 1}}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

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

// parsed is a validated request.
type parsed struct {
	model        string
	messages     []events.Message
	prompt       string
	maxTokens    int
	stream       bool
	includeUsage bool
	n            int
}

// parseRequest decodes and validates a request body for endpoint.
func (fe *Frontend) parseRequest(endpoint string, body []byte) (parsed, *apiError) {
	var req completionRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&req); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			if typeErr.Field == "" {
				return parsed{}, badRequest("invalid_type", "request body must be a JSON object, got %s", typeErr.Value)
			}
			return parsed{}, fe.typeError(typeErr)
		}
		return parsed{}, badRequest("invalid_json", "request body is not valid JSON: %v", err)
	}
	if dec.More() {
		return parsed{}, badRequest("invalid_json", "request body has data after the JSON object")
	}
	var p parsed
	if req.Model == nil || *req.Model == "" {
		return p, badRequest("missing_model", "'model' is required")
	}
	p.model = *req.Model
	switch endpoint {
	case events.EndpointChat:
		msgs, err := parseMessages(req.Messages)
		if err != nil {
			return p, err
		}
		p.messages = msgs
		p.prompt = renderChat(msgs)
	default:
		prompt, err := parsePrompt(req.Prompt)
		if err != nil {
			return p, err
		}
		p.prompt = prompt
	}
	p.maxTokens = fe.cfg.DefaultMaxTokens
	for _, mt := range []struct {
		name string
		v    *int
	}{{"max_tokens", req.MaxTokens}, {"max_completion_tokens", req.MaxCompletionTokens}} {
		if mt.v == nil {
			continue
		}
		if *mt.v < 1 || *mt.v > fe.cfg.MaxTokensLimit {
			return p, badRequest("invalid_value", "'%s' must be an integer from 1 to %d, got %d", mt.name, fe.cfg.MaxTokensLimit, *mt.v)
		}
		p.maxTokens = *mt.v
	}
	p.n = 1
	if req.N != nil {
		if *req.N < 1 || *req.N > MaxChoices {
			return p, badRequest("invalid_value", "'n' must be an integer from 1 to %d, got %d", MaxChoices, *req.N)
		}
		p.n = *req.N
	}
	for i, v := range []*float64{req.Temperature, req.TopP} {
		if s := sampling[i]; v != nil && (*v < s.min || *v > s.max) {
			e := badRequest("invalid_value", "'%s' must be a number from %g to %g, got %g", s.name, s.min, s.max, *v)
			e.param = s.name
			return p, e
		}
	}
	p.stream = req.Stream != nil && *req.Stream
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage != nil {
		p.includeUsage = *req.StreamOptions.IncludeUsage
	}
	return p, nil
}

// typeError describes a JSON value of the wrong type: for the integer
// fields, with their range, since a number that is not an integer in range
// (2.5, 1e3, 99999999999999999999) is as wrong as a string.
func (fe *Frontend) typeError(e *json.UnmarshalTypeError) *apiError {
	got := strings.TrimPrefix(e.Value, "number ")
	for _, s := range sampling {
		if e.Field == s.name {
			err := badRequest("invalid_type", "'%s' must be a number from %g to %g, got %s", s.name, s.min, s.max, got)
			err.param = s.name
			return err
		}
	}
	switch e.Field {
	case "seed":
		err := badRequest("invalid_type", "'seed' must be an integer, got %s", got)
		err.param = "seed"
		return err
	case "max_tokens", "max_completion_tokens":
		return badRequest("invalid_type", "'%s' must be an integer from 1 to %d, got %s", e.Field, fe.cfg.MaxTokensLimit, got)
	case "n":
		return badRequest("invalid_type", "'n' must be an integer from 1 to %d, got %s", MaxChoices, got)
	case "stream_options":
		return badRequest("invalid_type", `'stream_options' must be an object such as {"include_usage": true}, got %s`, e.Value)
	}
	return badRequest("invalid_type", "invalid type for '%s': expected %s, got %s", e.Field, jsonKind(e.Type), e.Value)
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

func parseMessages(raw json.RawMessage) ([]events.Message, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("missing_messages", "'messages' is required")
	}
	var items []struct {
		Role    *string         `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, badRequest("invalid_type", "'messages' must be an array of {role, content} objects")
	}
	if len(items) == 0 {
		return nil, badRequest("invalid_value", "'messages' must not be empty")
	}
	out := make([]events.Message, 0, len(items))
	for i, m := range items {
		if m.Role == nil || *m.Role == "" {
			return nil, badRequest("invalid_value", "'messages[%d].role' is required", i)
		}
		switch *m.Role {
		case "system", "developer", "user", "assistant", "tool":
		default:
			return nil, badRequest("invalid_value", "'messages[%d].role' %q is not one of system, developer, user, assistant, tool", i, *m.Role)
		}
		content, err := parseContent(m.Content)
		if err != nil {
			return nil, badRequest("invalid_type", "'messages[%d].content': %v", i, err)
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

func parsePrompt(raw json.RawMessage) (string, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", badRequest("missing_prompt", "'prompt' is required")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", badRequest("invalid_type", "'prompt' must be a string or an array of one string")
	}
	if len(list) != 1 {
		return "", badRequest("unsupported_value", "'prompt' must hold exactly one string (got %d): batched prompts are not supported", len(list))
	}
	return list[0], nil
}

// estimateTokens is the frontend's count of a prompt's tokens, for
// admission (--max-prompt-tokens) and --migration-max-seq-len before an
// engine has counted them: its whitespace-separated words, which is exact
// for the mock engine. Once an engine reports its own count (its prompt
// token ids, its usage), usage and --migration-max-seq-len use that instead.
func estimateTokens(prompt string) int { return len(strings.Fields(prompt)) }
