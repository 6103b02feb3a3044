package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/engine"
)

// fakeOpenAI speaks the streaming /v1/completions format: it answers with
// chunks, each an SSE data event, spaced by gap, then [DONE].
type fakeOpenAI struct {
	t      *testing.T
	chunks []string
	finish string        // finish_reason of the last chunk
	gap    time.Duration // between chunks
	status int           // non-200 to fail
	noDone bool          // end the stream without [DONE] or a finish reason

	mu   sync.Mutex
	reqs []map[string]any
	auth []string
}

func (f *fakeOpenAI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/completions" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.reqs = append(f.reqs, body)
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	f.mu.Unlock()
	if f.status != 0 {
		http.Error(w, `{"error":{"message":"model not found"}}`, f.status)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for i, c := range f.chunks {
		if i > 0 && f.gap > 0 {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(f.gap):
			}
		}
		fr := "null"
		if i == len(f.chunks)-1 && !f.noDone {
			fr = fmt.Sprintf("%q", f.finish)
		}
		fmt.Fprintf(w, "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":%q,\"finish_reason\":%s}]}\n\n", c, fr)
		fl.Flush()
	}
	if !f.noDone {
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
}

func (f *fakeOpenAI) requests() []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reqs)
}

func newOpenAI(t *testing.T, f *fakeOpenAI, url string) *engine.OpenAI {
	t.Helper()
	e, err := engine.NewOpenAI(engine.OpenAIConfig{URL: url, Model: "qwen", APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func generateAll(t *testing.T, e engine.Engine, ctx context.Context, req engine.Request) ([]string, string, error) {
	t.Helper()
	var toks []string
	res, err := e.Generate(ctx, req, func(tk engine.Token) error { toks = append(toks, tk.Text); return nil })
	return toks, res.FinishReason, err
}

func TestOpenAIStreamsTokens(t *testing.T) {
	f := &fakeOpenAI{t: t, chunks: []string{" The", " quick brown", " fox\n", "jumps"}, finish: "stop"}
	srv := httptest.NewServer(f)
	defer srv.Close()
	e := newOpenAI(t, f, srv.URL+"/v1/") // a /v1 suffix is accepted
	toks, reason, err := generateAll(t, e, context.Background(), engine.Request{
		RequestID: "r", Prompt: "Once upon", Generated: " a time,", StartOffset: 3, MaxTokens: 103,
	})
	if err != nil || reason != engine.FinishStop {
		t.Fatalf("Generate = %q, %v, want stop", reason, err)
	}
	if got, want := strings.Join(toks, ""), " The quick brown fox\njumps"; got != want {
		t.Errorf("text %q, want %q", got, want)
	}
	if want := []string{" The", " quick brown", " fox\n", "jumps"}; !slices.Equal(toks, want) {
		t.Errorf("tokens %q, want %q", toks, want)
	}
	reqs := f.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	r := reqs[0]
	if r["model"] != "qwen" || r["prompt"] != "Once upon a time," || r["max_tokens"] != float64(100) || r["stream"] != true {
		t.Errorf("request body %v", r)
	}
	if f.auth[0] != "Bearer k" {
		t.Errorf("authorization %q", f.auth[0])
	}
	if s := e.Stats(); s.ActiveRequests != 0 {
		t.Errorf("active after the end: %d", s.ActiveRequests)
	}
}

func TestOpenAIOutcomes(t *testing.T) {
	for _, tc := range []struct {
		name       string
		f          *fakeOpenAI
		max        int
		wantReason string
		wantErr    bool
		wantTokens int
	}{
		{"length from server", &fakeOpenAI{chunks: []string{"a", " b"}, finish: "length"}, 10, engine.FinishLength, false, 2},
		{"cut at the budget", &fakeOpenAI{chunks: []string{"a", " b", " c", " d"}, finish: "stop"}, 2, engine.FinishLength, false, 2},
		{"http error", &fakeOpenAI{status: http.StatusNotFound}, 10, "", true, 0},
		{"truncated stream", &fakeOpenAI{chunks: []string{"a"}, noDone: true}, 10, "", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.f
			srv := httptest.NewServer(f)
			defer srv.Close()
			toks, reason, err := generateAll(t, newOpenAI(t, f, srv.URL), context.Background(), engine.Request{Prompt: "p", MaxTokens: tc.max})
			if (err != nil) != tc.wantErr || reason != tc.wantReason || len(toks) != tc.wantTokens {
				t.Errorf("got %q %v with %d tokens, want %q err=%v with %d", reason, err, len(toks), tc.wantReason, tc.wantErr, tc.wantTokens)
			}
			if errors.Is(err, engine.ErrFatal) {
				t.Errorf("error %v wraps ErrFatal; a server can come back", err)
			}
		})
	}
}

func TestOpenAIZeroBudgetSendsNothing(t *testing.T) {
	f := &fakeOpenAI{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	_, reason, err := generateAll(t, newOpenAI(t, f, srv.URL), context.Background(), engine.Request{Prompt: "p", StartOffset: 5, MaxTokens: 5})
	if err != nil || reason != engine.FinishLength || len(f.requests()) != 0 {
		t.Errorf("got %q %v after %d requests, want length and none", reason, err, len(f.requests()))
	}
}

func TestOpenAICancel(t *testing.T) {
	chunks := make([]string, 1000)
	for i := range chunks {
		chunks[i] = " w"
	}
	f := &fakeOpenAI{chunks: chunks, finish: "length", gap: 20 * time.Millisecond}
	srv := httptest.NewServer(f)
	defer srv.Close()
	e := newOpenAI(t, f, srv.URL)
	ctx, cancel := context.WithCancel(context.Background())
	var n int
	var mu sync.Mutex
	var cancelledAt time.Time
	_, err := e.Generate(ctx, engine.Request{Prompt: "p", MaxTokens: 1000}, func(engine.Token) error {
		mu.Lock()
		defer mu.Unlock()
		if n++; n == 3 {
			if e.Stats().ActiveRequests != 1 {
				t.Errorf("active while generating: %d, want 1", e.Stats().ActiveRequests)
			}
			cancelledAt = time.Now()
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Generate = %v, want context.Canceled", err)
	}
	if d := time.Since(cancelledAt); d > time.Second {
		t.Errorf("returned %v after the cancel", d)
	}
	if n != 3 {
		t.Errorf("%d tokens emitted, want 3 (none after the cancel)", n)
	}
	if s := e.Stats(); s.ActiveRequests != 0 {
		t.Errorf("active after cancel: %d", s.ActiveRequests)
	}
}

func TestOpenAIConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  engine.OpenAIConfig
		ok   bool
	}{
		{"ok", engine.OpenAIConfig{URL: "http://127.0.0.1:8000", Model: "m"}, true},
		{"no url", engine.OpenAIConfig{Model: "m"}, false},
		{"bad scheme", engine.OpenAIConfig{URL: "ftp://x", Model: "m"}, false},
		{"no model", engine.OpenAIConfig{URL: "http://x"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); (err == nil) != tc.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// A finished stream leaves its connection to the server for the next
// request: a new TCP connection per request would put a handshake and the
// server's accept before every first token.
func TestOpenAIReusesConnections(t *testing.T) {
	f := &fakeOpenAI{t: t, chunks: []string{" a", " b"}, finish: "stop"}
	srv := httptest.NewUnstartedServer(f)
	var mu sync.Mutex
	conns := 0
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			conns++
			mu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	e := newOpenAI(t, f, srv.URL)
	for i := range 20 {
		if _, _, err := generateAll(t, e, context.Background(), engine.Request{RequestID: fmt.Sprint("r", i), Prompt: "p", MaxTokens: 10}); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if conns != 1 {
		t.Errorf("20 sequential requests opened %d connections, want 1", conns)
	}
}

// TestOpenAIEmptyAnswerSaysWhatTheServerSaid: a stream that ends before its
// first token, with no finish reason nor [DONE], fails as an empty answer;
// what the server said outside the stream's events (where a request-caused
// failure may put it) is in the failure, an error object read as an error
// event is.
func TestOpenAIEmptyAnswerSaysWhatTheServerSaid(t *testing.T) {
	for _, tc := range []struct {
		name, body          string
		wantCode, wantInMsg string
		wantStatus          int
	}{
		{"nothing said", "data: {\"choices\":[{\"index\":0,\"text\":\"\"}]}\n\n", events.CodeEmptyAnswer, "before the first token", 0},
		{"comments and event names only", ": ping\nevent: message\ndata: {\"choices\":[{\"index\":0,\"text\":\"\"}]}\n\n", events.CodeEmptyAnswer, "before the first token", 0},
		{"words", "data: {\"choices\":[{\"index\":0,\"text\":\"\"}]}\n\ninvalid JSON schema: unknown type \"strng\"\n", events.CodeEmptyAnswer, `the server said: invalid JSON schema: unknown type "strng"`, 0},
		{"an error object", "data: {\"choices\":[{\"index\":0,\"text\":\"\"}]}\n\n{\"error\":{\"message\":\"schema too deep\",\"code\":400}}\n", "", "schema too deep", 400},
		{"an error: line", "data: {\"choices\":[{\"index\":0,\"text\":\"\"}]}\n\nerror: {\"error\":{\"message\":\"grammar failed\",\"type\":\"invalid_request_error\"}}\n", "invalid_request_error", "grammar failed", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, tc.body)
			}))
			defer srv.Close()
			_, _, err := generateAll(t, newOpenAI(t, nil, srv.URL), context.Background(), engine.Request{Prompt: "p", MaxTokens: 5})
			var ue *engine.UpstreamError
			if !errors.As(err, &ue) {
				t.Fatalf("got %v, want an UpstreamError", err)
			}
			if ue.Code != tc.wantCode || !strings.Contains(ue.Message, tc.wantInMsg) || ue.Status != tc.wantStatus {
				t.Errorf("got code %q status %d message %q, want code %q status %d and %q in the message",
					ue.Code, ue.Status, ue.Message, tc.wantCode, tc.wantStatus, tc.wantInMsg)
			}
		})
	}
}
