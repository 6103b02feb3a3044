package openai

import (
	"encoding/json"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

func TestFailureBody(t *testing.T) {
	cases := []struct {
		name       string
		failure    events.RequestFailed
		wantStatus int
		wantType   string
	}{
		{name: "no status: 500 server error", failure: events.RequestFailed{Code: "x", Message: "m"},
			wantStatus: 500, wantType: "server_error"},
		{name: "503: service unavailable", failure: events.RequestFailed{Code: "no_workers", Message: "m", Status: 503},
			wantStatus: 503, wantType: "service_unavailable"},
		{name: "400: invalid request", failure: events.RequestFailed{Code: "bad", Message: "m", Status: 400},
			wantStatus: 400, wantType: "invalid_request_error"},
		{name: "413: invalid request", failure: events.RequestFailed{Code: "prompt_too_long", Message: "m", Status: 413},
			wantStatus: 413, wantType: "invalid_request_error"},
		{name: "429 from the upstream: invalid request class", failure: events.RequestFailed{Code: "rate_limited", Message: "m", Status: 429},
			wantStatus: 429, wantType: "invalid_request_error"},
		{name: "499 is still a 4xx", failure: events.RequestFailed{Code: "c", Message: "m", Status: 499},
			wantStatus: 499, wantType: "invalid_request_error"},
		{name: "500: server error", failure: events.RequestFailed{Code: "migration_exhausted", Message: "m", Status: 500},
			wantStatus: 500, wantType: "server_error"},
		{name: "502: server error", failure: events.RequestFailed{Code: "upstream", Message: "m", Status: 502},
			wantStatus: 502, wantType: "server_error"},
		{name: "504: server error", failure: events.RequestFailed{Code: "timeout", Message: "m", Status: 504},
			wantStatus: 504, wantType: "server_error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := FailureBody(&tc.failure)
			if status != tc.wantStatus {
				t.Errorf("got status %d, want %d", status, tc.wantStatus)
			}
			if body["type"] != tc.wantType || body["code"] != tc.failure.Code || body["message"] != tc.failure.Message {
				t.Errorf("got body %v, want type %s, code %s, message %s", body, tc.wantType, tc.failure.Code, tc.failure.Message)
			}
		})
	}
}

func TestAnswer(t *testing.T) {
	chat := events.RequestAccepted{RequestID: "r1", Model: "m", Endpoint: events.EndpointChat, PromptTokens: 4, Created: 100}
	compl := chat
	compl.Endpoint = events.EndpointCompletions
	cases := []struct {
		name    string
		acc     events.RequestAccepted
		choices []Choice
		want    string
	}{
		{name: "chat, one choice, the frontend's prompt count", acc: chat,
			choices: []Choice{{Tokens: []string{"a", "b"}, Total: 2, FinishReason: "stop"}},
			want:    `{"choices":[{"finish_reason":"stop","index":0,"logprobs":null,"message":{"content":"ab","role":"assistant"}}],"created":100,"id":"chatcmpl-r1","model":"m","object":"chat.completion","usage":{"completion_tokens":2,"prompt_tokens":4,"total_tokens":6}}`},
		{name: "completions, the engine's prompt count wins", acc: compl,
			choices: []Choice{{Tokens: []string{"x"}, Total: 1, FinishReason: "length", PromptTokens: 9}},
			want:    `{"choices":[{"finish_reason":"length","index":0,"logprobs":null,"text":"x"}],"created":100,"id":"cmpl-r1","model":"m","object":"text_completion","usage":{"completion_tokens":1,"prompt_tokens":9,"total_tokens":10}}`},
		{name: "n choices: tokens summed, the prompt counted once", acc: compl,
			choices: []Choice{{Tokens: []string{"x"}, Total: 1, FinishReason: "stop"}, {Tokens: []string{"y", "z"}, Total: 2, FinishReason: "length", PromptTokens: 7}},
			want:    `{"choices":[{"finish_reason":"stop","index":0,"logprobs":null,"text":"x"},{"finish_reason":"length","index":1,"logprobs":null,"text":"yz"}],"created":100,"id":"cmpl-r1","model":"m","object":"text_completion","usage":{"completion_tokens":3,"prompt_tokens":4,"total_tokens":7}}`},
		{name: "resumed from an offset: usage counts every token", acc: chat,
			choices: []Choice{{Tokens: []string{"c"}, Total: 3, FinishReason: "stop"}},
			want:    `{"choices":[{"finish_reason":"stop","index":0,"logprobs":null,"message":{"content":"c","role":"assistant"}}],"created":100,"id":"chatcmpl-r1","model":"m","object":"chat.completion","usage":{"completion_tokens":3,"prompt_tokens":4,"total_tokens":7}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := jsonOf(t, Answer(tc.acc, tc.choices)); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

// TestResponse: one renderer answers for every endpoint, from the
// projection alone: a response's replay formerly showed a text_completion
// named cmpl-…, not the response object its client got.
func TestResponse(t *testing.T) {
	fold := func(endpoint, body string) *projections.Request {
		p := projections.NewRequest()
		for i, ev := range []events.Event{
			events.RequestAccepted{RequestID: "alice:r1", Tenant: "alice", Model: "m", Endpoint: endpoint, Body: json.RawMessage(body), PromptTokens: 3, MaxTokens: 8, Created: 100},
			events.RequestRouted{RequestID: "alice:r1", WorkerID: "w1"},
			events.TokensGenerated{RequestID: "alice:r1", Tokens: []string{"a", "b"}},
			events.RequestCompleted{RequestID: "alice:r1", FinishReason: "stop", CompletionTokens: 2},
		} {
			p.Apply(events.Envelope{Seq: uint64(i + 1), Event: ev})
		}
		return p
	}
	text := func(obj map[string]any) any { // a response's output text
		out, _ := obj["output"].([]map[string]any)
		if len(out) == 0 {
			return nil
		}
		parts, _ := out[0]["content"].([]map[string]any)
		if len(parts) == 0 {
			return nil
		}
		return parts[0]["text"]
	}
	cases := []struct {
		name, endpoint, body, public string
		wantObject, wantID           string
	}{
		{name: "chat", endpoint: events.EndpointChat, wantObject: "chat.completion", wantID: "chatcmpl-r1"},
		{name: "chat: public does not rename it", endpoint: events.EndpointChat, public: "alice:r1", wantObject: "chat.completion", wantID: "chatcmpl-r1"},
		{name: "completions", endpoint: events.EndpointCompletions, wantObject: "text_completion", wantID: "cmpl-r1"},
		{name: "response, named by its client's id", endpoint: events.EndpointResponses, body: `{"model":"m","input":"hi"}`, wantObject: "response", wantID: "r1"},
		{name: "response, named as its reader knows it", endpoint: events.EndpointResponses, body: `{"model":"m","input":"hi"}`, public: "alice:r1", wantObject: "response", wantID: "alice:r1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := fold(tc.endpoint, tc.body)
			got := Response(p, tc.public)
			if got["object"] != tc.wantObject || got["id"] != tc.wantID {
				t.Fatalf("got object %v id %v, want %s %s", got["object"], got["id"], tc.wantObject, tc.wantID)
			}
			if tc.endpoint != events.EndpointResponses {
				return
			}
			want, _ := renderResponse(tc.wantID, p, nil)
			if g, w := jsonOf(t, got), jsonOf(t, want); g != w {
				t.Errorf("got  %s\nwant %s (the frontend's rendering)", g, w)
			}
			if got["status"] != "completed" || text(got) != "ab" {
				t.Errorf("got status %v, text %v; want completed, ab", got["status"], text(got))
			}
		})
	}
}
