package integration

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// TestTenantBudgetsAcrossFrontends: a tenant's requests-per-minute budget
// is one budget across two frontends it sends through at once: alice, with
// rpm=20 (a burst of 2, then one every 3.2 s), gets at most what one
// budget allows in the first second (a budget per frontend would have let
// 4 through), every answer of hers carries the x-ratelimit-* headers, the
// refused get 429 rate_limit_exceeded with Retry-After, and bob, with no
// budget, is not affected. A third frontend given other budgets is named
// in the others' /health until a SIGHUP reloads the same file.
func TestTenantBudgetsAcrossFrontends(t *testing.T) {
	s := newStack(t)
	keys, budgets := filepath.Join(s.dir, "keys"), filepath.Join(s.dir, "budgets")
	writeKeys(t, keys, "alice "+aliceKey, "bob "+bobKey, "admin "+adminKey)
	if err := os.WriteFile(budgets, []byte("# test budgets\nalice rpm=20 weight=2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f1 := s.frontend(nil, "--api-keys-file", keys, "--tenant-budgets-file", budgets)
	f2 := s.frontend(nil, "--api-keys-file", keys, "--tenant-budgets-file", budgets)
	s.worker("w1", "--mock-tokens-per-sec", "2000", "--mock-ttft", "1ms")
	waitRoutableAs(t, apiClient{f2.url, adminKey}, "w1")
	waitRoutableAs(t, apiClient{f1.url, adminKey}, "w1")

	body, _ := bodyOf(map[string]any{"model": "mock", "prompt": "budgeted", "max_tokens": 2})
	var mu sync.Mutex
	var results []apiResult
	var wg sync.WaitGroup
	start := time.Now()
	for _, f := range []*frontend{f1, f2} {
		alice := apiClient{f.url, aliceKey}
		wg.Go(func() {
			for range 10 {
				r := alice.do(t, http.MethodPost, "/v1/completions", body, nil)
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	admitted := 0
	for _, r := range results {
		switch r.status {
		case http.StatusOK:
			admitted++
		case http.StatusTooManyRequests:
			if r.code != "rate_limit_exceeded" {
				t.Errorf("429 with code %q, want rate_limit_exceeded", r.code)
			}
			if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 {
				t.Errorf("429 with Retry-After %q, want whole seconds", r.header.Get("Retry-After"))
			}
		default:
			t.Errorf("got %d %s, want 200 or 429", r.status, r.body)
		}
		for _, h := range []string{"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"} {
			if r.header.Get(h) == "" {
				t.Errorf("an answer %d without %s", r.status, h)
			}
		}
		if got := r.header.Get("x-ratelimit-limit-requests"); got != "20" {
			t.Errorf("got x-ratelimit-limit-requests %q, want 20", got)
		}
	}
	// The burst (2) and what refills while the test ran (19/60 a second).
	most := 2 + int(elapsed.Seconds()*19/60)
	t.Logf("alice: %d of %d admitted through two frontends in %v (at most %d)", admitted, len(results), elapsed, most)
	if admitted < 1 || admitted > most {
		t.Errorf("got %d admitted in %v through two frontends, want 1 to %d: one budget, not one per frontend", admitted, elapsed, most)
	}

	// The official SDK reads the refusal and its headers.
	ctx := context.Background()
	chat := openai.ChatCompletionNewParams{Model: "mock", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("via the sdk")},
		MaxTokens: openai.Int(2)}
	_, err := sdk(f1.url, aliceKey).Chat.Completions.New(ctx, chat)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Code != "rate_limit_exceeded" ||
		apiErr.Response.Header.Get("x-ratelimit-limit-requests") != "20" || apiErr.Response.Header.Get("Retry-After") == "" {
		t.Errorf("the SDK over budget: got %v, want a 429 rate_limit_exceeded with the headers", err)
	}

	// The usage: alice and the admin read alice's, bob does not.
	var usage struct {
		Budget   struct{ RPM int64 }
		Requests struct{ Limit, Remaining int64 }
	}
	for _, key := range []string{aliceKey, adminKey} {
		r := apiClient{f2.url, key}.get(t, "/v1/tenants/alice/usage")
		if r.status != http.StatusOK || json.Unmarshal(r.body, &usage) != nil || usage.Budget.RPM != 20 || usage.Requests.Limit != 20 || usage.Requests.Remaining > 2 {
			t.Errorf("alice's usage: got %d %s, want 200 with rpm 20 and at most 2 remaining", r.status, r.body)
		}
	}
	apiClient{f1.url, bobKey}.get(t, "/v1/tenants/alice/usage").want(t, "bob reading alice's usage", http.StatusNotFound, "tenant_not_found")

	for _, f := range []*frontend{f1, f2} {
		bob := apiClient{f.url, bobKey}
		for range 5 {
			r := bob.do(t, http.MethodPost, "/v1/completions", body, nil)
			if r.status != http.StatusOK {
				t.Fatalf("bob, without a budget: got %d %s, want 200", r.status, r.body)
			}
			if r.header.Get("x-ratelimit-limit-requests") != "" {
				t.Errorf("bob, without a budget, got x-ratelimit-limit-requests %q", r.header.Get("x-ratelimit-limit-requests"))
			}
		}
	}

	// A frontend with other budgets is named, until a reload agrees.
	other := filepath.Join(s.dir, "budgets-other")
	if err := os.WriteFile(other, []byte("alice rpm=40\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f3 := s.frontend(nil, "--api-keys-file", keys, "--tenant-budgets-file", other)
	differ := func(f *frontend) []string {
		resp, err := http.Get(f.url + "/health")
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		var h struct {
			BudgetsDiffer struct {
				Frontends []string `json:"frontends"`
			} `json:"budgets_differ"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&h)
		return h.BudgetsDiffer.Frontends
	}
	waitFor(t, 20*time.Second, "frontend-1's /health to name the third frontend", func() bool {
		return slices.Contains(differ(f1), "frontend-3")
	})
	waitFor(t, 20*time.Second, "the third frontend's /health to name the others", func() bool {
		d := differ(f3)
		return slices.Contains(d, "frontend-1") && slices.Contains(d, "frontend-2")
	})
	if err := os.WriteFile(other, []byte("# test budgets\nalice rpm=20 weight=2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f3.signal(syscall.SIGHUP)
	waitFor(t, 20*time.Second, "the frontends to agree after the reload", func() bool {
		return len(differ(f1)) == 0 && len(differ(f3)) == 0
	})

	// A reload that raises alice's budget: the SDK sees the new limits.
	if err := os.WriteFile(budgets, []byte("alice rpm=600 tpm=100000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*frontend{f1, f2} {
		f.signal(syscall.SIGHUP)
	}
	waitFor(t, 20*time.Second, "alice to be admitted under the raised budget", func() bool {
		var resp *http.Response
		_, err := sdk(f1.url, aliceKey).Chat.Completions.New(ctx, chat, option.WithResponseInto(&resp))
		return err == nil && resp.Header.Get("x-ratelimit-limit-requests") == "600" && resp.Header.Get("x-ratelimit-limit-tokens") == "100000"
	})
}

// TestBudgetLeaseOfAKilledFrontend: a frontend killed (SIGKILL) while it
// holds a slice of a tenant's budget holds it only until its lease ends
// (2 s): the other frontend's usage shows the whole burst again within the
// lease, and then admits the burst, not more (nothing counted twice).
func TestBudgetLeaseOfAKilledFrontend(t *testing.T) {
	s := newStack(t)
	keys, budgets := filepath.Join(s.dir, "keys"), filepath.Join(s.dir, "budgets")
	writeKeys(t, keys, "alice "+aliceKey, "admin "+adminKey)
	if err := os.WriteFile(budgets, []byte("alice rpm=400\n"), 0o600); err != nil { // burst 40, slices of 10
		t.Fatal(err)
	}
	f1 := s.frontend(nil, "--api-keys-file", keys, "--tenant-budgets-file", budgets)
	f2 := s.frontend(nil, "--api-keys-file", keys, "--tenant-budgets-file", budgets)
	s.worker("w1", "--mock-tokens-per-sec", "2000", "--mock-ttft", "1ms")
	waitRoutableAs(t, apiClient{f1.url, adminKey}, "w1")
	waitRoutableAs(t, apiClient{f2.url, adminKey}, "w1")
	body, _ := bodyOf(map[string]any{"model": "mock", "prompt": "held", "max_tokens": 1})
	if r := (apiClient{f1.url, aliceKey}).do(t, http.MethodPost, "/v1/completions", body, nil); r.status != http.StatusOK {
		t.Fatalf("alice through frontend-1: %d %s", r.status, r.body)
	}
	taken := time.Now()
	f1.signal(syscall.SIGKILL)
	alice := apiClient{f2.url, aliceKey}
	remaining := func() int64 {
		var u struct{ Requests struct{ Remaining int64 } }
		r := alice.get(t, "/v1/tenants/alice/usage")
		if r.status != http.StatusOK || json.Unmarshal(r.body, &u) != nil {
			t.Fatalf("usage: %d %s", r.status, r.body)
		}
		return u.Requests.Remaining
	}
	if got := remaining(); got > 30 {
		t.Errorf("right after the kill: got %d remaining, want at most 30 (the dead frontend's slice of 10 still held)", got)
	}
	waitFor(t, 10*time.Second, "the killed frontend's slice to come back", func() bool { return remaining() == 40 })
	if back := time.Since(taken); back > 2500*time.Millisecond {
		t.Errorf("the slice came back %v after it was taken, want within the lease of 2 s", back)
	}
	start, admitted := time.Now(), 0
	for range 60 {
		if r := alice.do(t, http.MethodPost, "/v1/completions", body, nil); r.status == http.StatusOK {
			admitted++
		}
	}
	most := 40 + int(time.Since(start).Seconds()*361/60) + 1
	if admitted < 40 || admitted > most {
		t.Errorf("got %d admitted through frontend-2 after the lease, want the burst of 40 (at most %d with what refilled)", admitted, most)
	}
}
