package frontend_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/services/frontend"
)

// decode is body as a JSON object; the test fails on anything else.
func decode(t *testing.T, body string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	return m
}

// errorOf is the error object of an error answer's body.
func errorOf(t *testing.T, body string) map[string]any {
	t.Helper()
	e, _ := decode(t, body)["error"].(map[string]any)
	if e == nil {
		t.Fatalf("body %s: no error object", body)
	}
	return e
}

// TestResponseLifecycle: a response is created, read, listed, cancelled once
// ended (answered as it is), deleted, and then gone for every route and for
// a retry of its create under the same id; each answer is the object that
// openai.Response renders, the same on every route.
func TestResponseLifecycle(t *testing.T) {
	url := inProcess(t, engine.MockConfig{SpeedupRatio: 1e9})
	const create = `{"model":"mock","input":[{"role":"user","content":"one two"},{"role":"user","content":"three"}],"max_output_tokens":4}`
	hdr := map[string]string{"X-Request-Id": "resp_life"}
	code, body := call(t, http.MethodPost, url+"/v1/responses", create, hdr)
	if code != http.StatusOK {
		t.Fatalf("create: %d %s", code, body)
	}
	created := decode(t, body)
	// The mock answers up to max_output_tokens: incomplete, for that reason.
	if created["id"] != "resp_life" || created["object"] != "response" || created["status"] != "incomplete" {
		t.Fatalf("create: %s, want the ended response resp_life", body)
	}

	code, body = call(t, http.MethodGet, url+"/v1/responses/resp_life", "", nil)
	if code != http.StatusOK {
		t.Fatalf("get: %d %s", code, body)
	}
	got := decode(t, body)
	for _, k := range []string{"id", "status", "created_at", "model"} {
		if got[k] != created[k] {
			t.Errorf("get: %s is %v, want the create's %v", k, got[k], created[k])
		}
	}
	if g, c := mustJSON(t, got["output"]), mustJSON(t, created["output"]); g != c {
		t.Errorf("get: output %s, want the create's %s", g, c)
	}

	// The input items as sent, newest first by default.
	code, body = call(t, http.MethodGet, url+"/v1/responses/resp_life/input_items", "", nil)
	list := decode(t, body)
	data, _ := list["data"].([]any)
	if code != http.StatusOK || list["object"] != "list" || len(data) != 2 || !strings.Contains(mustJSON(t, data[0]), "three") {
		t.Errorf("input items: %d %s, want the two items, newest (three) first", code, body)
	}
	code, body = call(t, http.MethodGet, url+"/v1/responses/resp_life/input_items?order=asc&limit=1", "", nil)
	data, _ = decode(t, body)["data"].([]any)
	if code != http.StatusOK || len(data) != 1 || !strings.Contains(mustJSON(t, data[0]), "one two") {
		t.Errorf("input items asc, limit 1: %d %s, want the first item only", code, body)
	}
	code, body = call(t, http.MethodGet, url+"/v1/responses/resp_life/input_items?limit=0", "", nil)
	if e := errorOf(t, body); code != http.StatusBadRequest || e["param"] != "limit" {
		t.Errorf("input items limit=0: %d %s, want 400 about limit", code, body)
	}

	// A resume past the last event is refused, naming the parameter.
	code, body = call(t, http.MethodGet, url+"/v1/responses/resp_life?stream=true&starting_after=9999", "", nil)
	if e := errorOf(t, body); code != http.StatusBadRequest || e["param"] != "starting_after" || e["code"] != "invalid_value" {
		t.Errorf("a stream past its end: %d %s, want 400 invalid_value about starting_after", code, body)
	}

	// Cancelling a response that ended answers it as it is.
	code, body = call(t, http.MethodPost, url+"/v1/responses/resp_life/cancel", "", nil)
	if code != http.StatusOK || decode(t, body)["status"] != created["status"] {
		t.Errorf("cancel after the end: %d %s, want 200, still %v", code, body, created["status"])
	}

	// A retry of the create with another body under the same id is a conflict.
	code, body = call(t, http.MethodPost, url+"/v1/responses", `{"model":"mock","input":"another","max_output_tokens":4}`, hdr)
	if code != http.StatusConflict || errorOf(t, body)["code"] != "request_id_conflict" {
		t.Errorf("another body under the id: %d %s, want 409 request_id_conflict", code, body)
	}

	code, body = call(t, http.MethodDelete, url+"/v1/responses/resp_life", "", nil)
	if d := decode(t, body); code != http.StatusOK || d["deleted"] != true || d["id"] != "resp_life" {
		t.Fatalf("delete: %d %s, want deleted", code, body)
	}
	for _, r := range []struct{ method, path string }{
		{http.MethodGet, "/v1/responses/resp_life"},
		{http.MethodGet, "/v1/responses/resp_life/input_items"},
		{http.MethodPost, "/v1/responses/resp_life/cancel"},
		{http.MethodDelete, "/v1/responses/resp_life"},
	} {
		code, body := call(t, r.method, url+r.path, "", nil)
		if code != http.StatusNotFound || errorOf(t, body)["code"] != "response_not_found" {
			t.Errorf("%s %s after the delete: %d %s, want 404 response_not_found", r.method, r.path, code, body)
		}
	}
	code, body = call(t, http.MethodPost, url+"/v1/responses", create, hdr)
	if code != http.StatusConflict || !strings.Contains(errorOf(t, body)["message"].(string), "was deleted") {
		t.Errorf("the create again after the delete: %d %s, want 409: the response was deleted", code, body)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestResponseCreateRefused: what a create is refused for before anything
// is stored, each with OpenAI's status, code and param.
func TestResponseCreateRefused(t *testing.T) {
	url := inProcessWith(t, engine.MockConfig{SpeedupRatio: 1e9}, frontend.Config{MaxBodyBytes: 4096})
	code, chat := call(t, http.MethodPost, url+"/v1/chat/completions", `{"model":"mock","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`,
		map[string]string{"X-Request-Id": "a-chat"})
	if code != http.StatusOK {
		t.Fatalf("a chat: %d %s", code, chat)
	}
	for _, tc := range []struct {
		name      string
		body      string
		hdr       map[string]string
		want      int
		wantCode  string
		wantParam any // nil: not checked
	}{
		{name: "not JSON", body: `{`, want: 400, wantCode: "invalid_json"},
		{name: "no model", body: `{"input":"hi"}`, want: 400, wantParam: "model"},
		{name: "an unknown model", body: `{"model":"nope","input":"hi"}`, want: 404, wantCode: "model_not_found"},
		{name: "a body over --max-body-bytes", body: `{"model":"mock","input":"` + strings.Repeat("a", 5000) + `"}`, want: 413, wantCode: "request_too_large"},
		{name: "an invalid id", body: `{"model":"mock","input":"hi"}`, hdr: map[string]string{"X-Request-Id": "not an id!"}, want: 400, wantCode: "invalid_request_id"},
		{name: "an unknown previous response", body: `{"model":"mock","input":"hi","previous_response_id":"resp_none"}`, want: 404,
			wantCode: "previous_response_not_found", wantParam: "previous_response_id"},
		{name: "a chat's id as the previous response", body: `{"model":"mock","input":"hi","previous_response_id":"a-chat"}`, want: 404,
			wantCode: "previous_response_not_found"},
		{name: "a chat's id retried as a response", body: `{"model":"mock","input":"hi"}`, hdr: map[string]string{"X-Request-Id": "a-chat"}, want: 409,
			wantCode: "request_id_conflict"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := call(t, http.MethodPost, url+"/v1/responses", tc.body, tc.hdr)
			if code != tc.want {
				t.Fatalf("got %d %s, want %d", code, body, tc.want)
			}
			e := errorOf(t, body)
			if tc.wantCode != "" && e["code"] != tc.wantCode {
				t.Errorf("got code %v (%s), want %s", e["code"], body, tc.wantCode)
			}
			if tc.wantParam != nil && e["param"] != tc.wantParam {
				t.Errorf("got param %v (%s), want %v", e["param"], body, tc.wantParam)
			}
		})
	}
	// A chat is not a response on the Responses API's routes.
	if code, body := call(t, http.MethodGet, url+"/v1/responses/a-chat", "", nil); code != http.StatusNotFound {
		t.Errorf("GET a chat as a response: %d %s, want 404", code, body)
	}
}

// TestResponseChained: a response that names its previous one continues
// its conversation: its input items are its own, and its prompt holds the
// previous turns, so the mock answers what it answers that whole prompt.
func TestResponseChained(t *testing.T) {
	url := inProcess(t, engine.MockConfig{SpeedupRatio: 1e9})
	code, body := call(t, http.MethodPost, url+"/v1/responses", `{"model":"mock","input":"first","max_output_tokens":3}`,
		map[string]string{"X-Request-Id": "resp_first"})
	if code != http.StatusOK {
		t.Fatalf("first: %d %s", code, body)
	}
	code, body = call(t, http.MethodPost, url+"/v1/responses", `{"model":"mock","input":"second","max_output_tokens":3,"previous_response_id":"resp_first"}`,
		map[string]string{"X-Request-Id": "resp_second"})
	if code != http.StatusOK || decode(t, body)["previous_response_id"] != "resp_first" {
		t.Fatalf("second: %d %s, want a response after resp_first", code, body)
	}
	_, items := call(t, http.MethodGet, url+"/v1/responses/resp_second/input_items", "", nil)
	data, _ := decode(t, items)["data"].([]any)
	if len(data) != 1 || !strings.Contains(mustJSON(t, data[0]), "second") {
		t.Errorf("input items of the second: %s, want its own input only", items)
	}
	_, first := call(t, http.MethodGet, url+"/v1/requests/resp_first", "", nil)
	_, second := call(t, http.MethodGet, url+"/v1/requests/resp_second", "", nil)
	var a, b struct {
		PromptTokens int `json:"prompt_tokens"`
	}
	if json.Unmarshal([]byte(first), &a) != nil || json.Unmarshal([]byte(second), &b) != nil || b.PromptTokens <= a.PromptTokens+3 {
		t.Errorf("prompt tokens: first %s, second %s; want the second's to hold the first turn, its answer and its own input", first, second)
	}
}
