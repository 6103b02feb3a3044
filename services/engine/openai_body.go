package engine

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Upstream paths.
const (
	pathChat        = "/v1/chat/completions"
	pathCompletions = "/v1/completions"
)

// ErrUnsupported marks a request the engine's server cannot run (a
// completions request on a chat-only server, a continuation it cannot
// express): the worker fails the attempt and the frontend tries another.
var ErrUnsupported = errors.New("engine: not supported by this server")

// chatOnlyFields are the chat request fields that /v1/completions does not
// take; a chat continued as a token-id completion drops them.
var chatOnlyFields = []string{
	"messages", "tools", "tool_choice", "parallel_tool_calls", "response_format", "functions", "function_call",
	"add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs",
	"documents", "top_logprobs", "logprobs", "max_completion_tokens", "reasoning_effort", "modalities", "audio",
}

// buildUpstream is the request sent upstream for req: the client's body
// with model, stream, stream_options.include_usage, the remaining budget and
// n rewritten, every other field as the client sent it. A continuation
// (StartOffset > 0) goes as prompt ids + generated ids to /v1/completions
// when the server takes token ids and every id is known; otherwise as
// prefill: the text so far as a final assistant message to continue (chat)
// or appended to the prompt (completions).
func buildUpstream(req Request, model string, budget int, caps Capabilities) (string, []byte, error) {
	fields := map[string]json.RawMessage{}
	chat := req.Endpoint == EndpointChat
	if req.Body != nil {
		if err := json.Unmarshal(req.Body, &fields); err != nil {
			return "", nil, fmt.Errorf("engine: openai: request body: %w", err)
		}
	} else {
		// A request made of its prompt alone (a canary, an old dispatch).
		chat = !caps.Completions
		if chat {
			fields["messages"] = mustJSON([]map[string]string{{"role": "user", "content": req.Prompt}})
		} else {
			fields["prompt"] = mustJSON(req.Prompt)
		}
	}
	path := pathCompletions
	if chat {
		path = pathChat
	}
	if !chat && !caps.Completions {
		return "", nil, fmt.Errorf("%w: /v1/completions (the server serves chat only)", ErrUnsupported)
	}
	if req.StartOffset > 0 {
		var err error
		if path, err = continuation(fields, req, chat, caps); err != nil {
			return "", nil, err
		}
	}
	fields["model"] = mustJSON(model)
	fields["stream"] = mustJSON(true)
	opts := map[string]json.RawMessage{}
	if raw, ok := fields["stream_options"]; ok && present(raw) {
		_ = json.Unmarshal(raw, &opts)
	}
	opts["include_usage"] = mustJSON(true)
	fields["stream_options"] = mustJSON(opts)
	fields["max_tokens"] = mustJSON(budget)
	if _, ok := fields["max_completion_tokens"]; ok {
		fields["max_completion_tokens"] = mustJSON(budget)
	}
	if _, ok := fields["n"]; ok {
		fields["n"] = mustJSON(1)
	}
	if caps.TokenIDs {
		fields["return_token_ids"] = mustJSON(true)
	}
	body, err := json.Marshal(fields)
	return path, body, err
}

// continuation rewrites fields to continue req after StartOffset tokens and
// returns the path to send them to.
func continuation(fields map[string]json.RawMessage, req Request, chat bool, caps Capabilities) (string, error) {
	if fromTokenIDs(req, caps) {
		ids := append(append(make([]int, 0, len(req.PromptIDs)+len(req.GeneratedIDs)), req.PromptIDs...), req.GeneratedIDs...)
		if chat {
			// Chat logprobs (a bool and top_logprobs) are an int on completions.
			var on bool
			if json.Unmarshal(fields["logprobs"], &on) == nil && on {
				var top int
				_ = json.Unmarshal(fields["top_logprobs"], &top)
				fields["logprobs"] = mustJSON(top)
			} else {
				delete(fields, "logprobs")
			}
			lp := fields["logprobs"]
			for _, f := range chatOnlyFields {
				delete(fields, f)
			}
			if lp != nil {
				fields["logprobs"] = lp
			}
		}
		fields["prompt"] = mustJSON(ids)
		return pathCompletions, nil
	}
	if req.ExactOnly {
		return "", fmt.Errorf("%w: an exact continuation needs token ids (--migration-exact-only), and this one would be prefill", ErrUnsupported)
	}
	if chat {
		var msgs []json.RawMessage
		if err := json.Unmarshal(fields["messages"], &msgs); err != nil {
			return "", fmt.Errorf("engine: openai: messages: %w", err)
		}
		msgs = append(msgs, mustJSON(map[string]string{"role": "assistant", "content": req.Generated}))
		fields["messages"] = mustJSON(msgs)
		fields["continue_final_message"] = mustJSON(true)
		fields["add_generation_prompt"] = mustJSON(false)
		return pathChat, nil
	}
	var prompt string
	if err := json.Unmarshal(fields["prompt"], &prompt); err != nil {
		var one []string
		if json.Unmarshal(fields["prompt"], &one) != nil || len(one) != 1 {
			return "", fmt.Errorf("%w: continuing a prompt of token ids without the generated ids", ErrUnsupported)
		}
		prompt = one[0]
	}
	fields["prompt"] = mustJSON(prompt + req.Generated)
	return pathCompletions, nil
}

// fromTokenIDs reports whether a continuation of req goes to a server of
// caps as the prompt's ids plus the generated ids (token-exact), rather
// than as prefill.
func fromTokenIDs(req Request, caps Capabilities) bool {
	return caps.TokenIDs && caps.Completions && len(req.PromptIDs) > 0 && len(req.GeneratedIDs) == req.StartOffset
}

// ContinuesWith is how the engine continues req (a continuation: StartOffset
// > 0) on its server as last probed: ContinueTokenIDs, exact, or
// ContinuePrefill, whose exactness only the server's usage can show.
func (o *OpenAI) ContinuesWith(req Request) string {
	if fromTokenIDs(req, o.Capabilities()) {
		return ContinueTokenIDs
	}
	return ContinuePrefill
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only called with plain values
	}
	return b
}
