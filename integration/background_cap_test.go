package integration

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"
)

// TestBackgroundResponsesCap: under --tenant-max-concurrent 2 a tenant's two
// background responses hold both of its slots until they end, with no
// client reading them: a third background create and a stream get 429, as
// the reads of the two do not (formerly 8 of 8 background creates were
// accepted under a cap of 2, issue 32); another tenant is served; once one
// is cancelled on another frontend and the other completes, the tenant's
// creates are accepted again.
func TestBackgroundResponsesCap(t *testing.T) {
	s, f1, keys := keyedStack(t, "--tenant-max-concurrent", "2")
	f2 := s.frontend(nil, "--api-keys-file", keys)
	alice, bob := apiClient{f1.url, aliceKey}, apiClient{f1.url, bobKey}
	create := func(c apiClient, body string) (apiResult, string) {
		t.Helper()
		r := c.do(t, http.MethodPost, "/v1/responses", []byte(body), nil)
		var obj struct{ ID string }
		_ = json.Unmarshal(r.body, &obj)
		return r, obj.ID
	}
	const long = `{"model":"mock","input":"held","max_output_tokens":30000,"background":true}`
	const short = `{"model":"mock","input":"short","max_output_tokens":400,"background":true}` // 2 s at 200 tokens/s
	r, longID := create(alice, long)
	r.want(t, "alice's first background create", 200, "")
	r, shortID := create(alice, short)
	r.want(t, "alice's second background create", 200, "")
	r, _ = create(alice, long)
	r.want(t, "alice's third background create", 429, "concurrency_limit_exceeded")
	chat, _ := bodyOf(map[string]any{"model": "mock", "messages": []map[string]string{{"role": "user", "content": "hi"}}, "stream": true, "max_tokens": 2})
	alice.do(t, http.MethodPost, "/v1/chat/completions", chat, nil).want(t, "a stream of alice beside two background responses", 429, "concurrency_limit_exceeded")
	alice.get(t, "/v1/responses/"+longID).want(t, "a read of a background response at the cap", 200, "")
	if r, _ := create(bob, short); r.status != 200 {
		t.Errorf("bob while alice is at her cap: %d %s", r.status, r.body)
	}
	// Cancelled on the other frontend; the short one completes by itself.
	(apiClient{f2.url, aliceKey}).do(t, http.MethodPost, "/v1/responses/"+longID+"/cancel", nil, nil).want(t, "cancel on frontend 2", 200, "")
	waitFor(t, 20*time.Second, "alice's creates accepted once her responses ended", func() bool {
		var obj struct{ Status string }
		g := alice.get(t, "/v1/responses/"+shortID)
		if json.Unmarshal(g.body, &obj) != nil || obj.Status == "queued" || obj.Status == "in_progress" {
			return false
		}
		for range 2 {
			if r, _ := create(alice, `{"model":"mock","input":"after","max_output_tokens":2,"background":true}`); r.status != 200 {
				return false
			}
		}
		return true
	})
}
