package events

import (
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"
)

// TestPlainPathIsValidSource: every source plainPath lets through without
// parsing is one url.Parse accepts as validate requires, and baton's own
// sources take the fast path.
func TestPlainPathIsValidSource(t *testing.T) {
	parsed := func(s string) bool {
		u, err := url.Parse(s)
		return err == nil && strings.TrimSpace(u.String()) != ""
	}
	for _, s := range []string{"baton/worker/w1", "baton/frontend/fe-1", "baton/worker/up-w_2.x~y"} {
		if !plainPath(s) {
			t.Errorf("plainPath(%q) = false, want the fast path", s)
		}
	}
	const alphabet = "aZ09-._~/:?#%@ \t[]"
	r := rand.New(rand.NewPCG(1, 2))
	for range 100_000 {
		b := make([]byte, 1+r.IntN(8))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		if s := string(b); plainPath(s) && !parsed(s) {
			t.Fatalf("plainPath(%q) = true, but url.Parse does not accept it", s)
		}
	}
}
