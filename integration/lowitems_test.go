package integration

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestTenantIDsStayTheTenants: the Low items of issue 23 about request ids.
// A tenant's OpenAI response id is its own id (formerly "cmpl-alice:…"); an
// invalid X-Request-Id is not echoed (formerly 100,000 bytes came back in
// a header); the admin cannot create a request in alice's namespace, which
// formerly made alice's own id answer her 404.
func TestTenantIDsStayTheTenants(t *testing.T) {
	_, f, _ := keyedStack(t)
	alice, admin := apiClient{f.url, aliceKey}, apiClient{f.url, adminKey}
	data, _ := json.Marshal(map[string]any{"model": "mock", "prompt": "ids", "max_tokens": 2})
	r := alice.do(t, "POST", "/v1/completions", data, map[string]string{"X-Request-Id": "a-done"})
	var out struct {
		ID string `json:"id"`
	}
	if r.status != 200 || json.Unmarshal(r.body, &out) != nil || out.ID != "cmpl-a-done" || r.header.Get("X-Request-Id") != "a-done" {
		t.Errorf("alice's completion: %d, id %q, X-Request-Id %q; want 200, cmpl-a-done, a-done: %s", r.status, out.ID, r.header.Get("X-Request-Id"), r.body)
	}
	long := strings.Repeat("x", 100_000)
	r = alice.do(t, "POST", "/v1/completions", data, map[string]string{"X-Request-Id": long})
	r.want(t, "a 100,000-byte X-Request-Id", 400, "invalid_request_id")
	if got := r.header.Get("X-Request-Id"); got != "" {
		t.Errorf("the invalid X-Request-Id was echoed (%d bytes)", len(got))
	}
	admin.do(t, "POST", "/v1/completions", data, map[string]string{"X-Request-Id": "alice:x1"}).
		want(t, "the admin creating alice:x1", 400, "invalid_request_id")
	if r := alice.do(t, "POST", "/v1/completions", data, map[string]string{"X-Request-Id": "x1"}); r.status != 200 {
		t.Errorf("alice's own x1 after the admin's try: %d %s", r.status, r.body)
	}
	// The admin still names alice's request by its internal id.
	if r := admin.get(t, "/v1/requests/alice:x1"); r.status != 200 {
		t.Errorf("the admin's GET of alice:x1: %d", r.status)
	}
}
