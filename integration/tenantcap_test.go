package integration

import (
	"encoding/json"
	"sync"
	"testing"
	"time"
)

// TestDefaultTenantCap: with API keys and no --tenant-max-concurrent, one
// tenant may hold a quarter of --max-connections open at once (formerly
// none was set, and one tenant could hold all 4,096 connection slots);
// --tenant-max-concurrent 0 disables it.
func TestDefaultTenantCap(t *testing.T) {
	s, f, keys := keyedStack(t, "--max-connections", "8") // a cap of 2 open per tenant
	alice, bob := apiClient{f.url, aliceKey}, apiClient{f.url, bobKey}
	var wg sync.WaitGroup
	for _, id := range []string{"hold-1", "hold-2"} {
		wg.Go(func() {
			alice.stream(t, map[string]any{"model": "mock", "prompt": "hold", "max_tokens": 5000}, map[string]string{"X-Request-Id": id}, nil)
		})
		waitFor(t, 10*time.Second, "alice's "+id+" to run", func() bool {
			var st requestState
			r := alice.get(t, "/v1/requests/"+id)
			return r.status == 200 && json.Unmarshal(r.body, &st) == nil && st.TokensGenerated > 0
		})
	}
	data, _ := bodyOf(map[string]any{"model": "mock", "prompt": "third", "max_tokens": 2})
	alice.do(t, "POST", "/v1/completions", data, nil).want(t, "alice's third concurrent request", 429, "concurrency_limit_exceeded")
	if r := bob.do(t, "POST", "/v1/completions", data, nil); r.status != 200 {
		t.Errorf("bob while alice is at her cap: %d %s", r.status, r.body)
	}
	for _, id := range []string{"hold-1", "hold-2"} {
		if r := alice.do(t, "POST", "/v1/requests/"+id+"/cancel", []byte(`{"mode":"kill"}`), nil); r.status != 200 {
			t.Fatalf("cancel %s: %d %s", id, r.status, r.body)
		}
	}
	wg.Wait()

	g := s.frontend(nil, "--api-keys-file", keys, "--max-connections", "8", "--tenant-max-concurrent", "0")
	alice = apiClient{g.url, aliceKey}
	for _, id := range []string{"open-1", "open-2", "open-3"} {
		wg.Go(func() {
			alice.stream(t, map[string]any{"model": "mock", "prompt": "open", "max_tokens": 5000}, map[string]string{"X-Request-Id": id}, nil)
		})
	}
	waitFor(t, 10*time.Second, "alice's three requests to run with the cap off", func() bool {
		for _, id := range []string{"open-1", "open-2", "open-3"} {
			var st requestState
			r := alice.get(t, "/v1/requests/"+id)
			if r.status != 200 || json.Unmarshal(r.body, &st) != nil || st.TokensGenerated == 0 {
				return false
			}
		}
		return true
	})
	for _, id := range []string{"open-1", "open-2", "open-3"} {
		alice.do(t, "POST", "/v1/requests/"+id+"/cancel", []byte(`{"mode":"kill"}`), nil)
	}
	wg.Wait()
}
