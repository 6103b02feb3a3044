package frontend_test

import (
	"net/http"
	"testing"

	"github.com/baton-dev/baton/services/engine"
)

// TestRequestStateAndCancel: GET /v1/requests/{id} reads a request's state
// from the log, and POST .../cancel checks its body and says what it did:
// nothing for a request that ended, 404 for one that does not exist, 400
// for a mode that is not stop or kill.
func TestRequestStateAndCancel(t *testing.T) {
	url := inProcess(t, engine.MockConfig{SpeedupRatio: 1e9})
	code, body := call(t, http.MethodPost, url+"/v1/completions", `{"model":"mock","prompt":"state of it","max_tokens":3}`,
		map[string]string{"X-Request-Id": "st-1"})
	if code != http.StatusOK {
		t.Fatalf("create: %d %s", code, body)
	}
	code, body = call(t, http.MethodGet, url+"/v1/requests/st-1", "", nil)
	if st := decode(t, body); code != http.StatusOK || st["id"] != "st-1" || st["status"] != "completed" || st["model"] != "mock" {
		t.Errorf("state: %d %s, want st-1 completed", code, body)
	}
	if code, body := call(t, http.MethodGet, url+"/v1/requests/no-such", "", nil); code != http.StatusNotFound || errorOf(t, body)["code"] != "request_not_found" {
		t.Errorf("state of an unknown id: %d %s, want 404 request_not_found", code, body)
	}
	for _, tc := range []struct {
		name, id, body string
		want           int
		wantCode       string // of an error
		wantCancelled  bool
	}{
		{name: "an ended request", id: "st-1", body: `{"mode":"kill"}`, want: 200},
		{name: "no body: stop", id: "st-1", want: 200},
		{name: "an unknown mode", id: "st-1", body: `{"mode":"pause"}`, want: 400, wantCode: "invalid_value"},
		{name: "not JSON", id: "st-1", body: `{mode`, want: 400, wantCode: "invalid_json"},
		{name: "an unknown request", id: "no-such", body: `{"mode":"stop"}`, want: 404, wantCode: "request_not_found"},
		{name: "an invalid id", id: "not%20an%20id", body: `{"mode":"stop"}`, want: 404, wantCode: "request_not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := call(t, http.MethodPost, url+"/v1/requests/"+tc.id+"/cancel", tc.body, nil)
			if code != tc.want {
				t.Fatalf("got %d %s, want %d", code, body, tc.want)
			}
			if tc.wantCode != "" {
				if e := errorOf(t, body); e["code"] != tc.wantCode {
					t.Errorf("got %s, want code %s", body, tc.wantCode)
				}
				return
			}
			if c := decode(t, body); c["object"] != "request.cancel" || c["cancelled"] != tc.wantCancelled || c["status"] != "completed" {
				t.Errorf("got %s, want cancelled %v of a completed request", body, tc.wantCancelled)
			}
		})
	}
}
