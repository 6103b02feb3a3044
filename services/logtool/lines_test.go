package logtool

import (
	"testing"

	"github.com/baton-dev/baton/projections"
)

// TestTokensAndExactLines: the summary says the server's completion count
// beside the tokens streamed when they differ (issue 35: 299 streamed, 300
// in the usage), and whether the continuations were exact.
func TestTokensAndExactLines(t *testing.T) {
	yes, no := true, false
	for _, c := range []struct {
		name        string
		st          projections.State
		tokens, ext string
	}{
		{"plain", projections.State{TokensGenerated: 5, CompletionTokens: 5, Exact: true, Attempts: []projections.Attempt{{}}},
			"5 generated", ""},
		{"server counted more", projections.State{TokensGenerated: 299, CompletionTokens: 300, Exact: true},
			"299 streamed; 300 completion tokens (the server's count, as in the usage)", ""},
		{"exact continuation", projections.State{TokensGenerated: 9, Exact: true, Attempts: []projections.Attempt{{}, {Attempt: 1, StartOffset: 4, Exact: &yes}}},
			"9 generated", "true: every continuation was exact"},
		{"approximate continuation", projections.State{TokensGenerated: 9, Attempts: []projections.Attempt{{}, {Attempt: 1, StartOffset: 4, Exact: &no}}},
			"9 generated", "false: attempt 1 approximate"},
		{"not shown exact", projections.State{TokensGenerated: 9, Attempts: []projections.Attempt{{}, {Attempt: 1, StartOffset: 4}}},
			"9 generated", "false: attempt 1 not shown exact"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := tokensLine(c.st); got != c.tokens {
				t.Errorf("tokens: got %q, want %q", got, c.tokens)
			}
			if got := exactLine(c.st); got != c.ext {
				t.Errorf("exact: got %q, want %q", got, c.ext)
			}
		})
	}
}
