package frontend

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

func TestWriteUnary(t *testing.T) {
	acc := events.RequestAccepted{RequestID: "r", Model: "m", Endpoint: events.EndpointCompletions, PromptTokens: 3}
	for _, tc := range []struct {
		name       string
		s          snapshot
		wantStatus int
		wantType   string
		wantCode   string
		wantRetry  bool
	}{
		{"completed", snapshot{acc: acc, status: projections.StatusCompleted, tokens: []string{"a ", "b "}, total: 2, finishReason: "length"},
			200, "", "", false},
		{"no token produced, migration impossible: 503 with Retry-After",
			snapshot{acc: acc, status: projections.StatusFailed, failure: &events.RequestFailed{Code: "migration_disabled", Message: "m", Status: 503}},
			503, "service_unavailable", "migration_disabled", true},
		{"truncated: 500", snapshot{acc: acc, status: projections.StatusFailed, failure: &events.RequestFailed{Code: "migration_exhausted", Message: "m", Status: 500}},
			500, "server_error", "migration_exhausted", false},
		{"no status recorded: 500", snapshot{acc: acc, status: projections.StatusFailed, failure: &events.RequestFailed{Code: "x", Message: "m"}},
			500, "server_error", "x", false},
		{"the upstream rejected the request: its status", snapshot{acc: acc, status: projections.StatusFailed,
			failure: &events.RequestFailed{Code: "context_length_exceeded", Message: "too long", Status: 422}},
			422, "invalid_request_error", "context_length_exceeded", false},
		{"killed: 499", snapshot{acc: acc, status: projections.StatusCancelled, cancel: &events.RequestCancelled{Mode: events.CancelKill, Reason: "by API"}},
			499, "cancelled", "request_cancelled", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			ok := writeUnary(rec, tc.s)
			if ok != (tc.wantStatus == 200) || rec.Code != tc.wantStatus {
				t.Fatalf("status %d ok %v, want %d", rec.Code, ok, tc.wantStatus)
			}
			if got := rec.Header().Get("Retry-After") != ""; got != tc.wantRetry {
				t.Errorf("Retry-After %q, want set %v", rec.Header().Get("Retry-After"), tc.wantRetry)
			}
			var body struct {
				Error *struct{ Type, Code, Message string } `json:"error"`
				Usage map[string]int                        `json:"usage"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %s: %v", rec.Body, err)
			}
			if tc.wantStatus == 200 {
				if body.Error != nil || body.Usage["completion_tokens"] != 2 || body.Usage["total_tokens"] != 5 {
					t.Errorf("body %s, want a completion with 2 completion tokens", rec.Body)
				}
				return
			}
			if body.Error == nil || body.Error.Type != tc.wantType || body.Error.Code != tc.wantCode || body.Error.Message == "" {
				t.Errorf("error %+v, want type %s code %s and a message", body.Error, tc.wantType, tc.wantCode)
			}
		})
	}
}

func TestSSEWriter(t *testing.T) {
	for _, tc := range []struct {
		name     string
		endpoint string
		write    func(s *sseWriter)
		want     []string // the data lines, in order
	}{
		{"chat: the first chunk names the role", events.EndpointChat, func(s *sseWriter) {
			s.delta(2, 0, []string{"a b "}, nil, true)
			s.delta(3, 0, []string{"c "}, nil, false)
			s.finish(3, 0, "stop")
			s.done(3)
		}, []string{
			`{"choices":[{"delta":{"content":"a b ","role":"assistant"},"finish_reason":null,"index":0,"logprobs":null}],"created":7,"id":"chatcmpl-r","model":"m","object":"chat.completion.chunk"}`,
			`{"choices":[{"delta":{"content":"c "},"finish_reason":null,"index":0,"logprobs":null}],"created":7,"id":"chatcmpl-r","model":"m","object":"chat.completion.chunk"}`,
			`{"choices":[{"delta":{},"finish_reason":"stop","index":0}],"created":7,"id":"chatcmpl-r","model":"m","object":"chat.completion.chunk"}`,
			`[DONE]`,
		}},
		{"completions: choice index and usage", events.EndpointCompletions, func(s *sseWriter) {
			s.delta(1, 1, []string{"a "}, nil, true)
			s.usage(1, map[string]any{"completion_tokens": 1})
		}, []string{
			`{"choices":[{"finish_reason":null,"index":1,"logprobs":null,"text":"a "}],"created":7,"id":"cmpl-r","model":"m","object":"text_completion"}`,
			`{"choices":[],"created":7,"id":"cmpl-r","model":"m","object":"text_completion","usage":{"completion_tokens":1}}`,
		}},
		{"error event", events.EndpointCompletions, func(s *sseWriter) {
			s.error(4, errorBody("server_error", "x", "y"))
		}, []string{`{"error":{"code":"x","message":"y","type":"server_error"}}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			s := &sseWriter{w: rec, acc: events.RequestAccepted{RequestID: "r", Model: "m", Endpoint: tc.endpoint, Created: 7}}
			tc.write(s)
			var data []string
			for _, ev := range strings.Split(strings.TrimSuffix(rec.Body.String(), "\n\n"), "\n\n") {
				id, d, ok := strings.Cut(ev, "\ndata: ")
				if !ok || !strings.HasPrefix(id, "id: ") {
					t.Fatalf("event %q: want id and data lines", ev)
				}
				data = append(data, d)
			}
			if strings.Join(data, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("data:\n%s\nwant:\n%s", strings.Join(data, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}
