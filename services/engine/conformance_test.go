package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
)

// conformance is what every Engine must do, whatever it runs on: the worker
// relies on each property.
func conformance(t *testing.T, newEngine func(t *testing.T) engine.Engine) {
	t.Run("emits the budget in order and finishes with length", func(t *testing.T) {
		e := newEngine(t)
		for _, start := range []int{0, 3} {
			var toks []string
			res, err := e.Generate(context.Background(), engine.Request{Prompt: "alpha beta", PromptTokens: 2, StartOffset: start, MaxTokens: 12},
				func(tk engine.Token) error { toks = append(toks, tk.Text); return nil })
			if err != nil || res.FinishReason != engine.FinishLength || len(toks) != 12-start {
				t.Fatalf("start %d: %d tokens, reason %q, err %v; want %d, length, nil", start, len(toks), res.FinishReason, err, 12-start)
			}
			for i, tok := range toks {
				if tok == "" {
					t.Fatalf("start %d: token %d is empty", start, i)
				}
			}
		}
	})
	t.Run("an emit error stops generation and is returned", func(t *testing.T) {
		e := newEngine(t)
		stop := errors.New("client gone")
		n := 0
		_, err := e.Generate(context.Background(), engine.Request{Prompt: "p", MaxTokens: 50},
			func(engine.Token) error { n++; return stop })
		if !errors.Is(err, stop) || n != 1 {
			t.Fatalf("err %v after %d emits, want %v after 1", err, n, stop)
		}
	})
	t.Run("cancellation stops generation promptly", func(t *testing.T) {
		e := newEngine(t)
		ctx, cancel := context.WithCancel(context.Background())
		n := 0
		start := time.Now()
		_, err := e.Generate(ctx, engine.Request{Prompt: "p", MaxTokens: 100000}, func(engine.Token) error {
			if n++; n == 3 {
				cancel()
			}
			return nil
		})
		if err == nil || time.Since(start) > 5*time.Second {
			t.Fatalf("err %v after %v, want a cancellation error at once", err, time.Since(start))
		}
		if n > 20 {
			t.Errorf("%d tokens emitted after the cancel", n-3)
		}
	})
	t.Run("concurrent generations are independent and stats return to idle", func(t *testing.T) {
		e := newEngine(t)
		var wg sync.WaitGroup
		texts := make([]string, 8)
		for i := range texts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var b strings.Builder
				if _, err := e.Generate(context.Background(), engine.Request{Prompt: "same prompt", PromptTokens: 2, MaxTokens: 20},
					func(tk engine.Token) error { b.WriteString(tk.Text); return nil }); err != nil {
					t.Error(err)
				}
				texts[i] = b.String()
			}()
		}
		wg.Wait()
		for i := range texts {
			if texts[i] != texts[0] {
				t.Errorf("generation %d differs from generation 0 for the same request", i)
			}
		}
		if s := e.Stats(); s.ActiveRequests != 0 {
			t.Errorf("active requests after all ended = %d, want 0", s.ActiveRequests)
		}
	})
}

func TestMockConformance(t *testing.T) {
	conformance(t, func(t *testing.T) engine.Engine {
		e, err := engine.NewMock(engine.MockConfig{SpeedupRatio: 1000})
		if err != nil {
			t.Fatal(err)
		}
		return e
	})
}

// TestOpenAIConformance runs the suite against the OpenAI adapter talking to
// an OpenAI-compatible server whose text comes from the mock engine, one token
// per chunk.
func TestOpenAIConformance(t *testing.T) {
	conformance(t, func(t *testing.T) engine.Engine {
		srv := httptest.NewServer(&mockBackedServer{t: t})
		t.Cleanup(srv.Close)
		e, err := engine.NewOpenAI(engine.OpenAIConfig{URL: srv.URL, Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		return e
	})
}

// mockBackedServer speaks the OpenAI streaming completions protocol, with
// text from the mock engine (one token per chunk, 1 ms apart) for the
// requested prompt and max_tokens.
type mockBackedServer struct{ t *testing.T }

func (s *mockBackedServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Prompt    string `json:"prompt"`
		MaxTokens int    `json:"max_tokens"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	mock, _ := engine.NewMock(engine.MockConfig{TokensPerSec: 1000, TTFT: time.Millisecond})
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	_, err := mock.Generate(r.Context(), engine.Request{Prompt: req.Prompt, MaxTokens: req.MaxTokens}, func(tk engine.Token) error {
		tok := tk.Text
		_, err := fmt.Fprintf(w, "data: {\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":%q,\"finish_reason\":null}]}\n\n", tok)
		fl.Flush()
		return err
	})
	if err != nil {
		return
	}
	fmt.Fprint(w, "data: {\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n")
	fl.Flush()
}
