package tenants

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/frontend/apikeys"
)

// newGate is a gate on its own, not started: no shared budgets, no log
// shares, no fair queue.
func newGate(t *testing.T, cfg Config, keys *apikeys.Keyring) *Gate {
	t.Helper()
	g, err := New(cfg, Deps{ID: "fe-test", Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// keysAndBudgets writes a keys file and a budgets file of these lines, and
// loads the keys.
func keysAndBudgets(t *testing.T, keyLines, budgetLines string) (*apikeys.Keyring, string) {
	t.Helper()
	dir := t.TempDir()
	keysFile, budgets := filepath.Join(dir, "keys"), filepath.Join(dir, "budgets")
	if err := os.WriteFile(keysFile, []byte(keyLines), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(budgets, []byte(budgetLines), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, err := apikeys.Load(keysFile)
	if err != nil {
		t.Fatal(err)
	}
	return keys, budgets
}

// TestRefusalWrite: a refusal is OpenAI's error shape with its status, and
// Retry-After in whole seconds, at least 1.
func TestRefusalWrite(t *testing.T) {
	for _, tc := range []struct {
		wait time.Duration
		want string
	}{{0, "1"}, {300 * time.Millisecond, "1"}, {1500 * time.Millisecond, "2"}, {4 * time.Second, "4"}} {
		w := httptest.NewRecorder()
		(&Refusal{Status: http.StatusTooManyRequests, Type: "requests", Code: "rate_limit_exceeded", Message: "slow down", RetryAfter: tc.wait}).Write(w)
		var body struct {
			Error struct{ Message, Type, Code string }
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != tc.want ||
			body.Error.Code != "rate_limit_exceeded" || body.Error.Type != "requests" || body.Error.Message != "slow down" {
			t.Errorf("wait %v: got %d Retry-After %q %s, want 429 Retry-After %s rate_limit_exceeded", tc.wait, w.Code, w.Header().Get("Retry-After"), w.Body, tc.want)
		}
	}
}

// TestGateConcurrency: --tenant-max-concurrent caps a tenant's slots, the
// refusal is 429 concurrency_limit_exceeded naming the cap and counted as
// "concurrent"; a released slot is given back; a budgets file's
// concurrent=N replaces the cap for its tenant, and a reload changes it.
func TestGateConcurrency(t *testing.T) {
	file := filepath.Join(t.TempDir(), "budgets")
	if err := os.WriteFile(file, []byte("alice concurrent=1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g := newGate(t, Config{MaxConcurrent: 2, BudgetsFile: file}, nil)
	ctx := t.Context()
	acquire := func(tenant string) *Refusal {
		_, e := g.Acquire(ctx, tenant)
		return e
	}
	if acquire("bob") != nil || acquire("bob") != nil {
		t.Fatal("bob's two slots refused")
	}
	e := acquire("bob")
	if e == nil || e.Status != http.StatusTooManyRequests || e.Code != "concurrency_limit_exceeded" || !strings.Contains(e.Message, "at most 2") {
		t.Fatalf("bob's third: got %+v, want 429 concurrency_limit_exceeded at most 2", e)
	}
	if n := g.series.snapshot("bob").Throttled[throttleConcurrent]; n != 1 {
		t.Errorf("bob's throttled concurrent = %d, want 1", n)
	}
	release, _ := g.Acquire(ctx, "carol")
	if acquire("carol") != nil || acquire("carol") == nil {
		t.Fatal("carol's second slot: want granted, the third refused")
	}
	release()
	if acquire("carol") != nil {
		t.Error("a released slot was not given back")
	}
	if acquire("alice") != nil || acquire("alice") == nil {
		t.Fatal("alice's concurrent=1: want one slot granted, the second refused")
	}
	if err := os.WriteFile(file, []byte("alice concurrent=3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := g.Reload(); err != nil {
		t.Fatal(err)
	}
	if acquire("alice") != nil || acquire("alice") != nil || acquire("alice") == nil {
		t.Error("after the reload to 3: want two more granted (one held), then refused")
	}
	if err := os.WriteFile(file, []byte("alice concurrent=x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := g.Reload(); err == nil {
		t.Error("a bad budgets file reloaded without an error")
	}
}

// TestGateRate: --tenant-rps refuses past its burst with 429
// rate_limit_exceeded and the wait as Retry-After, counted as "rate".
func TestGateRate(t *testing.T) {
	g := newGate(t, Config{RPS: 1}, nil)
	if g.Rate("alice") != nil {
		t.Fatal("alice's first request refused")
	}
	e := g.Rate("alice")
	if e == nil || e.Status != http.StatusTooManyRequests || e.Code != "rate_limit_exceeded" || e.RetryAfter <= 0 {
		t.Fatalf("alice's second at once: got %+v, want 429 rate_limit_exceeded with a wait", e)
	}
	if n := g.series.snapshot("alice").Throttled[throttleRate]; n != 1 {
		t.Errorf("alice's throttled rate = %d, want 1", n)
	}
	if newGate(t, Config{}, nil).Rate("alice") != nil {
		t.Error("no --tenant-rps: refused")
	}
}

// TestGateWithoutBudgets: without shared budgets a create is charged
// nothing and no header is set; without a budgets file no log share
// refuses; /health has no note.
func TestGateWithoutBudgets(t *testing.T) {
	g := newGate(t, Config{}, nil)
	w := httptest.NewRecorder()
	g.Headers(w, "alice")
	spent, e := g.Charge(t.Context(), w, "alice", 1000, "r1")
	if e != nil || spent == nil {
		t.Fatalf("Charge without budgets: got %v, %v", spent, e)
	}
	spent.End()
	spent.Unused()
	if len(w.Header()) != 0 {
		t.Errorf("headers set without budgets: %v", w.Header())
	}
	if e := g.AdmitLogShare("alice"); e != nil {
		t.Errorf("a log share refused without a budgets file: %v", e)
	}
	if body := g.HealthNote(map[string]any{}); len(body) != 0 {
		t.Errorf("health note without budgets: %v", body)
	}
	if g.Queues() {
		t.Error("the fair queue is on without --admission-queue")
	}
}

// TestServeUsage: a tenant reads its own usage, with its budgets and this
// frontend's counts of it, and gets 404 for another's; on an open API
// every caller is the one tenant.
func TestServeUsage(t *testing.T) {
	keys, budgets := keysAndBudgets(t, "alice alice-0123456789abcdef\nbob bob-0123456789abcdef\n", "alice concurrent=4 weight=2\n")
	usage := func(g *Gate, caller, tenant string) (int, map[string]any) {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /v1/tenants/{tenant}/usage", func(w http.ResponseWriter, r *http.Request) { g.ServeUsage(w, r, caller) })
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/tenants/"+tenant+"/usage", nil))
		var body map[string]any
		_ = json.Unmarshal(w.Body.Bytes(), &body)
		return w.Code, body
	}
	g := newGate(t, Config{BudgetsFile: budgets}, keys)
	if _, e := g.Acquire(t.Context(), "alice"); e != nil {
		t.Fatal("alice's slot refused")
	}
	code, body := usage(g, "alice", "alice")
	budget, _ := body["budget"].(map[string]any)
	if code != http.StatusOK || budget["concurrent"] != 4.0 || budget["weight"] != 2.0 || body["open_here"] != 1.0 || body["frontend"] != "fe-test" {
		t.Errorf("alice's own usage: got %d %v, want 200 with concurrent 4, weight 2, one open here", code, body)
	}
	if code, body := usage(g, "bob", "alice"); code != http.StatusNotFound {
		t.Errorf("bob reading alice's usage: got %d %v, want 404", code, body)
	}
	if code, body := usage(newGate(t, Config{}, nil), "", "anyone"); code != http.StatusOK || body["tenant"] != "anyone" {
		t.Errorf("the open API's usage: got %d %v, want 200", code, body)
	}
}

// TestConfig: the admission wait defaults once the queue is on, and
// negative limits are refused, each by name.
func TestConfig(t *testing.T) {
	if got := (Config{AdmissionQueue: 2}).withDefaults().AdmissionWait; got != DefaultAdmissionWait {
		t.Errorf("the admission wait with a queue: got %v, want %v", got, DefaultAdmissionWait)
	}
	if got := (Config{}).withDefaults().AdmissionWait; got != 0 {
		t.Errorf("the admission wait without a queue: got %v, want 0 (off)", got)
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{MaxConcurrent: -1, RPS: 2, RPM: 60, TPM: 1000, Lease: time.Second, AdmissionQueue: 1}, ""},
		{Config{RPS: -1}, "tenant limits"},
		{Config{TPM: -1}, "tenant limits"},
		{Config{Lease: -time.Second}, "tenant limits"},
		{Config{AdmissionWait: -time.Second}, "admission queue"},
	} {
		err := tc.cfg.Validate()
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want %q", tc.cfg, err, tc.want)
		}
	}
}
