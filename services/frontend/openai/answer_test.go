package openai

import (
	"testing"

	"github.com/baton-dev/baton/events"
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
