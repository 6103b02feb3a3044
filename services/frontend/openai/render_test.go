package openai

import (
	"encoding/json"
	"testing"

	"github.com/baton-dev/baton/events"
)

func rawDetails(ds ...string) []json.RawMessage {
	out := make([]json.RawMessage, len(ds))
	for i, d := range ds {
		if d != "" {
			out[i] = json.RawMessage(d)
		}
	}
	return out
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestChunkChoice(t *testing.T) {
	cases := []struct {
		name     string
		endpoint string
		tokens   []string
		details  []json.RawMessage
		index    int
		first    bool
		want     string
	}{
		{name: "first chat chunk has the role", endpoint: events.EndpointChat, tokens: []string{"Hel", "lo"}, first: true,
			want: `{"delta":{"content":"Hello","role":"assistant"},"finish_reason":null,"index":0,"logprobs":null}`},
		{name: "later chat chunk has none", endpoint: events.EndpointChat, tokens: []string{" world"}, index: 2,
			want: `{"delta":{"content":" world"},"finish_reason":null,"index":2,"logprobs":null}`},
		{name: "an empty chat chunk still has content", endpoint: events.EndpointChat, tokens: []string{""},
			want: `{"delta":{"content":""},"finish_reason":null,"index":0,"logprobs":null}`},
		{name: "completions chunk is text", endpoint: events.EndpointCompletions, tokens: []string{"a", "b"}, index: 1, first: true,
			want: `{"finish_reason":null,"index":1,"logprobs":null,"text":"ab"}`},
		{name: "reasoning only: no content", endpoint: events.EndpointChat, tokens: []string{""},
			details: rawDetails(`{"reasoning_content":"think"}`),
			want:    `{"delta":{"reasoning_content":"think"},"finish_reason":null,"index":0,"logprobs":null}`},
		{name: "refusal only: no content", endpoint: events.EndpointChat, tokens: []string{""},
			details: rawDetails(`{"refusal":"no"}`),
			want:    `{"delta":{"refusal":"no"},"finish_reason":null,"index":0,"logprobs":null}`},
		{name: "a tool call's first delta carries id, type and name", endpoint: events.EndpointChat, tokens: []string{""},
			details: rawDetails(`{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":"{"}}]}`),
			want:    `{"delta":{"tool_calls":[{"function":{"arguments":"{","name":"f"},"id":"c1","index":0,"type":"function"}]},"finish_reason":null,"index":0,"logprobs":null}`},
		{name: "a later tool-call delta only its arguments", endpoint: events.EndpointChat, tokens: []string{""},
			details: rawDetails(`{"tool_calls":[{"index":0,"function":{"arguments":"}"}}]}`),
			want:    `{"delta":{"tool_calls":[{"function":{"arguments":"}"},"index":0}]},"finish_reason":null,"index":0,"logprobs":null}`},
		{name: "logprobs of the chunk's tokens concatenated", endpoint: events.EndpointCompletions, tokens: []string{"a", "b"},
			details: rawDetails(`{"logprobs":{"tokens":["a"]}}`, `{"logprobs":{"tokens":["b"]}}`),
			want:    `{"finish_reason":null,"index":0,"logprobs":{"tokens":["a","b"]},"text":"ab"}`},
		{name: "a null logprobs field is kept (top_logprobs)", endpoint: events.EndpointCompletions, tokens: []string{"a"},
			details: rawDetails(`{"logprobs":{"top_logprobs":null}}`),
			want:    `{"finish_reason":null,"index":0,"logprobs":{"top_logprobs":null},"text":"a"}`},
		{name: "a logprobs field that is no array is dropped", endpoint: events.EndpointCompletions, tokens: []string{"a"},
			details: rawDetails(`{"logprobs":{"tokens":"a"}}`),
			want:    `{"finish_reason":null,"index":0,"logprobs":null,"text":"a"}`},
		{name: "unreadable details are ignored", endpoint: events.EndpointChat, tokens: []string{"x"},
			details: rawDetails(`not json`),
			want:    `{"delta":{"content":"x"},"finish_reason":null,"index":0,"logprobs":null}`},
		{name: "fewer details than tokens", endpoint: events.EndpointChat, tokens: []string{"x", "y"},
			details: rawDetails(`{"refusal":"r"}`),
			want:    `{"delta":{"content":"xy","refusal":"r"},"finish_reason":null,"index":0,"logprobs":null}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := jsonOf(t, merge(tc.tokens, tc.details).chunkChoice(tc.endpoint, tc.index, tc.first))
			if got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestAnswerChoice(t *testing.T) {
	cases := []struct {
		name     string
		endpoint string
		tokens   []string
		details  []json.RawMessage
		finish   string
		want     string
	}{
		{name: "chat", endpoint: events.EndpointChat, tokens: []string{"a", "b"}, finish: "stop",
			want: `{"finish_reason":"stop","index":0,"logprobs":null,"message":{"content":"ab","role":"assistant"}}`},
		{name: "completions", endpoint: events.EndpointCompletions, tokens: []string{"a", "b"}, finish: "length",
			want: `{"finish_reason":"length","index":0,"logprobs":null,"text":"ab"}`},
		{name: "tool calls without text: content null, every field", endpoint: events.EndpointChat, tokens: []string{"", ""},
			details: rawDetails(`{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}`, ""), finish: "tool_calls",
			want: `{"finish_reason":"tool_calls","index":0,"logprobs":null,"message":{"content":null,"role":"assistant","tool_calls":[{"function":{"arguments":"{}","name":""},"id":"","type":"function"}]}}`},
		{name: "tool calls with text keep it", endpoint: events.EndpointChat, tokens: []string{"ok"},
			details: rawDetails(`{"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}`), finish: "tool_calls",
			want: `{"finish_reason":"tool_calls","index":0,"logprobs":null,"message":{"content":"ok","role":"assistant","tool_calls":[{"function":{"arguments":"{}","name":"f"},"id":"c","type":"function"}]}}`},
		{name: "two tool calls interleaved", endpoint: events.EndpointChat, tokens: []string{"", "", ""},
			details: rawDetails(
				`{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\":"}}]}`,
				`{"tool_calls":[{"index":1,"id":"b","type":"function","function":{"name":"g","arguments":"{}"}}]}`,
				`{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}`), finish: "tool_calls",
			want: `{"finish_reason":"tool_calls","index":0,"logprobs":null,"message":{"content":null,"role":"assistant","tool_calls":[{"function":{"arguments":"{\"x\":1}","name":"f"},"id":"a","type":"function"},{"function":{"arguments":"{}","name":"g"},"id":"b","type":"function"}]}}`},
		{name: "reasoning and refusal", endpoint: events.EndpointChat, tokens: []string{"x", ""},
			details: rawDetails(`{"reasoning_content":"r1"}`, `{"reasoning_content":"r2","refusal":"no"}`), finish: "stop",
			want: `{"finish_reason":"stop","index":0,"logprobs":null,"message":{"content":"x","reasoning_content":"r1r2","refusal":"no","role":"assistant"}}`},
		{name: "chat logprobs in order", endpoint: events.EndpointChat, tokens: []string{"a", "b"},
			details: rawDetails(`{"logprobs":{"content":[{"token":"a"}]}}`, `{"logprobs":{"content":[{"token":"b"}]}}`), finish: "stop",
			want: `{"finish_reason":"stop","index":0,"logprobs":{"content":[{"token":"a"},{"token":"b"}]},"message":{"content":"ab","role":"assistant"}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := jsonOf(t, merge(tc.tokens, tc.details).answerChoice(tc.endpoint, 0, tc.finish))
			if got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}
