package openai

import (
	"encoding/json"
	"slices"
	"strings"

	"github.com/baton-dev/baton/events"
)

// rendered is what a run of tokens said, merged: text, and what the engine
// said beyond it (tool-call deltas, logprobs, reasoning, refusal; see
// engine.Details). A stream chunk carries the output of the tokens it
// covers; a non-streaming answer the output of all of them.
type rendered struct {
	text      strings.Builder
	reasoning strings.Builder
	refusal   strings.Builder
	calls     []*toolCall                  // pointers: a toolCall holds a Builder, which must not be copied
	logprobs  map[string][]json.RawMessage // array fields, concatenated
	lpKeys    []string                     // their order of first appearance
}

// toolCall is one tool call's deltas merged.
type toolCall struct {
	index          int
	id, typ, name  string
	arguments      strings.Builder
	hasID, hasName bool
}

// tokenDetails is engine.Details as the log stores it.
type tokenDetails struct {
	ToolCalls        []toolCallDelta            `json:"tool_calls"`
	Logprobs         map[string]json.RawMessage `json:"logprobs"`
	ReasoningContent string                     `json:"reasoning_content"`
	Refusal          string                     `json:"refusal"`
}

type toolCallDelta struct {
	Index    int    `json:"index"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// merge is the output of tokens with their details (nil, or one per token).
func merge(tokens []string, details []json.RawMessage) *rendered {
	o := &rendered{}
	for i, t := range tokens {
		o.text.WriteString(t)
		if i < len(details) && details[i] != nil {
			o.add(details[i])
		}
	}
	return o
}

func (o *rendered) add(raw json.RawMessage) {
	var d tokenDetails
	if json.Unmarshal(raw, &d) != nil {
		return
	}
	o.reasoning.WriteString(d.ReasoningContent)
	o.refusal.WriteString(d.Refusal)
	for _, c := range d.ToolCalls {
		k := slices.IndexFunc(o.calls, func(x *toolCall) bool { return x.index == c.Index })
		if k < 0 {
			o.calls = append(o.calls, &toolCall{index: c.Index})
			k = len(o.calls) - 1
		}
		tc := o.calls[k]
		if c.ID != "" {
			tc.id, tc.hasID = c.ID, true
		}
		if c.Type != "" {
			tc.typ = c.Type
		}
		if c.Function.Name != "" {
			tc.name, tc.hasName = c.Function.Name, true
		}
		tc.arguments.WriteString(c.Function.Arguments)
	}
	for k, v := range d.Logprobs {
		var items []json.RawMessage
		if json.Unmarshal(v, &items) != nil {
			continue // null or not an array
		}
		if o.logprobs == nil {
			o.logprobs = map[string][]json.RawMessage{}
		}
		if _, seen := o.logprobs[k]; !seen {
			o.lpKeys = append(o.lpKeys, k)
		}
		o.logprobs[k] = append(o.logprobs[k], items...)
	}
}

// logprobsValue is the merged logprobs, or nil when no token had any.
func (o *rendered) logprobsValue() any {
	if o.logprobs == nil {
		return nil
	}
	m := make(map[string]any, len(o.logprobs))
	for k, v := range o.logprobs {
		m[k] = v
	}
	return m
}

func (o *rendered) toolCalls(stream bool) []map[string]any {
	out := make([]map[string]any, 0, len(o.calls))
	for _, c := range o.calls {
		fn := map[string]any{"arguments": c.arguments.String()}
		m := map[string]any{"function": fn}
		if stream {
			m["index"] = c.index
		}
		if c.hasName || !stream {
			fn["name"] = c.name
		}
		if c.hasID || !stream {
			m["id"] = c.id
		}
		if c.typ != "" || !stream {
			m["type"] = "function"
		}
		out = append(out, m)
	}
	return out
}

// chunkChoice is the choice of a stream chunk carrying o.
func (o *rendered) chunkChoice(endpoint string, index int, first bool) map[string]any {
	if endpoint != events.EndpointChat {
		return map[string]any{"index": index, "text": o.text.String(), "logprobs": o.logprobsValue(), "finish_reason": nil}
	}
	delta := map[string]any{}
	if first {
		delta["role"] = "assistant"
	}
	if o.text.Len() > 0 || (o.calls == nil && o.reasoning.Len() == 0 && o.refusal.Len() == 0) {
		delta["content"] = o.text.String()
	}
	if o.reasoning.Len() > 0 {
		delta["reasoning_content"] = o.reasoning.String()
	}
	if o.refusal.Len() > 0 {
		delta["refusal"] = o.refusal.String()
	}
	if o.calls != nil {
		delta["tool_calls"] = o.toolCalls(true)
	}
	return map[string]any{"index": index, "delta": delta, "logprobs": o.logprobsValue(), "finish_reason": nil}
}

// answerChoice is the choice of a non-streaming answer made of o.
func (o *rendered) answerChoice(endpoint string, index int, finish string) map[string]any {
	if endpoint != events.EndpointChat {
		return map[string]any{"index": index, "text": o.text.String(), "logprobs": o.logprobsValue(), "finish_reason": finish}
	}
	msg := map[string]any{"role": "assistant", "content": o.text.String()}
	if o.calls != nil {
		msg["tool_calls"] = o.toolCalls(false)
		if o.text.Len() == 0 {
			msg["content"] = nil
		}
	}
	if o.reasoning.Len() > 0 {
		msg["reasoning_content"] = o.reasoning.String()
	}
	if o.refusal.Len() > 0 {
		msg["refusal"] = o.refusal.String()
	}
	return map[string]any{"index": index, "message": msg, "logprobs": o.logprobsValue(), "finish_reason": finish}
}
