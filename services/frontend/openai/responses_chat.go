package openai

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

// A response's conversation as chat messages (what engines are sent) and
// back (what a later response's previous_response_id carries over), as
// the prompt text of the mock engine, and as the input items a client
// lists.

// EngineBody is the chat request engines are sent for q: the fields q
// carries over, with model, the conversation items as chat messages, and
// max_tokens.
func (q ResponseRequest) EngineBody(items []InputItem, maxTokens int) json.RawMessage {
	chat := make(map[string]json.RawMessage, len(q.chat)+3)
	for k, v := range q.chat {
		chat[k] = v
	}
	chat["model"] = mustMarshal(q.Model)
	chat["messages"] = mustMarshal(chatMessages(items))
	chat["max_tokens"] = mustMarshal(maxTokens)
	return mustMarshal(chat)
}

// chatMessages renders items as chat messages: a message as {role,
// content} (developer as system), consecutive function calls as one
// assistant message with tool_calls, a function call's output as a tool
// message.
func chatMessages(items []InputItem) []map[string]any {
	var out []map[string]any
	for _, it := range items {
		switch it.Type {
		case "message":
			role := it.Role
			if role == "developer" {
				role = "system"
			}
			out = append(out, map[string]any{"role": role, "content": it.Text})
		case "function_call":
			call := map[string]any{"id": it.CallID, "type": "function",
				"function": map[string]string{"name": it.Name, "arguments": it.Arguments}}
			if n := len(out); n > 0 && out[n-1]["role"] == "assistant" && out[n-1]["tool_calls"] != nil {
				out[n-1]["tool_calls"] = append(out[n-1]["tool_calls"].([]map[string]any), call)
				continue
			}
			out = append(out, map[string]any{"role": "assistant", "content": nil, "tool_calls": []map[string]any{call}})
		case "function_call_output":
			out = append(out, map[string]any{"role": "tool", "tool_call_id": it.CallID, "content": it.Output})
		}
	}
	return out
}

// PromptText is the prompt text of items for the mock engine and the
// frontend's token estimate: one "role: content" line per item, as the
// frontend renders a chat request's prompt, so the same question asked
// through chat and through the Responses API gets the same mock answer.
func PromptText(items []InputItem) string {
	var b strings.Builder
	for i, it := range items {
		if i > 0 {
			b.WriteByte('\n')
		}
		switch it.Type {
		case "message":
			role := it.Role
			if role == "developer" {
				role = "system"
			}
			b.WriteString(role + ": " + it.Text)
		case "function_call":
			b.WriteString("assistant: " + it.Name + "(" + it.Arguments + ")")
		case "function_call_output":
			b.WriteString("tool: " + it.Output)
		}
	}
	return b.String()
}

// chatMessage is a chat message as chatMessages writes it.
type chatMessage struct {
	Role       string  `json:"role"`
	Content    *string `json:"content"`
	ToolCallID string  `json:"tool_call_id"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// itemsOfMessages is chatMessages in reverse.
func itemsOfMessages(msgs []chatMessage) []InputItem {
	var out []InputItem
	for _, m := range msgs {
		text := ""
		if m.Content != nil {
			text = *m.Content
		}
		switch {
		case m.Role == "tool":
			out = append(out, InputItem{Type: "function_call_output", CallID: m.ToolCallID, Output: text})
		case len(m.ToolCalls) > 0:
			for _, c := range m.ToolCalls {
				out = append(out, InputItem{Type: "function_call", CallID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
			}
		default:
			out = append(out, InputItem{Type: "message", Role: m.Role, Text: text})
		}
	}
	return out
}

// PreviousTurns is the conversation that finished response p (known to its
// reader as public) ended, for a later response's previous_response_id:
// its context and input as it was sent to the engine (less its
// instructions, which do not carry over), then its output.
func PreviousTurns(public string, p *projections.Request) []InputItem {
	var sent struct {
		Messages []chatMessage `json:"messages"`
	}
	_ = json.Unmarshal(p.Accepted.EngineBody, &sent)
	var prevReq struct {
		Instructions string `json:"instructions"`
	}
	_ = json.Unmarshal(p.Accepted.Body, &prevReq)
	msgs := sent.Messages
	if prevReq.Instructions != "" && len(msgs) > 0 {
		msgs = msgs[1:]
	}
	items := itemsOfMessages(msgs)
	b := NewResponseRender(public, p.Accepted, nil)
	b.Feed(p.Tokens(0), p.Details(0))
	for _, it := range b.items {
		if it.kind == "function_call" {
			items = append(items, InputItem{Type: "function_call", CallID: it.callID, Name: it.name, Arguments: string(it.text)})
		} else {
			items = append(items, InputItem{Type: "message", Role: "assistant", Text: string(it.text)})
		}
	}
	return items
}

// InputItemList is the page of response public's input items (the items
// of its accepted body's input as the client sent them, not those of its
// previous responses) that GET /v1/responses/{id}/input_items answers:
// OpenAI's list object, in order ("asc" or "desc"), after the item named
// after (none: ""), at most limit items.
func InputItemList(public string, acc events.RequestAccepted, order, after string, limit int) map[string]any {
	q, _ := ParseResponseRequest(acc.Body, 1<<30)
	data := make([]map[string]any, 0, len(q.Input))
	for i, it := range q.Input {
		data = append(data, inputItemJSON(public, i, it))
	}
	if order == "desc" {
		for i, j := 0, len(data)-1; i < j; i, j = i+1, j-1 {
			data[i], data[j] = data[j], data[i]
		}
	}
	if after != "" {
		for i, d := range data {
			if d["id"] == after {
				data = data[i+1:]
				break
			}
		}
	}
	more := len(data) > limit
	if more {
		data = data[:limit]
	}
	list := map[string]any{"object": "list", "data": data, "has_more": more, "first_id": nil, "last_id": nil}
	if len(data) > 0 {
		list["first_id"], list["last_id"] = data[0]["id"], data[len(data)-1]["id"]
	}
	return list
}

// inputItemJSON is input item i of response public in OpenAI's shape.
func inputItemJSON(public string, i int, it InputItem) map[string]any {
	id := "item_" + public + "_" + strconv.Itoa(i)
	switch it.Type {
	case "function_call":
		return map[string]any{"id": id, "type": it.Type, "status": "completed", "call_id": it.CallID, "name": it.Name, "arguments": it.Arguments}
	case "function_call_output":
		return map[string]any{"id": id, "type": it.Type, "status": "completed", "call_id": it.CallID, "output": it.Output}
	}
	part := "input_text"
	if it.Role == "assistant" {
		part = "output_text"
	}
	return map[string]any{"id": id, "type": "message", "status": "completed", "role": it.Role,
		"content": []map[string]any{{"type": part, "text": it.Text}}}
}
