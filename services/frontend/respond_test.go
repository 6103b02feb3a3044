package frontend

import (
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/frontend/openai"
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
		{"completed", snapshot{Choice: openai.Choice{Tokens: []string{"a ", "b "}, Total: 2, FinishReason: "length"}, acc: acc, status: projections.StatusCompleted},
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
