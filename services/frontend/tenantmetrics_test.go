package frontend_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/services/frontend"
	"github.com/baton-dev/baton/services/frontend/tenants"
)

// TestTenantMetrics: the per-tenant series count alice's admitted creates,
// her tokens and the one her budget refused, labelled by her name, at GET
// /metrics/tenants, which only the admin's key reads (401 without a key,
// 403 with alice's); the public /metrics has none of them.
func TestTenantMetrics(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys")
	if err := os.WriteFile(keys, []byte("alice alice-0123456789abcdef\nadmin admin-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	url := inProcessWith(t, engine.MockConfig{SpeedupRatio: 1e9}, frontend.Config{APIKeysFile: keys, Tenants: tenants.Config{RPM: 20}})
	callAs := func(method, path, key, body string) (int, string) {
		t.Helper()
		var hdr map[string]string
		if key != "" {
			hdr = map[string]string{"Authorization": "Bearer " + key}
		}
		return call(t, method, url+path, body, hdr)
	}
	const chat = `{"model":"mock","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	var codes []int
	for range 3 { // rpm 20: a burst of 2
		code, _ := callAs(http.MethodPost, "/v1/chat/completions", "alice-0123456789abcdef", chat)
		codes = append(codes, code)
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 {
		t.Fatalf("alice's three creates: got %v, want 200 200 429", codes)
	}
	if code, _ := callAs(http.MethodGet, "/metrics/tenants", "", ""); code != http.StatusUnauthorized {
		t.Errorf("/metrics/tenants without a key: got %d, want 401", code)
	}
	if code, body := callAs(http.MethodGet, "/metrics/tenants", "alice-0123456789abcdef", ""); code != http.StatusForbidden || !strings.Contains(body, "permission_denied") {
		t.Errorf("/metrics/tenants with alice's key: got %d %s, want 403 permission_denied", code, body)
	}
	code, body := callAs(http.MethodGet, "/metrics/tenants", "admin-0123456789abcdef", "")
	if code != http.StatusOK {
		t.Fatalf("/metrics/tenants with the admin's key: got %d %s, want 200", code, body)
	}
	for _, want := range []string{
		`baton_tenant_admitted_total{endpoint="chat_completions",tenant="alice"} 2`,
		`baton_tenant_throttled_total{reason="requests",tenant="alice"} 1`,
		`baton_tenant_tokens_total{kind="completion",tenant="alice"} 8`,
		`baton_tenant_tokens_total{kind="prompt",tenant="alice"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics/tenants has no %s:\n%s", want, body)
		}
	}
	if code, body := callAs(http.MethodGet, "/v1/tenants/alice/usage", "alice-0123456789abcdef", ""); code != http.StatusOK ||
		!strings.Contains(body, `"here":{"admitted":2,"throttled":{"requests":1}`) {
		t.Errorf("alice's usage: got %d %s, want this frontend's counts of her", code, body)
	}
	if _, public := callAs(http.MethodGet, "/metrics", "", ""); strings.Contains(public, "baton_tenant_") || strings.Contains(public, `tenant="alice"`) {
		t.Error("the public /metrics names tenants")
	}
}
