package frontend_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/baton-dev/baton/services/engine"
)

// call sends method path with body and headers to url and returns the
// status and the body.
func call(t *testing.T, method, url, body string, hdr map[string]string) (int, string) {
	t.Helper()
	resp := open(t, method, url, body, hdr)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// open sends method with body (JSON) and headers to url and returns the
// answer with its body unread, for a test that reads a stream as it comes
// or leaves it open: the caller closes it.
func open(t *testing.T, method, url, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// sseIDs are the ids of the events of an SSE body.
func sseIDs(body string) []int {
	var ids []int
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
			n, _ := strconv.Atoi(v)
			ids = append(ids, n)
		}
	}
	return ids
}

// TestResponsesHeaders: the Responses API honours or refuses X-Worker-Id,
// X-Parent-Request-Id and Last-Event-ID as chat does (formerly it ignored
// them, invalid ones included): 404 for an unknown worker or parent, 400 for
// an invalid value, a pin and a parent recorded, a stream resumed after the
// sequence number named.
func TestResponsesHeaders(t *testing.T) {
	url := inProcess(t, engine.MockConfig{SpeedupRatio: 1e9})
	const create = `{"model":"mock","input":"one two three","max_output_tokens":4}`
	code, parent := call(t, http.MethodPost, url+"/v1/chat/completions", `{"model":"mock","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`,
		map[string]string{"X-Request-Id": "the-parent"})
	if code != 200 {
		t.Fatalf("the parent chat: %d %s", code, parent)
	}
	for _, tc := range []struct {
		name     string
		path     string // "": POST /v1/responses
		body     string
		hdr      map[string]string
		want     int
		wantCode string
	}{
		{name: "an unknown worker", hdr: map[string]string{"X-Worker-Id": "w9"}, want: 404, wantCode: "worker_not_found"},
		{name: "an invalid parent", hdr: map[string]string{"X-Parent-Request-Id": "not an id!"}, want: 400, wantCode: "invalid_parent_id"},
		{name: "an unknown parent", hdr: map[string]string{"X-Parent-Request-Id": "no-such-request"}, want: 404, wantCode: "parent_not_found"},
		{name: "Last-Event-ID not a number", hdr: map[string]string{"Last-Event-ID": "abc"}, want: 400, wantCode: "invalid_value"},
		{name: "Last-Event-ID negative", hdr: map[string]string{"Last-Event-ID": "-1"}, want: 400, wantCode: "invalid_value"},
		{name: "a GET with Last-Event-ID not a number", path: "/v1/responses/resp_x?stream=true", hdr: map[string]string{"Last-Event-ID": "x"}, want: 400, wantCode: "invalid_value"},
		{name: "a known worker", hdr: map[string]string{"X-Worker-Id": "w1"}, want: 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method, path, body := http.MethodPost, "/v1/responses", create
			if tc.path != "" {
				method, path, body = http.MethodGet, tc.path, ""
			}
			code, got := call(t, method, url+path, body, tc.hdr)
			if code != tc.want || tc.wantCode != "" && !strings.Contains(got, `"code":"`+tc.wantCode+`"`) {
				t.Errorf("got %d %s, want %d %s", code, got, tc.want, tc.wantCode)
			}
		})
	}

	// A child of the chat, pinned to w1.
	code, body := call(t, http.MethodPost, url+"/v1/responses", create,
		map[string]string{"X-Request-Id": "resp_child", "X-Parent-Request-Id": "the-parent", "X-Worker-Id": "w1"})
	if code != 200 {
		t.Fatalf("a child response: %d %s", code, body)
	}
	var st struct {
		Worker   string   `json:"worker"`
		ParentID string   `json:"parent_id"`
		Children []string `json:"children"`
	}
	if _, b := call(t, http.MethodGet, url+"/v1/requests/resp_child", "", nil); json.Unmarshal([]byte(b), &st) != nil || st.ParentID != "the-parent" || st.Worker != "w1" {
		t.Errorf("the child: %s, want parent_id the-parent on worker w1", b)
	}
	if _, b := call(t, http.MethodGet, url+"/v1/requests/the-parent", "", nil); json.Unmarshal([]byte(b), &st) != nil || len(st.Children) != 1 || st.Children[0] != "resp_child" {
		t.Errorf("the parent: %s, want child resp_child", b)
	}

	// Last-Event-ID resumes a stream after it, on a GET and on a retried create.
	const streamed = `{"model":"mock","input":"one two three","max_output_tokens":4,"stream":true}`
	hdr := map[string]string{"X-Request-Id": "resp_streamed"}
	code, body = call(t, http.MethodPost, url+"/v1/responses", streamed, hdr)
	all := sseIDs(body)
	if code != 200 || len(all) < 6 || all[0] != 0 {
		t.Fatalf("the stream: %d, ids %v", code, all)
	}
	past := all[len(all)-1] + 1
	for _, tc := range []struct {
		name, method, path, body string
	}{
		{"GET", http.MethodGet, "/v1/responses/resp_streamed?stream=true", ""},
		{"a retried create", http.MethodPost, "/v1/responses", streamed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := call(t, tc.method, url+tc.path, tc.body, map[string]string{"X-Request-Id": "resp_streamed", "Last-Event-ID": "3"})
			if ids := sseIDs(body); code != 200 || len(ids) != len(all)-4 || ids[0] != 4 {
				t.Errorf("after Last-Event-ID 3: %d, ids %v, want %v", code, ids, all[4:])
			}
			code, body = call(t, tc.method, url+tc.path, tc.body, map[string]string{"X-Request-Id": "resp_streamed", "Last-Event-ID": strconv.Itoa(past)})
			if code != 400 || !strings.Contains(body, "'Last-Event-ID' "+strconv.Itoa(past)+" is past the last event") {
				t.Errorf("after the last event: %d %s, want 400 past the last event", code, body)
			}
			if tc.method != http.MethodGet {
				return
			}
			code, body = call(t, tc.method, url+tc.path+"&starting_after=1", tc.body, map[string]string{"Last-Event-ID": "3"})
			if ids := sseIDs(body); code != 200 || len(ids) == 0 || ids[0] != 2 {
				t.Errorf("starting_after 1 beside Last-Event-ID 3: %d, ids %v, want from 2 (starting_after wins)", code, ids)
			}
		})
	}
}
