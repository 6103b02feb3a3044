package frontend_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/services/frontend"
	"github.com/baton-dev/baton/services/frontend/tenants"
)

func post(t *testing.T, url, body string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestBudgetsAtTheEdge: a tenant with a requests-per-minute budget gets
// OpenAI's x-ratelimit-* headers on every answer, its creates past the
// burst get 429 rate_limit_exceeded with Retry-After, and a request that
// reserves more tokens than the tokens budget lets at once is refused.
func TestBudgetsAtTheEdge(t *testing.T) {
	url := inProcessWith(t, engine.MockConfig{SpeedupRatio: 1e9}, frontend.Config{Tenants: tenants.Config{RPM: 20, TPM: 1000}})
	const chat = `{"model":"mock","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	admitted := 0
	var refused *http.Response
	var refusedBody string
	for range 5 { // rpm 20: a burst of 2
		resp, body := post(t, url+"/v1/chat/completions", chat)
		switch resp.StatusCode {
		case http.StatusOK:
			admitted++
		case http.StatusTooManyRequests:
			refused, refusedBody = resp, body
		default:
			t.Fatalf("got %d %s, want 200 or 429", resp.StatusCode, body)
		}
		for _, h := range []string{"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
			"x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"} {
			if resp.Header.Get(h) == "" {
				t.Errorf("answer %d has no %s", resp.StatusCode, h)
			}
		}
	}
	if admitted != 2 {
		t.Errorf("got %d admitted at once, want the burst of 2", admitted)
	}
	if refused == nil {
		t.Fatal("nothing refused")
	}
	if !strings.Contains(refusedBody, `"code":"rate_limit_exceeded"`) || !strings.Contains(refusedBody, `"type":"requests"`) {
		t.Errorf("got %s, want OpenAI's rate_limit_exceeded of type requests", refusedBody)
	}
	if ra, err := strconv.Atoi(refused.Header.Get("Retry-After")); err != nil || ra < 1 || ra > 5 {
		t.Errorf("got Retry-After %q, want 1 to 5 s (one request refills in 3 s)", refused.Header.Get("Retry-After"))
	}
	if got := refused.Header.Get("x-ratelimit-limit-requests"); got != "20" {
		t.Errorf("got x-ratelimit-limit-requests %q, want 20", got)
	}
	if got := refused.Header.Get("x-ratelimit-remaining-requests"); got != "0" {
		t.Errorf("got x-ratelimit-remaining-requests %q, want 0", got)
	}
	if d, err := time.ParseDuration(refused.Header.Get("x-ratelimit-reset-requests")); err != nil || d <= 0 {
		t.Errorf("got x-ratelimit-reset-requests %q, want a positive duration", refused.Header.Get("x-ratelimit-reset-requests"))
	}
	// Any answer carries them, with no check: the models list.
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get("x-ratelimit-limit-tokens") != "1000" {
		t.Errorf("GET /v1/models: got x-ratelimit-limit-tokens %q, want 1000", resp.Header.Get("x-ratelimit-limit-tokens"))
	}
	// The usage: what is left across every frontend.
	resp, err = http.Get(url + "/v1/tenants/any/usage")
	if err != nil {
		t.Fatal(err)
	}
	var u struct {
		Budget   struct{ RPM, TPM int64 }
		Requests struct{ Limit, Remaining int64 }
		Tokens   struct{ Limit int64 }
	}
	_ = json.NewDecoder(resp.Body).Decode(&u)
	resp.Body.Close()
	if resp.StatusCode != 200 || u.Budget.RPM != 20 || u.Requests.Limit != 20 || u.Requests.Remaining != 0 || u.Tokens.Limit != 1000 {
		t.Errorf("usage: got %d %+v, want 200 with rpm 20, none remaining, tpm 1000", resp.StatusCode, u)
	}
	// The probes carry none.
	if resp, err := http.Get(url + "/health"); err == nil {
		resp.Body.Close()
		if resp.Header.Get("x-ratelimit-limit-requests") != "" {
			t.Error("/health carries x-ratelimit headers, want none")
		}
	}
}

// TestBudgetTooLarge: a request that reserves more tokens than a tenant's
// tokens budget may at once (a tenth of it) is refused, and says so.
func TestBudgetTooLarge(t *testing.T) {
	url := inProcessWith(t, engine.MockConfig{SpeedupRatio: 1e9}, frontend.Config{Tenants: tenants.Config{TPM: 1000}})
	resp, body := post(t, url+"/v1/chat/completions", `{"model":"mock","messages":[{"role":"user","content":"hi"}],"max_tokens":200}`)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "Request too large") || !strings.Contains(body, `"type":"tokens"`) {
		t.Errorf("got %d %s, want 429 of type tokens saying the request is too large", resp.StatusCode, body)
	}
	if resp.Header.Get("x-ratelimit-limit-requests") != "" {
		t.Error("a tenant without a requests budget got x-ratelimit-limit-requests")
	}
	resp, body = post(t, url+"/v1/responses", `{"model":"mock","input":"hi","max_output_tokens":20}`)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a response within the budget: got %d %s, want 200", resp.StatusCode, body)
	}
}

// TestNoBudgetsNoHeaders: without budgets nothing changes: no headers.
func TestNoBudgetsNoHeaders(t *testing.T) {
	url := inProcess(t, engine.MockConfig{SpeedupRatio: 1e9})
	resp, body := post(t, url+"/v1/chat/completions", `{"model":"mock","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
	for k := range resp.Header {
		if strings.HasPrefix(strings.ToLower(k), "x-ratelimit") {
			t.Errorf("got header %s without budgets", k)
		}
	}
}

// TestTokensGivenBackAtTheEnd: a request reserves its prompt and max
// tokens; stopped after a few, it gives back the rest when it ends, so
// that the next one as large is admitted at once.
func TestTokensGivenBackAtTheEnd(t *testing.T) {
	url := inProcessWith(t, engine.MockConfig{TokensPerSec: 20, TTFT: time.Millisecond}, frontend.Config{Tenants: tenants.Config{TPM: 1000}}) // burst 100
	const big = `{"model":"mock","messages":[{"role":"user","content":"hi"}],"max_tokens":90,"stream":true}`
	resp := open(t, http.MethodPost, url+"/v1/chat/completions", big, map[string]string{"X-Request-Id": "first"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("first: got %d", resp.StatusCode)
	}
	if got, _ := strconv.Atoi(resp.Header.Get("x-ratelimit-remaining-tokens")); got < 5 || got > 10 {
		t.Errorf("remaining tokens after the first reservation: got %d, want 100 less the prompt's few and 90", got)
	}
	t0 := time.Now()
	// While it runs, a second as large does not fit.
	if r, body := post(t, url+"/v1/chat/completions", big); r.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second while the first runs: got %d %s, want 429", r.StatusCode, body)
	}
	if code, body := call(t, http.MethodPost, url+"/v1/requests/first/cancel", `{"mode":"stop"}`, nil); code != http.StatusOK {
		t.Fatalf("stop: %d %s", code, body)
	}
	_, _ = io.ReadAll(resp.Body) // to its end: the handler gives back what was not used
	resp.Body.Close()
	t.Logf("stopped after %v", time.Since(t0))
	// Without the give-back the 86 more it needs would take 5.7 s to refill.
	waitUntil(t, "the unused tokens to come back", 1500*time.Millisecond, func() bool {
		r := open(t, http.MethodPost, url+"/v1/chat/completions", big, map[string]string{"X-Request-Id": "second"})
		defer r.Body.Close()
		if r.StatusCode != http.StatusOK {
			return false
		}
		call(t, http.MethodPost, url+"/v1/requests/second/cancel", `{"mode":"stop"}`, nil) // admitted is enough
		_, _ = io.ReadAll(r.Body)
		return true
	})
	t.Logf("admitted again after %v", time.Since(t0))
}
