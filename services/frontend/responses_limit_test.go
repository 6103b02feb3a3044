package frontend_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/services/frontend"
	"github.com/baton-dev/baton/services/frontend/tenants"
)

// waitUntil polls cond until it holds or the deadline passes.
func waitUntil(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestBackgroundResponsesCount: a background response counts once against
// its tenant's --tenant-max-concurrent from its create until it ends,
// whether or not a client reads it, and a reader does not count it again
// (formerly it counted only while its create's handler ran: 8 of 8
// background creates were accepted under a cap of 2).
func TestBackgroundResponsesCount(t *testing.T) {
	url := inProcessWith(t, engine.MockConfig{TokensPerSec: 50, TTFT: time.Millisecond}, frontend.Config{Tenants: tenants.Config{MaxConcurrent: 2}})
	create := func(body string) (int, string, string) {
		t.Helper()
		code, b := call(t, http.MethodPost, url+"/v1/responses", body, nil)
		var obj struct{ ID string }
		_ = json.Unmarshal([]byte(b), &obj)
		return code, obj.ID, b
	}
	const long = `{"model":"mock","input":"a long one","max_output_tokens":30000,"background":true}`
	const short = `{"model":"mock","input":"a short one","max_output_tokens":10,"background":true}`
	code, longID, b := create(long)
	if code != 200 {
		t.Fatalf("the first background create: %d %s", code, b)
	}
	// A background create that streams counts once too: it runs at a cap of 2
	// beside the first, and its stream is not counted again.
	resp := open(t, http.MethodPost, url+"/v1/responses",
		`{"model":"mock","input":"a streamed one","max_output_tokens":10,"background":true,"stream":true}`, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("a streamed background create beside one: %d, want 200", resp.StatusCode)
	}
	resp.Body.Close() // a background response keeps running without its client
	refused := func(what, body string, path string) {
		t.Helper()
		code, b := call(t, http.MethodPost, url+path, body, nil)
		if code != http.StatusTooManyRequests || !strings.Contains(b, `"code":"concurrency_limit_exceeded"`) ||
			!strings.Contains(b, "at most 2 open at once for this API key") {
			t.Errorf("%s with two background responses running: %d %s, want 429 concurrency_limit_exceeded", what, code, b)
		}
	}
	refused("a third background create", long, "/v1/responses")
	refused("a stream", `{"model":"mock","messages":[{"role":"user","content":"hi"}],"stream":true}`, "/v1/chat/completions")
	refused("a create", `{"model":"mock","input":"x"}`, "/v1/responses")

	// Readers of a background response are not counted again.
	if code, b := call(t, http.MethodGet, url+"/v1/responses/"+longID, "", nil); code != 200 {
		t.Errorf("GET of a background response at the cap: %d %s, want 200", code, b)
	}
	resp = open(t, http.MethodGet, url+"/v1/responses/"+longID+"?stream=true", "", nil)
	if resp.StatusCode != 200 {
		t.Errorf("a streamed read of a background response at the cap: %d, want 200", resp.StatusCode)
	}
	resp.Body.Close()
	resp = open(t, http.MethodGet, url+"/v1/requests/"+longID+"/stream", "", nil)
	if resp.StatusCode != 200 {
		t.Errorf("a resume of a background response at the cap: %d, want 200", resp.StatusCode)
	}
	resp.Body.Close()

	// The streamed one completes on its own: its slot comes back.
	var shortID string
	waitUntil(t, "a create accepted once the streamed background response completed", 20*time.Second, func() bool {
		code, shortID, _ = create(short)
		return code == 200
	})
	refused("a create beside two background responses", short, "/v1/responses")
	// Cancelled: its slot comes back too.
	if code, b := call(t, http.MethodPost, url+"/v1/responses/"+longID+"/cancel", "", nil); code != 200 {
		t.Fatalf("cancel: %d %s", code, b)
	}
	var lastID string
	waitUntil(t, "a create accepted once a background response was cancelled", 20*time.Second, func() bool {
		code, lastID, _ = create(short)
		return code == 200
	})
	// Nothing left running: the stack stops at once.
	for _, id := range []string{shortID, lastID} {
		waitUntil(t, id+" to complete", 20*time.Second, func() bool {
			_, b := call(t, http.MethodGet, url+"/v1/responses/"+id, "", nil)
			return strings.Contains(b, `"status":"incomplete"`) || strings.Contains(b, `"status":"completed"`)
		})
	}
}
