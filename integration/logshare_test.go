package integration

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestTenantLogShare: alice, with log=0.3 of a 2 MB log (her share's
// high-water mark 540 KB), fills it with two long background responses in
// flight (100 tokens/s each: about 70 KB/s of deltas), and her next creates get 503 log_full with Retry-After on both
// frontends (the second learns her bytes from the first through the
// budgets bucket), while bob is served on both and the log as a whole is
// below its high-water mark; once her responses are cancelled and
// compacted she is admitted again.
func TestTenantLogShare(t *testing.T) {
	s := newStack(t)
	keys, budgets := filepath.Join(s.dir, "keys"), filepath.Join(s.dir, "budgets")
	writeKeys(t, keys, "alice "+aliceKey, "bob "+bobKey, "admin "+adminKey)
	if err := os.WriteFile(budgets, []byte("alice log=0.3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--api-keys-file", keys, "--tenant-budgets-file", budgets, "--stream-max-bytes", "2000000"}
	f1 := s.frontend(nil, args...)
	f2 := s.frontend(nil, args...)
	s.worker("w1", "--mock-tokens-per-sec", "100", "--mock-ttft", "1ms")
	waitRoutableAs(t, apiClient{f1.url, adminKey}, "w1")
	waitRoutableAs(t, apiClient{f2.url, adminKey}, "w1")

	create := func(c apiClient, body string) (apiResult, string) {
		t.Helper()
		r := c.do(t, http.MethodPost, "/v1/responses", []byte(body), nil)
		var obj struct{ ID string }
		_ = json.Unmarshal(r.body, &obj)
		return r, obj.ID
	}
	const long = `{"model":"mock","input":"fill my share","max_output_tokens":30000,"background":true}`
	const short = `{"model":"mock","input":"short","max_output_tokens":2}`
	alice1, alice2 := apiClient{f1.url, aliceKey}, apiClient{f2.url, aliceKey}
	var ids []string
	for range 2 {
		r, id := create(alice1, long)
		r.want(t, "alice's long background response", http.StatusOK, "")
		ids = append(ids, id)
	}
	waitFor(t, 60*time.Second, "alice's creates on frontend 1 to be refused for her share", func() bool {
		r, _ := create(alice1, short)
		switch {
		case r.status == http.StatusOK:
			return false
		case r.status == http.StatusServiceUnavailable && r.code == "log_full":
			if r.header.Get("Retry-After") == "" {
				t.Errorf("503 log_full without Retry-After")
			}
			return true
		}
		t.Fatalf("alice's create: got %d %s, want 200 or 503 log_full", r.status, r.body)
		return false
	})
	waitFor(t, 10*time.Second, "alice's creates on frontend 2 refused too", func() bool {
		r, _ := create(alice2, short)
		return r.status == http.StatusServiceUnavailable && r.code == "log_full"
	})
	for _, f := range []*frontend{f1, f2} {
		if r, _ := create(apiClient{f.url, bobKey}, short); r.status != http.StatusOK {
			t.Errorf("bob while alice is over her share: got %d %s, want 200", r.status, r.body)
		}
	}
	resp, err := http.Get(f1.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/health while only alice is over her share: got %d, want 200", resp.StatusCode)
	}
	var usage struct {
		Log struct {
			Bytes      int64 `json:"bytes"`
			LimitBytes int64 `json:"limit_bytes"`
		} `json:"log"`
	}
	r := apiClient{f2.url, aliceKey}.get(t, "/v1/tenants/alice/usage")
	if r.status != http.StatusOK || json.Unmarshal(r.body, &usage) != nil || usage.Log.LimitBytes != 540000 || usage.Log.Bytes < usage.Log.LimitBytes {
		t.Errorf("alice's usage: got %d %s, want her log bytes at or above a limit of 540000", r.status, r.body)
	}

	// Her responses cancelled, compacted: she is admitted again.
	for _, id := range ids {
		alice1.do(t, http.MethodPost, "/v1/responses/"+id+"/cancel", nil, nil).want(t, "cancel alice's response", http.StatusOK, "")
	}
	waitFor(t, 30*time.Second, "alice admitted again on both frontends", func() bool {
		r1, _ := create(alice1, short)
		r2, _ := create(alice2, short)
		return r1.status == http.StatusOK && r2.status == http.StatusOK
	})
}
