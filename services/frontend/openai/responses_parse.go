package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// The request side of OpenAI's Responses API: a body of POST /v1/responses
// validated (every error names its field in `param`) and rendered as the
// chat request that engines are sent. Shapes follow OpenAI's reference:
//   - https://platform.openai.com/docs/api-reference/responses/create
//     (input items: messages, function_call, function_call_output;
//     instructions, tools, tool_choice, text.format, max_output_tokens,
//     store, background, previous_response_id, stream_options);
//   - https://platform.openai.com/docs/guides/function-calling (function
//     tools in the Responses shape, {type, name, description, parameters,
//     strict}, and their chat counterparts);
//   - https://platform.openai.com/docs/guides/structured-outputs (text.format
//     json_schema, which chat takes as response_format).

// ParamError is a request error in OpenAI's shape that names the field at
// fault (Param, "" for the body as a whole): a 400 invalid_request_error
// unless Status says otherwise.
type ParamError struct {
	Status  int
	Type    string
	Code    string
	Message string
	Param   string
}

func (e *ParamError) Error() string { return e.Message }

// Body is the error object of e: ErrorBody's, with its param (null when
// e names none).
func (e *ParamError) Body() map[string]any {
	body := ErrorBody(e.Type, e.Code, e.Message)
	body["param"] = nil
	if e.Param != "" {
		body["param"] = e.Param
	}
	return body
}

// BadParam is a 400 invalid_request_error about param, with code and the
// message format makes of args.
func BadParam(param, code, format string, args ...any) *ParamError {
	return &ParamError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: code,
		Message: fmt.Sprintf(format, args...), Param: param}
}

// ResponseRequest is a validated POST /v1/responses body.
type ResponseRequest struct {
	Model        string
	Input        []InputItem // as the client sent them (a string is one user message)
	Instructions string
	MaxOutput    int // max_output_tokens, 0: not set
	Stream       bool
	Background   bool
	Store        bool
	Previous     string // previous_response_id
	// chat holds the fields carried to the chat request as they are:
	// temperature, top_p, tools (rewritten), tool_choice (rewritten),
	// parallel_tool_calls, response_format (from text.format), user.
	chat map[string]json.RawMessage
}

// InputItem is one item of a response's input, in the Responses shape.
type InputItem struct {
	Type      string `json:"type"`
	Role      string `json:"role,omitempty"`
	Text      string `json:"-"` // a message's text
	CallID    string `json:"call_id,omitempty"`
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments,omitempty"`
	Output    string `json:"output,omitempty"`
}

// ParseResponseRequest decodes and validates body; maxTokens bounds
// max_output_tokens.
func ParseResponseRequest(body []byte, maxTokens int) (ResponseRequest, *ParamError) {
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&fields); err != nil {
		return ResponseRequest{}, BadParam("", "invalid_json", "request body is not a JSON object: %v", err)
	}
	if dec.More() {
		return ResponseRequest{}, BadParam("", "invalid_json", "request body has data after the JSON object")
	}
	q := ResponseRequest{Store: true, chat: map[string]json.RawMessage{}}
	if err := decodeField(fields, "model", &q.Model); err != nil {
		return q, err
	}
	if q.Model == "" {
		return q, BadParam("model", "missing_required_parameter", "'model' is required")
	}
	items, err := parseInput(fields["input"])
	if err != nil {
		return q, err
	}
	q.Input = items
	for _, f := range []struct {
		name string
		dst  any
	}{
		{"instructions", &q.Instructions}, {"stream", &q.Stream}, {"background", &q.Background},
		{"store", &q.Store}, {"previous_response_id", &q.Previous}, {"max_output_tokens", &q.MaxOutput},
	} {
		if err := decodeField(fields, f.name, f.dst); err != nil {
			return q, err
		}
	}
	if _, set := fields["max_output_tokens"]; set && present(fields["max_output_tokens"]) && (q.MaxOutput < 1 || q.MaxOutput > maxTokens) {
		return q, BadParam("max_output_tokens", "invalid_value", "'max_output_tokens' must be an integer from 1 to %d, got %d", maxTokens, q.MaxOutput)
	}
	if q.Background && !q.Store {
		return q, BadParam("background", "invalid_value", "a background response must be stored: 'store' false and 'background' true cannot go together")
	}
	if len(q.Input) == 0 && q.Previous == "" {
		return q, BadParam("input", "missing_required_parameter", "'input' is required")
	}
	if err := q.parseSampling(fields); err != nil {
		return q, err
	}
	if err := q.parseTools(fields); err != nil {
		return q, err
	}
	if err := q.parseFormat(fields["text"]); err != nil {
		return q, err
	}
	var opts struct {
		IncludeObfuscation *bool `json:"include_obfuscation"`
	}
	if err := decodeField(fields, "stream_options", &opts); err != nil {
		return q, err // accepted and ignored: baton's events carry no obfuscation
	}
	return q, nil
}

// present reports whether raw holds a value other than null.
func present(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// decodeField decodes fields[name] into dst, if present and not null.
func decodeField(fields map[string]json.RawMessage, name string, dst any) *ParamError {
	raw, ok := fields[name]
	if !ok || !present(raw) {
		return nil
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return BadParam(name, "invalid_type", "invalid type for '%s': expected %s, got %s", name, kindOf(dst), jsonType(raw))
	}
	return nil
}

// kindOf names the JSON kind dst decodes.
func kindOf(dst any) string {
	switch dst.(type) {
	case *string:
		return "a string"
	case *bool:
		return "a boolean"
	case *int:
		return "an integer"
	case *float64:
		return "a number"
	}
	return "an object"
}

// jsonType names the JSON kind of raw.
func jsonType(raw json.RawMessage) string {
	switch raw[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// parseInput reads input: a string (one user message) or a list of items.
func parseInput(raw json.RawMessage) ([]InputItem, *ParamError) {
	if !present(raw) {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []InputItem{{Type: "message", Role: "user", Text: s}}, nil
	}
	var list []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, BadParam("input", "invalid_type", "'input' must be a string or an array of input items, got %s", jsonType(raw))
	}
	out := make([]InputItem, 0, len(list))
	for i, f := range list {
		it, err := parseItem(f, fmt.Sprintf("input[%d]", i))
		if err != nil {
			return nil, err
		}
		out = append(out, it)
	}
	return out, nil
}

func parseItem(f map[string]json.RawMessage, at string) (InputItem, *ParamError) {
	var it InputItem
	str := func(name string, dst *string, required bool) *ParamError {
		if err := decodeField(f, name, dst); err != nil {
			err.Param = at + "." + name
			return err
		}
		if required && *dst == "" {
			return BadParam(at+"."+name, "missing_required_parameter", "'%s.%s' is required", at, name)
		}
		return nil
	}
	if err := str("type", &it.Type, false); err != nil {
		return it, err
	}
	if it.Type == "" {
		if _, ok := f["role"]; !ok {
			return it, BadParam(at+".type", "missing_required_parameter", "'%s.type' is required (or a message's 'role')", at)
		}
		it.Type = "message"
	}
	switch it.Type {
	case "message":
		if err := str("role", &it.Role, true); err != nil {
			return it, err
		}
		switch it.Role {
		case "user", "system", "developer", "assistant":
		default:
			return it, BadParam(at+".role", "invalid_value", "'%s.role' %q is not one of user, system, developer, assistant", at, it.Role)
		}
		text, err := itemText(f["content"], at+".content")
		if err != nil {
			return it, err
		}
		it.Text = text
	case "function_call":
		if err := str("call_id", &it.CallID, true); err != nil {
			return it, err
		}
		if err := str("name", &it.Name, true); err != nil {
			return it, err
		}
		if err := str("arguments", &it.Arguments, false); err != nil {
			return it, err
		}
	case "function_call_output":
		if err := str("call_id", &it.CallID, true); err != nil {
			return it, err
		}
		var out string
		if present(f["output"]) && json.Unmarshal(f["output"], &out) != nil {
			t, err := itemText(f["output"], at+".output")
			if err != nil {
				return it, err
			}
			out = t
		}
		it.Output = out
	default:
		return it, BadParam(at+".type", "invalid_value", "'%s.type' %q is not supported (message, function_call, function_call_output)", at, it.Type)
	}
	return it, nil
}

// itemText reads a message's content: a string or a list of text parts.
func itemText(raw json.RawMessage, at string) (string, *ParamError) {
	if !present(raw) {
		return "", BadParam(at, "missing_required_parameter", "'%s' is required", at)
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", BadParam(at, "invalid_type", "'%s' must be a string or an array of text parts, got %s", at, jsonType(raw))
	}
	var b strings.Builder
	for i, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
		default:
			return "", BadParam(fmt.Sprintf("%s[%d].type", at, i), "invalid_value", "content part type %q is not supported (input_text, output_text)", p.Type)
		}
		if p.Text == nil {
			return "", BadParam(fmt.Sprintf("%s[%d].text", at, i), "missing_required_parameter", "'%s[%d].text' is required", at, i)
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

// parseSampling carries temperature, top_p, parallel_tool_calls, user and
// metadata (checked, not carried) over.
func (q *ResponseRequest) parseSampling(fields map[string]json.RawMessage) *ParamError {
	for _, n := range []struct {
		name     string
		min, max float64
	}{{"temperature", 0, 2}, {"top_p", 0, 1}} {
		var v float64
		if err := decodeField(fields, n.name, &v); err != nil {
			return err
		}
		if present(fields[n.name]) {
			if v < n.min || v > n.max {
				return BadParam(n.name, "invalid_value", "'%s' must be from %g to %g, got %g", n.name, n.min, n.max, v)
			}
			q.chat[n.name] = fields[n.name]
		}
	}
	var b bool
	if err := decodeField(fields, "parallel_tool_calls", &b); err != nil {
		return err
	}
	if present(fields["parallel_tool_calls"]) {
		q.chat["parallel_tool_calls"] = fields["parallel_tool_calls"]
	}
	var user string
	if err := decodeField(fields, "user", &user); err != nil {
		return err
	}
	if user != "" {
		q.chat["user"] = fields["user"]
	}
	var meta map[string]string
	if err := decodeField(fields, "metadata", &meta); err != nil {
		err.Message = "'metadata' must be an object of string values"
		return err
	}
	if len(meta) > 16 {
		return BadParam("metadata", "invalid_value", "'metadata' has %d keys, more than 16", len(meta))
	}
	return nil
}

// parseTools checks function tools and rewrites them, and tool_choice, in
// chat's shape.
func (q *ResponseRequest) parseTools(fields map[string]json.RawMessage) *ParamError {
	if present(fields["tools"]) {
		var tools []map[string]json.RawMessage
		if err := json.Unmarshal(fields["tools"], &tools); err != nil {
			return BadParam("tools", "invalid_type", "'tools' must be an array of tools, got %s", jsonType(fields["tools"]))
		}
		out := make([]map[string]any, 0, len(tools))
		for i, t := range tools {
			at := fmt.Sprintf("tools[%d]", i)
			var typ, name, desc string
			for _, f := range []struct {
				n string
				d *string
			}{{"type", &typ}, {"name", &name}, {"description", &desc}} {
				if err := decodeField(t, f.n, f.d); err != nil {
					err.Param = at + "." + f.n
					return err
				}
			}
			if typ != "function" {
				return BadParam(at+".type", "invalid_value", "'%s.type' %q is not supported (only function tools)", at, typ)
			}
			if name == "" {
				return BadParam(at+".name", "missing_required_parameter", "'%s.name' is required", at)
			}
			fn := map[string]any{"name": name}
			if desc != "" {
				fn["description"] = desc
			}
			if raw := t["parameters"]; present(raw) {
				var schema map[string]any
				if json.Unmarshal(raw, &schema) != nil {
					return BadParam(at+".parameters", "invalid_type", "'%s.parameters' must be a JSON Schema object, got %s", at, jsonType(raw))
				}
				fn["parameters"] = raw
			}
			if raw := t["strict"]; present(raw) {
				var strict bool
				if json.Unmarshal(raw, &strict) != nil {
					return BadParam(at+".strict", "invalid_type", "'%s.strict' must be a boolean, got %s", at, jsonType(raw))
				}
				fn["strict"] = strict
			}
			out = append(out, map[string]any{"type": "function", "function": fn})
		}
		if len(out) > 0 {
			q.chat["tools"] = mustMarshal(out)
		}
	}
	raw := fields["tool_choice"]
	if !present(raw) {
		return nil
	}
	var mode string
	if json.Unmarshal(raw, &mode) == nil {
		if mode != "none" && mode != "auto" && mode != "required" {
			return BadParam("tool_choice", "invalid_value", "'tool_choice' %q is not one of none, auto, required", mode)
		}
		q.chat["tool_choice"] = raw
		return nil
	}
	var named struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if json.Unmarshal(raw, &named) != nil || named.Type != "function" || named.Name == "" {
		return BadParam("tool_choice", "invalid_value", `'tool_choice' must be none, auto, required or {"type": "function", "name": ...}`)
	}
	q.chat["tool_choice"] = mustMarshal(map[string]any{"type": "function", "function": map[string]string{"name": named.Name}})
	return nil
}

// parseFormat rewrites text.format as chat's response_format.
func (q *ResponseRequest) parseFormat(raw json.RawMessage) *ParamError {
	if !present(raw) {
		return nil
	}
	var text struct {
		Format map[string]json.RawMessage `json:"format"`
	}
	if err := json.Unmarshal(raw, &text); err != nil {
		return BadParam("text", "invalid_type", "'text' must be an object such as {\"format\": {\"type\": \"text\"}}")
	}
	if text.Format == nil {
		return nil
	}
	var typ string
	if err := decodeField(text.Format, "type", &typ); err != nil {
		err.Param = "text.format.type"
		return err
	}
	switch typ {
	case "text":
		return nil
	case "json_object":
		q.chat["response_format"] = mustMarshal(map[string]string{"type": "json_object"})
		return nil
	case "json_schema":
	default:
		return BadParam("text.format.type", "invalid_value", "'text.format.type' %q is not one of text, json_object, json_schema", typ)
	}
	var name string
	if err := decodeField(text.Format, "name", &name); err != nil {
		err.Param = "text.format.name"
		return err
	}
	if name == "" {
		return BadParam("text.format.name", "missing_required_parameter", "'text.format.name' is required")
	}
	var schema map[string]any
	if json.Unmarshal(text.Format["schema"], &schema) != nil {
		return BadParam("text.format.schema", "invalid_type", "'text.format.schema' must be a JSON Schema object")
	}
	js := map[string]json.RawMessage{"name": text.Format["name"], "schema": text.Format["schema"]}
	for _, k := range []string{"description", "strict"} {
		if present(text.Format[k]) {
			js[k] = text.Format[k]
		}
	}
	q.chat["response_format"] = mustMarshal(map[string]any{"type": "json_schema", "json_schema": js})
	return nil
}

func mustMarshal(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only called with plain values
	}
	return b
}
