package openai

import (
	"encoding/json"
	"testing"

	"github.com/baton-dev/baton/events"
)

func TestMergeOutput(t *testing.T) {
	raw := func(s string) json.RawMessage { return json.RawMessage(s) }
	tokens := []string{"", "", "", "x"}
	details := []json.RawMessage{
		raw(`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\": "}}],"logprobs":{"content":[{"token":"a","logprob":-0.1}]}}`),
		raw(`{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}],"logprobs":{"content":[{"token":"b","logprob":-0.2}]}}`),
		raw(`{"reasoning_content":"hmm","tool_calls":[{"index":1,"id":"call_2","type":"function","function":{"name":"g","arguments":"{}"}}]}`),
		nil,
	}
	o := merge(tokens, details)
	got, _ := json.Marshal(o.answerChoice(events.EndpointChat, 0, "tool_calls"))
	want := `{"finish_reason":"tool_calls","index":0,"logprobs":{"content":[{"token":"a","logprob":-0.1},{"token":"b","logprob":-0.2}]},` +
		`"message":{"content":"x","reasoning_content":"hmm","role":"assistant","tool_calls":[{"function":{"arguments":"{\"a\": 1}","name":"f"},"id":"call_1","type":"function"},{"function":{"arguments":"{}","name":"g"},"id":"call_2","type":"function"}]}}`
	if string(got) != want {
		t.Errorf("answer\n got %s\nwant %s", got, want)
	}
	// A chunk of the second token alone: an arguments fragment, no name or id.
	got, _ = json.Marshal(merge(tokens[1:2], details[1:2]).chunkChoice(events.EndpointChat, 0, false))
	want = `{"delta":{"tool_calls":[{"function":{"arguments":"1}"},"index":0}]},"finish_reason":null,"index":0,"logprobs":{"content":[{"token":"b","logprob":-0.2}]}}`
	if string(got) != want {
		t.Errorf("chunk\n got %s\nwant %s", got, want)
	}
	// Plain text: content only, as before.
	got, _ = json.Marshal(merge([]string{"a ", "b"}, nil).chunkChoice(events.EndpointChat, 1, true))
	if want := `{"delta":{"content":"a b","role":"assistant"},"finish_reason":null,"index":1,"logprobs":null}`; string(got) != want {
		t.Errorf("text chunk\n got %s\nwant %s", got, want)
	}
	// Completions logprobs: every array concatenated.
	lp := []json.RawMessage{
		raw(`{"logprobs":{"tokens":["a"],"token_logprobs":[-1],"text_offset":[0],"top_logprobs":null}}`),
		raw(`{"logprobs":{"tokens":["b"],"token_logprobs":[-2],"text_offset":[1],"top_logprobs":null}}`),
	}
	got, _ = json.Marshal(merge([]string{"a", "b"}, lp).answerChoice(events.EndpointCompletions, 0, "length"))
	if want := `{"finish_reason":"length","index":0,"logprobs":{"text_offset":[0,1],"token_logprobs":[-1,-2],"tokens":["a","b"],"top_logprobs":null},"text":"ab"}`; string(got) != want {
		t.Errorf("completion\n got %s\nwant %s", got, want)
	}
}
