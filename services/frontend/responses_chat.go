package frontend

import (
	"strings"
)

// A response's conversation as chat messages (what engines are sent) and
// back (what a later response's previous_response_id carries over), and as
// the prompt text of the mock engine.

// chatMessages renders items as chat messages: a message as {role,
// content} (developer as system), consecutive function calls as one
// assistant message with tool_calls, a function call's output as a tool
// message.
func chatMessages(items []inputItem) []map[string]any {
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

// promptText is the prompt text of items for the mock engine and the
// frontend's token estimate: one "role: content" line per item, as a chat
// request's (renderChat), so the same question asked through chat and
// through the Responses API gets the same mock answer.
func promptText(items []inputItem) string {
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
func itemsOfMessages(msgs []chatMessage) []inputItem {
	var out []inputItem
	for _, m := range msgs {
		text := ""
		if m.Content != nil {
			text = *m.Content
		}
		switch {
		case m.Role == "tool":
			out = append(out, inputItem{Type: "function_call_output", CallID: m.ToolCallID, Output: text})
		case len(m.ToolCalls) > 0:
			for _, c := range m.ToolCalls {
				out = append(out, inputItem{Type: "function_call", CallID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
			}
		default:
			out = append(out, inputItem{Type: "message", Role: m.Role, Text: text})
		}
	}
	return out
}
