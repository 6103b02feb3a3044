package integration

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestConsoleTenants: the console's tenants panel, in headless chromium,
// lists every tenant of the keys file with the admin's key, and shows
// alice's budget left across the frontends, her share of the log, and what
// this frontend admitted and refused of hers.
func TestConsoleTenants(t *testing.T) {
	s := newStack(t)
	keys, budgets := filepath.Join(s.dir, "keys"), filepath.Join(s.dir, "budgets")
	writeKeys(t, keys, "alice "+aliceKey, "bob "+bobKey, "admin "+adminKey)
	if err := os.WriteFile(budgets, []byte("alice rpm=20 log=0.3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := s.frontend(nil, "--api-keys-file", keys, "--tenant-budgets-file", budgets)
	s.worker("w1", "--mock-tokens-per-sec", "2000", "--mock-ttft", "1ms")
	waitRoutableAs(t, apiClient{f.url, adminKey}, "w1")
	body, _ := bodyOf(map[string]any{"model": "mock", "prompt": "counted", "max_tokens": 2})
	var codes []int
	for range 3 { // rpm 20: a burst of 2
		codes = append(codes, apiClient{f.url, aliceKey}.do(t, http.MethodPost, "/v1/completions", body, nil).status)
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 {
		t.Fatalf("alice's creates: got %v, want 200 200 429", codes)
	}
	apiClient{f.url, aliceKey}.get(t, "/v1/console/tenants").want(t, "the tenants panel's data with alice's key", http.StatusForbidden, "permission_denied")

	ctx := newBrowser(t)
	browse(t, ctx, 20*time.Second, "load the console and enter the admin's key",
		chromedp.Navigate(f.url+"/console"),
		chromedp.SendKeys(css(`#key`), adminKey),
		chromedp.Click(css(`#keyform button`)),
	)
	alice := `#tenants tr[data-tenant="alice"]`
	browse(t, ctx, 20*time.Second, "see alice's and bob's rows, alice's counts",
		chromedp.WaitVisible(css(`#tenants tr[data-tenant="bob"]`)),
		chromedp.WaitVisible(css(alice)),
		chromedp.Poll[chromedp.Void](`document.querySelector('`+alice+` td:nth-child(7)')?.textContent === '2'`,
			chromedp.WithPollingInterval(50*time.Millisecond)),
	)
	for _, c := range []struct{ col, want string }{
		{"2", "of 20/min"},
		{"5", " of "}, // her bytes of her share's limit
		{"8", "1 requests"},
	} {
		got := value(t, ctx, "read alice's column "+c.col, chromedp.Text(css(alice+` td:nth-child(`+c.col+`)`)))
		if !strings.Contains(got, c.want) {
			t.Errorf("alice's column %s: got %q, want it to contain %q", c.col, got, c.want)
		}
	}
}
