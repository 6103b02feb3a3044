package frontend

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
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
			status, body := failureBody(&tc.failure)
			if status != tc.wantStatus {
				t.Errorf("got status %d, want %d", status, tc.wantStatus)
			}
			if body["type"] != tc.wantType || body["code"] != tc.failure.Code || body["message"] != tc.failure.Message {
				t.Errorf("got body %v, want type %s, code %s, message %s", body, tc.wantType, tc.failure.Code, tc.failure.Message)
			}
		})
	}
}

func TestFailureOfCancelled(t *testing.T) {
	cases := []struct {
		name   string
		s      snapshot
		want   int
		reason string
	}{
		{name: "cancelled by the API", s: snapshot{status: projections.StatusCancelled,
			cancel: &events.RequestCancelled{Mode: events.CancelKill, Reason: "by API"}}, want: 499, reason: "the request was cancelled (by API)"},
		{name: "cancelled with no client", s: snapshot{status: projections.StatusCancelled,
			cancel: &events.RequestCancelled{Reason: "detached"}}, want: 499, reason: "the request was cancelled (detached)"},
		{name: "failed", s: snapshot{status: projections.StatusFailed,
			failure: &events.RequestFailed{Code: "c", Message: "boom", Status: 503}}, want: 503, reason: "boom"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := failureOf(tc.s)
			if status != tc.want || body["message"] != tc.reason {
				t.Errorf("got %d %v, want %d with message %q", status, body, tc.want, tc.reason)
			}
		})
	}
}

func TestWriteErrorRetryAfter(t *testing.T) {
	cases := []struct {
		name   string
		status int
		preset string // a Retry-After set before
		want   string
	}{
		{name: "503 gets one second", status: 503, want: "1"},
		{name: "503 keeps the one set", status: 503, preset: "7", want: "7"},
		{name: "429 keeps the one set", status: 429, preset: "3", want: "3"},
		{name: "500 gets none", status: 500, want: ""},
		{name: "400 gets none", status: 400, want: ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			if tc.preset != "" {
				rec.Header().Set("Retry-After", tc.preset)
			}
			writeError(rec, tc.status, "t", "c", "m")
			if got := rec.Header().Get("Retry-After"); got != tc.want {
				t.Errorf("got Retry-After %q, want %q", got, tc.want)
			}
			if rec.Code != tc.status {
				t.Errorf("got status %d, want %d", rec.Code, tc.status)
			}
			if got := rec.Header().Get("Content-Type"); got != "application/json" {
				t.Errorf("got Content-Type %q, want application/json", got)
			}
			var body struct {
				Error map[string]string `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if want := map[string]string{"type": "t", "code": "c", "message": "m"}; len(body.Error) != 3 ||
				body.Error["type"] != want["type"] || body.Error["code"] != want["code"] || body.Error["message"] != want["message"] {
				t.Errorf("got %v, want %v", body.Error, want)
			}
		})
	}
}

func TestBadRequest(t *testing.T) {
	e := badRequest("invalid_value", "'%s' is %d", "n", 99)
	if e.status != http.StatusBadRequest || e.typ != "invalid_request_error" || e.code != "invalid_value" || e.Error() != "'n' is 99" {
		t.Errorf("got %+v, want a 400 invalid_request_error invalid_value with message 'n' is 99", e)
	}
}

func TestCompletionBody(t *testing.T) {
	chat := events.RequestAccepted{RequestID: "r1", Model: "m", Endpoint: events.EndpointChat, PromptTokens: 4, Created: 100}
	compl := chat
	compl.Endpoint = events.EndpointCompletions
	cases := []struct {
		name    string
		acc     events.RequestAccepted
		choices []snapshot
		want    string
	}{
		{name: "chat, one choice, the frontend's prompt count", acc: chat,
			choices: []snapshot{{tokens: []string{"a", "b"}, total: 2, finishReason: "stop"}},
			want:    `{"choices":[{"finish_reason":"stop","index":0,"logprobs":null,"message":{"content":"ab","role":"assistant"}}],"created":100,"id":"chatcmpl-r1","model":"m","object":"chat.completion","usage":{"completion_tokens":2,"prompt_tokens":4,"total_tokens":6}}`},
		{name: "completions, the engine's prompt count wins", acc: compl,
			choices: []snapshot{{tokens: []string{"x"}, total: 1, finishReason: "length", promptTokens: 9}},
			want:    `{"choices":[{"finish_reason":"length","index":0,"logprobs":null,"text":"x"}],"created":100,"id":"cmpl-r1","model":"m","object":"text_completion","usage":{"completion_tokens":1,"prompt_tokens":9,"total_tokens":10}}`},
		{name: "n choices: tokens summed, the prompt counted once", acc: compl,
			choices: []snapshot{{tokens: []string{"x"}, total: 1, finishReason: "stop"}, {tokens: []string{"y", "z"}, total: 2, finishReason: "length", promptTokens: 7}},
			want:    `{"choices":[{"finish_reason":"stop","index":0,"logprobs":null,"text":"x"},{"finish_reason":"length","index":1,"logprobs":null,"text":"yz"}],"created":100,"id":"cmpl-r1","model":"m","object":"text_completion","usage":{"completion_tokens":3,"prompt_tokens":4,"total_tokens":7}}`},
		{name: "resumed from an offset: usage counts every token", acc: chat,
			choices: []snapshot{{tokens: []string{"c"}, total: 3, finishReason: "stop"}},
			want:    `{"choices":[{"finish_reason":"stop","index":0,"logprobs":null,"message":{"content":"c","role":"assistant"}}],"created":100,"id":"chatcmpl-r1","model":"m","object":"chat.completion","usage":{"completion_tokens":3,"prompt_tokens":4,"total_tokens":7}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := jsonOf(t, completionBody(tc.acc, tc.choices)); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}
