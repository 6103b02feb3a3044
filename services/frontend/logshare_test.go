package frontend_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/waitfor"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/services/frontend"
	"github.com/baton-dev/baton/services/frontend/tenants"
)

// TestLogShareEstimate: a finished request of a tenant with a share of the
// log counts as its compact record: 1,536 B, its body and 17 B a token
// (logshare.go's figures), in its usage's log bytes, and stays so (an
// estimate converted twice once the request was no longer followed was 20
// times low in its tokens).
func TestLogShareEstimate(t *testing.T) {
	dir := t.TempDir()
	keys, budgets := filepath.Join(dir, "keys"), filepath.Join(dir, "budgets")
	if err := os.WriteFile(keys, []byte("alice alice-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(budgets, []byte("alice log=0.5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	url := inProcessWith(t, engine.MockConfig{SpeedupRatio: 1e9}, frontend.Config{APIKeysFile: keys, Tenants: tenants.Config{BudgetsFile: budgets}})
	call := func(method, path, body string) (int, []byte) {
		t.Helper()
		resp := open(t, method, url+path, body, map[string]string{"Authorization": "Bearer alice-0123456789abcdef"})
		defer resp.Body.Close()
		var b json.RawMessage
		_ = json.NewDecoder(resp.Body).Decode(&b)
		return resp.StatusCode, b
	}
	const chat = `{"model":"mock","messages":[{"role":"user","content":"count me"}],"max_tokens":20}`
	if code, body := call(http.MethodPost, "/v1/chat/completions", chat); code != http.StatusOK {
		t.Fatalf("alice's create: got %d %s", code, body)
	}
	want := int64(1536 + len(chat) + 20*17)
	logBytes := func() int64 {
		var u struct {
			Log struct {
				Bytes int64 `json:"bytes"`
			} `json:"log"`
		}
		code, body := call(http.MethodGet, "/v1/tenants/alice/usage", "")
		if code != http.StatusOK || json.Unmarshal(body, &u) != nil {
			t.Fatalf("usage: got %d %s", code, body)
		}
		return u.Log.Bytes
	}
	waitfor.Poll(t, fmt.Sprintf("alice's log bytes to be %d", want), func() bool { return logBytes() == want })
	// Three ticks later it is still the finished request's estimate.
	for end := time.Now().Add(1600 * time.Millisecond); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if got := logBytes(); got != want {
			t.Fatalf("alice's log bytes later: got %d, want %d", got, want)
		}
	}
}
