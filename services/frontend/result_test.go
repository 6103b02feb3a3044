package frontend

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/baton-dev/baton/streams"
)

// TestWriteResult: the one error mapping of the JSON handlers.
func TestWriteResult(t *testing.T) {
	cases := []struct {
		name       string
		res        result
		wantStatus int
		wantType   string // of the error; "" for a body
		wantCode   string
		wantRetry  string
		wantBody   string // for a body
	}{
		{name: "a body", res: okResult(map[string]any{"object": "list"}), wantStatus: 200, wantBody: `{"object":"list"}`},
		{name: "a status of its own", res: result{status: 202, body: []int{1}}, wantStatus: 202, wantBody: `[1]`},
		{name: "a bad request", res: errResult(badRequest("invalid_value", "no")), wantStatus: 400,
			wantType: "invalid_request_error", wantCode: "invalid_value"},
		{name: "a wrapped api error", res: errResult(fmt.Errorf("cancel: %w", badRequest("invalid_json", "no"))), wantStatus: 400,
			wantType: "invalid_request_error", wantCode: "invalid_json"},
		{name: "not found", res: errResult(notFound("r1")), wantStatus: 404,
			wantType: "invalid_request_error", wantCode: "request_not_found"},
		{name: "a lookup the log answered with nothing", res: errResult(&lookupError{id: "r1", err: fmt.Errorf("read: %w", streams.ErrNotFound)}),
			wantStatus: 404, wantType: "invalid_request_error", wantCode: "request_not_found"},
		{name: "a lookup the log could not answer", res: errResult(&lookupError{id: "r1", err: errors.New("nats: timeout")}),
			wantStatus: 500, wantType: "server_error", wantCode: "log_unavailable"},
		{name: "a server error", res: errResult(serverError("cancel_failed", errors.New("no stream"))), wantStatus: 500,
			wantType: "server_error", wantCode: "cancel_failed"},
		{name: "a 503 says when to retry", res: errResult(&apiError{status: 503, typ: "service_unavailable", code: "log_unavailable", message: "m"}),
			wantStatus: 503, wantType: "service_unavailable", wantCode: "log_unavailable", wantRetry: "1"},
		{name: "any other error", res: errResult(errors.New("boom")), wantStatus: 500,
			wantType: "server_error", wantCode: "internal_error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			writeResult(rec, tc.res)
			if rec.Code != tc.wantStatus {
				t.Errorf("got status %d, want %d", rec.Code, tc.wantStatus)
			}
			if got := rec.Header().Get("Retry-After"); got != tc.wantRetry {
				t.Errorf("got Retry-After %q, want %q", got, tc.wantRetry)
			}
			if tc.wantType == "" {
				if got := rec.Body.String(); got != tc.wantBody+"\n" {
					t.Errorf("got body %q, want %q", got, tc.wantBody+"\n")
				}
				return
			}
			var body struct {
				Error struct{ Type, Code, Message string } `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("got body %s: %v", rec.Body, err)
			}
			if body.Error.Type != tc.wantType || body.Error.Code != tc.wantCode || body.Error.Message == "" {
				t.Errorf("got error %+v, want type %s, code %s and a message", body.Error, tc.wantType, tc.wantCode)
			}
		})
	}
}
