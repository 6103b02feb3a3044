package frontend

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/frontend/openai"
)

// TestParserErrorsAnswered: a chat or completion the parser refuses is
// answered in OpenAI's error shape with the parser's status, type, code and
// message, and a "param" key only when the parser names the field at fault
// (chat's errors never carried "param": null).
func TestParserErrorsAnswered(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		wantCode   string
		wantParam  any // nil: no "param" key
	}{
		{name: "no model", body: `{"messages":[{"role":"user","content":"hi"}]}`, wantCode: "missing_model"},
		{name: "temperature out of range", body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":3}`, wantCode: "invalid_value", wantParam: "temperature"},
		{name: "seed not an integer", body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"seed":1.5}`, wantCode: "invalid_type", wantParam: "seed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, perr := openai.ParseCompletion(events.EndpointChat, []byte(tc.body), DefaultMaxTokens, DefaultMaxTokensLimit)
			if perr == nil {
				t.Fatalf("got accepted, want %s", tc.wantCode)
			}
			rec := httptest.NewRecorder()
			writeAPIError(rec, paramError(perr))
			var got struct {
				Error map[string]any `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatalf("got body %s: %v", rec.Body, err)
			}
			if rec.Code != http.StatusBadRequest || got.Error["code"] != tc.wantCode || got.Error["type"] != "invalid_request_error" || got.Error["message"] != perr.Message {
				t.Errorf("got %d %v, want 400 invalid_request_error %s %q", rec.Code, got.Error, tc.wantCode, perr.Message)
			}
			param, has := got.Error["param"]
			if tc.wantParam == nil && has {
				t.Errorf("got param %v, want no param key", param)
			}
			if tc.wantParam != nil && param != tc.wantParam {
				t.Errorf("got param %v, want %v", param, tc.wantParam)
			}
		})
	}
}
