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
	"strings"
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
// in the others' /health, and they and it say so in their logs, until a
// SIGHUP reloads the same file. A reload
// that raises alice's budget is seen through the SDK with all six headers,
// and one that lowers it refuses her at both frontends.
func TestTenantBudgetsAcrossFrontends(t *testing.T) {
	s := newStack(t)
	args, budgets := s.tenantFiles(t, "# test budgets\nalice rpm=20 weight=2\n", "alice "+aliceKey, "bob "+bobKey, "admin "+adminKey)
	f1, f2 := s.frontend(nil, args...), s.frontend(nil, args...)
	s.worker("w1", "--mock-tokens-per-sec", "2000", "--mock-ttft", "1ms")
	waitRoutableAs(t, apiClient{f2.url, adminKey}, "w1")
	waitRoutableAs(t, apiClient{f1.url, adminKey}, "w1")

	body, _ := bodyOf(map[string]any{"model": "mock", "prompt": "budgeted", "max_tokens": 2})
	results, elapsed := completeThrough(t, []*frontend{f1, f2}, aliceKey, body, 10)
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
	for _, key := range []string{aliceKey, adminKey} {
		if u := (apiClient{f2.url, key}).usage(t, "alice"); u.Budget.RPM != 20 || u.Requests.Limit != 20 || u.Requests.Remaining > 2 {
			t.Errorf("alice's usage: got %+v, want rpm 20 and at most 2 remaining", u)
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
	f3 := s.frontend(nil, append(args[:2:2], "--tenant-budgets-file", other)...) // the same keys
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
	for _, f := range []*frontend{f1, f3} {
		waitFor(t, 20*time.Second, f.Name+"'s log to say the budgets differ", func() bool {
			return strings.Contains(f.output(), "tenant budgets differ from other frontends'")
		})
	}
	if err := os.WriteFile(other, []byte("# test budgets\nalice rpm=20 weight=2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f3.signal(syscall.SIGHUP)
	waitFor(t, 20*time.Second, "the frontends to agree after the reload", func() bool {
		return len(differ(f1)) == 0 && len(differ(f3)) == 0
	})

	// A reload that raises alice's budget and her weight: the SDK sees the
	// new limits, and both frontends' usage the new weight (the one fair
	// admission charges her by).
	if err := os.WriteFile(budgets, []byte("alice rpm=600 tpm=100000 weight=5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*frontend{f1, f2} {
		f.signal(syscall.SIGHUP)
	}
	// The answer that admitted her is the one read: the bucket keeps its
	// level across a reload and refills at the new rate, so a second
	// request right after it may still be refused.
	var resp *http.Response
	waitFor(t, 20*time.Second, "alice to be admitted under the raised budget", func() bool {
		_, err := sdk(f1.url, aliceKey).Chat.Completions.New(ctx, chat, option.WithResponseInto(&resp))
		return err == nil && resp.Header.Get("x-ratelimit-limit-requests") == "600" && resp.Header.Get("x-ratelimit-limit-tokens") == "100000"
	})
	for _, h := range []string{"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
		"x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"} {
		if resp.Header.Get(h) == "" {
			t.Errorf("the SDK's answer has no %s: %v", h, resp.Header)
		}
	}
	for _, f := range []*frontend{f1, f2} {
		if u := (apiClient{f.url, adminKey}).usage(t, "alice"); u.Budget.Weight != 5 {
			t.Errorf("alice's usage at %s after the reload: got %+v, want weight 5", f.url, u)
		}
	}

	// A reload that lowers it: once frontend-1's slice of the raised
	// budget is spent or its lease has ended (2 s), alice is refused under
	// the new limit, and frontend-2, which holds no slice, admits at most
	// the new burst (1) before refusing her too.
	if err := os.WriteFile(budgets, []byte("alice rpm=3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*frontend{f1, f2} {
		f.signal(syscall.SIGHUP)
	}
	waitFor(t, 20*time.Second, "alice to be refused under the lowered budget", func() bool {
		_, err := sdk(f1.url, aliceKey).Chat.Completions.New(ctx, chat)
		var apiErr *openai.Error
		return errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusTooManyRequests &&
			apiErr.Response.Header.Get("x-ratelimit-limit-requests") == "3" && apiErr.Response.Header.Get("x-ratelimit-limit-tokens") == ""
	})
	admitted = 0
	for range 3 {
		r := apiClient{f2.url, aliceKey}.do(t, http.MethodPost, "/v1/completions", body, nil)
		switch {
		case r.status == http.StatusOK:
			admitted++
		case r.status != http.StatusTooManyRequests || r.code != "rate_limit_exceeded":
			t.Errorf("alice through frontend-2 under the lowered budget: got %d %s, want 200 or 429", r.status, r.body)
		}
		if got := r.header.Get("x-ratelimit-limit-requests"); got != "3" {
			t.Errorf("frontend-2 after the lowering reload: x-ratelimit-limit-requests %q, want 3", got)
		}
	}
	if admitted > 1 {
		t.Errorf("frontend-2 admitted %d of 3 under rpm=3 (a burst of 1), want at most 1", admitted)
	}
}

// TestTokenBudgetAcrossFrontends: a tenant's tokens-per-minute budget is
// one budget across two frontends it sends through at once: carol, with
// tpm=600 (a burst of 60, then 541 a minute), sends completions that each
// reserve 10 tokens (a one-word prompt and max_tokens 9) through both, and
// gets at most what one budget allows while the test runs (a budget per
// frontend would have let 12 through at once); the refused get 429
// rate_limit_exceeded of type tokens with Retry-After, and every answer
// carries x-ratelimit-limit-tokens but no -requests header (she has no
// rpm).
func TestTokenBudgetAcrossFrontends(t *testing.T) {
	s := newStack(t)
	args, _ := s.tenantFiles(t, "carol tpm=600\n", "carol "+carolKey, "admin "+adminKey)
	f1, f2 := s.frontend(nil, args...), s.frontend(nil, args...)
	s.worker("w1", "--mock-tokens-per-sec", "2000", "--mock-ttft", "1ms")
	waitRoutableAs(t, apiClient{f1.url, adminKey}, "w1")
	waitRoutableAs(t, apiClient{f2.url, adminKey}, "w1")

	body, _ := json.Marshal(map[string]any{"model": "mock", "prompt": "tokens", "max_tokens": 9})
	results, elapsed := completeThrough(t, []*frontend{f1, f2}, carolKey, body, 10)
	admitted := 0
	for _, r := range results {
		switch r.status {
		case http.StatusOK:
			admitted++
		case http.StatusTooManyRequests:
			var e struct{ Error struct{ Type, Code string } }
			if json.Unmarshal(r.body, &e) != nil || e.Error.Type != "tokens" || e.Error.Code != "rate_limit_exceeded" {
				t.Errorf("429 %s, want type tokens, code rate_limit_exceeded", r.body)
			}
			if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 {
				t.Errorf("429 with Retry-After %q, want whole seconds", r.header.Get("Retry-After"))
			}
		default:
			t.Errorf("got %d %s, want 200 or 429", r.status, r.body)
		}
		if got := r.header.Get("x-ratelimit-limit-tokens"); got != "600" {
			t.Errorf("an answer %d with x-ratelimit-limit-tokens %q, want 600", r.status, got)
		}
		if got := r.header.Get("x-ratelimit-limit-requests"); got != "" {
			t.Errorf("an answer %d with x-ratelimit-limit-requests %q, want none (no rpm)", r.status, got)
		}
	}
	// The burst (60 tokens) and what refills while the test ran (541/60 a
	// second), 10 tokens a request.
	most := int((60 + elapsed.Seconds()*541/60) / 10)
	t.Logf("carol: %d of %d admitted through two frontends in %v (at most %d)", admitted, len(results), elapsed, most)
	if admitted < 1 || admitted > most {
		t.Errorf("got %d admitted in %v through two frontends, want 1 to %d: one token budget, not one per frontend", admitted, elapsed, most)
	}
}

// tenantUsage is GET /v1/tenants/{tenant}/usage, with what the tests read
// of it.
type tenantUsage struct {
	Budget struct {
		RPM    int64
		Weight float64
	}
	Requests struct{ Limit, Remaining int64 }
	Open     int
}

// completeThrough sends n completions with body as key's tenant through
// each of fronts at once, one after another on each, and returns every
// answer and how long they took.
func completeThrough(t *testing.T, fronts []*frontend, key string, body []byte, n int) ([]apiResult, time.Duration) {
	var mu sync.Mutex
	var results []apiResult
	var wg sync.WaitGroup
	start := time.Now()
	for _, f := range fronts {
		c := apiClient{f.url, key}
		wg.Go(func() {
			for range n {
				r := c.do(t, http.MethodPost, "/v1/completions", body, nil)
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return results, time.Since(start)
}

// usage is tenant's usage as c reads it, failing t unless it answers 200.
func (c apiClient) usage(t testing.TB, tenant string) tenantUsage {
	t.Helper()
	var u tenantUsage
	r := c.get(t, "/v1/tenants/"+tenant+"/usage")
	if r.status != http.StatusOK || json.Unmarshal(r.body, &u) != nil {
		t.Fatalf("%s's usage: %d %s", tenant, r.status, r.body)
	}
	return u
}

// TestBudgetLeaseOfAKilledFrontend: a frontend killed (SIGKILL) while it
// holds a slice of a tenant's budget holds it only until its lease ends:
// the lease recorded in the tenant's key ends within one lease (2 s) of
// the kill, the other frontend's usage shows the slice still held before
// that end and the whole burst at its first read after it, and a burst
// through the other frontend then admits the burst, not more (nothing
// counted twice). No bound is put on how long the machine takes: the
// times compared are the key's.
func TestBudgetLeaseOfAKilledFrontend(t *testing.T) {
	s := newStack(t)
	args, _ := s.tenantFiles(t, "alice rpm=400\n", "alice "+aliceKey, "admin "+adminKey) // burst 40, slices of 10
	f1, f2 := s.frontend(nil, args...), s.frontend(nil, args...)
	s.worker("w1", "--mock-tokens-per-sec", "2000", "--mock-ttft", "1ms")
	waitRoutableAs(t, apiClient{f1.url, adminKey}, "w1")
	waitRoutableAs(t, apiClient{f2.url, adminKey}, "w1")
	body, _ := bodyOf(map[string]any{"model": "mock", "prompt": "held", "max_tokens": 1})
	if r := (apiClient{f1.url, aliceKey}).do(t, http.MethodPost, "/v1/completions", body, nil); r.status != http.StatusOK {
		t.Fatalf("alice through frontend-1: %d %s", r.status, r.body)
	}
	f1.signal(syscall.SIGKILL)
	killed := time.Now() // after the take, which came before the answer
	var key struct {
		Leases map[string]struct {
			Req float64
			Exp int64
		}
	}
	if err := json.Unmarshal(budgetsKey(t, s, "t.alice"), &key); err != nil {
		t.Fatal(err)
	}
	lease, ok := key.Leases[f1.Name]
	if !ok || lease.Req != 10 { // a slice of 10 (one of it spent here, which the key does not see)
		t.Fatalf("alice's key after frontend-1's take: %+v, want frontend-1's lease of 10", key)
	}
	end := time.Unix(0, lease.Exp)
	if end.Sub(killed) > 2*time.Second {
		t.Errorf("frontend-1's lease ends %v after it was killed, want within the lease of 2 s", end.Sub(killed))
	}
	alice := apiClient{f2.url, aliceKey}
	remaining := func() int64 { return alice.usage(t, "alice").Requests.Remaining }
	if got := remaining(); time.Now().Before(end) && got > 30 {
		t.Errorf("before the killed frontend's lease ended: got %d remaining, want at most 30 (its slice of 10 still held)", got)
	}
	waitFor(t, 10*time.Second, "the killed frontend's lease to end", func() bool { return time.Now().After(end) })
	if got := remaining(); got != 40 {
		t.Errorf("the first usage read after the killed frontend's lease ended: got %d remaining, want the whole burst of 40", got)
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

// budgetsKey is the value of key in the budgets bucket.
func budgetsKey(t testing.TB, s *stack, key string) []byte {
	t.Helper()
	kv, err := s.jetStream(t).KeyValue(context.Background(), "baton_budgets")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("%s in baton_budgets: %v", key, err)
	}
	return e.Value()
}

// TestWithoutBudgetsAsBefore: without a budgets file (and without
// --tenant-rpm/--tenant-tpm or --admission-queue) two keyed frontends
// behave as before issue 34: no answer carries x-ratelimit-* headers,
// --tenant-max-concurrent caps a tenant on each frontend apart (429 at
// the one holding her stream, not at the other), a busy pool answers 503
// at once (no queue), /health names no differing budgets, and nothing is
// written to the budgets bucket.
func TestWithoutBudgetsAsBefore(t *testing.T) {
	s := newStack(t)
	keys := filepath.Join(s.dir, "keys")
	writeKeys(t, keys, "alice "+aliceKey, "bob "+bobKey, "admin "+adminKey)
	args := []string{"--api-keys-file", keys, "--tenant-max-concurrent", "1", "--active-decode-blocks-threshold", "0"}
	f1, f2 := s.frontend(nil, args...), s.frontend(nil, args...)
	s.worker("w1", "--mock-hold-at-token", "2", "--mock-tokens-per-sec", "2000", "--mock-ttft", "1ms")
	for _, f := range []*frontend{f1, f2} {
		waitRoutableAs(t, apiClient{f.url, adminKey}, "w1")
	}
	noHeaders := func(what string, h http.Header) {
		t.Helper()
		for k := range h {
			if strings.HasPrefix(strings.ToLower(k), "x-ratelimit") {
				t.Errorf("%s: header %s without budgets", what, k)
			}
		}
	}
	for _, f := range []*frontend{f1, f2} {
		r := apiClient{f.url, aliceKey}.get(t, "/v1/models")
		if r.status != http.StatusOK {
			t.Fatalf("alice's models at %s: %d %s", f.Name, r.status, r.body)
		}
		noHeaders("a read", r.header)
	}

	// alice's stream, held by the engine, makes w1 busy (threshold 0).
	held := openAliceStream(t, f1, "held")
	if !held.admitted(t) {
		t.Fatalf("alice's stream through frontend-1: %d %s", held.status, held.body)
	}
	for _, f := range []*frontend{f1, f2} {
		waitFor(t, 20*time.Second, f.Name+" to see w1 busy", func() bool {
			var out struct {
				Data []workerInfo `json:"data"`
			}
			r := apiClient{f.url, adminKey}.get(t, "/v1/workers")
			return r.status == http.StatusOK && json.Unmarshal(r.body, &out) == nil && len(out.Data) == 1 && out.Data[0].Load.KVBlocksUsed > 0
		})
	}
	openAliceStream(t, f1, "over-cap").refused(t, "alice's second stream through frontend-1 (--tenant-max-concurrent 1)")

	body, _ := bodyOf(map[string]any{"model": "mock", "prompt": "busy", "max_tokens": 2})
	for _, c := range []struct {
		what   string
		client apiClient
	}{
		{"alice through frontend-2 (her cap is per frontend: not 429)", apiClient{f2.url, aliceKey}},
		{"bob through frontend-1", apiClient{f1.url, bobKey}},
	} {
		start := time.Now()
		r := c.client.do(t, http.MethodPost, "/v1/completions", body, nil)
		took := time.Since(start)
		r.want(t, c.what, http.StatusServiceUnavailable, "all_workers_busy")
		if r.header.Get("Retry-After") == "" {
			t.Errorf("%s: a busy 503 without Retry-After", c.what)
		}
		if took >= 4*time.Second { // an admission queue would hold it 5 s
			t.Errorf("%s: the busy 503 came after %v, want at once (no queue)", c.what, took)
		}
		noHeaders(c.what, r.header)
	}

	for _, f := range []*frontend{f1, f2} {
		var h map[string]any
		resp, err := http.Get(f.url + "/health")
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if _, ok := h["budgets_differ"]; err != nil || ok {
			t.Errorf("%s's /health: %v %v, want no budgets_differ", f.Name, h, err)
		}
	}

	// Once the engine lets go, a whole request runs through, and ends.
	s.release("")
	plain, _ := json.Marshal(map[string]any{"model": "mock", "prompt": "after", "max_tokens": 2})
	waitFor(t, 20*time.Second, "alice to be served through frontend-2 once w1 is free", func() bool {
		r := apiClient{f2.url, aliceKey}.do(t, http.MethodPost, "/v1/completions", plain, nil)
		noHeaders("an answer", r.header)
		return r.status == http.StatusOK
	})
	kv, err := s.jetStream(t).KeyValue(context.Background(), "baton_budgets")
	if err != nil {
		t.Fatalf("the budgets bucket (provisioned with the log): %v", err)
	}
	lister, err := kv.ListKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var written []string
	for k := range lister.Keys() {
		written = append(written, k)
	}
	if len(written) != 0 {
		t.Errorf("the budgets bucket holds %v, want nothing written without budgets", written)
	}
	if st, err := kv.Status(context.Background()); err != nil {
		t.Errorf("the budgets bucket's status: %v", err)
	} else if st.Values() != 0 {
		t.Errorf("the budgets bucket's history holds %d values, want none ever written", st.Values())
	}
}

// TestBudgetsFailClosed: a budgeted tenant's create that needs the budgets
// bucket while NATS cannot be reached (the server stopped, SIGSTOP) gets
// 503 budget_unavailable with Retry-After once the check's timeout (2 s)
// passes, not an admission; once NATS answers again, she is admitted.
func TestBudgetsFailClosed(t *testing.T) {
	s := newStack(t)
	args, _ := s.tenantFiles(t, "bob rpm=600\n", "bob "+bobKey, "admin "+adminKey)
	f := s.frontend(nil, args...)
	s.worker("w1", "--mock-tokens-per-sec", "2000", "--mock-ttft", "1ms")
	waitRoutableAs(t, apiClient{f.url, adminKey}, "w1")
	bob := apiClient{f.url, bobKey}
	plain, _ := json.Marshal(map[string]any{"model": "mock", "prompt": "closed", "max_tokens": 2})

	// bob holds no slice of his budget yet: his check needs the bucket.
	s.nats.signal(syscall.SIGSTOP)
	t.Cleanup(func() { s.nats.signal(syscall.SIGCONT) })
	start := time.Now()
	r := bob.do(t, http.MethodPost, "/v1/completions", plain, nil)
	took := time.Since(start)
	s.nats.signal(syscall.SIGCONT)
	r.want(t, "bob's create with NATS stopped", http.StatusServiceUnavailable, "budget_unavailable")
	if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("the 503 with Retry-After %q, want whole seconds", r.header.Get("Retry-After"))
	}
	t.Logf("bob refused %v after his create, NATS stopped", took)

	waitFor(t, 20*time.Second, "bob to be admitted once NATS answers again", func() bool {
		r := bob.do(t, http.MethodPost, "/v1/completions", plain, nil)
		return r.status == http.StatusOK && r.header.Get("x-ratelimit-limit-requests") == "600"
	})
}
