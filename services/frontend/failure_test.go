package frontend

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

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
