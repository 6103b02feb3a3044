package engine_test

import (
	"context"
	"errors"
	"math"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/baton-dev/baton/services/engine"
)

var fullSpeed = engine.MockConfig{SpeedupRatio: math.Inf(1)}

func newMock(t *testing.T, cfg engine.MockConfig) *engine.Mock {
	t.Helper()
	m, err := engine.NewMock(cfg)
	if err != nil {
		t.Fatalf("NewMock: %v", err)
	}
	return m
}

func collect(t *testing.T, m *engine.Mock, req engine.Request) ([]string, string, error) {
	t.Helper()
	var toks []string
	res, err := m.Generate(context.Background(), req, func(tk engine.Token) error {
		tok := tk.Text
		toks = append(toks, tok)
		return nil
	})
	return toks, res.FinishReason, err
}

func TestMockDeterministic(t *testing.T) {
	const prompt = "tell me a story about a lighthouse"
	m := newMock(t, fullSpeed)
	full, reason, err := collect(t, m, engine.Request{Prompt: prompt, MaxTokens: 40})
	if err != nil || reason != engine.FinishLength {
		t.Fatalf("Generate: reason %q err %v, want %q nil", reason, err, engine.FinishLength)
	}
	if len(full) != 40 {
		t.Fatalf("got %d tokens, want 40", len(full))
	}
	again, _, _ := collect(t, newMock(t, fullSpeed), engine.Request{Prompt: prompt, MaxTokens: 40})
	if got, want := strings.Join(again, ""), strings.Join(full, ""); got != want {
		t.Errorf("second run differs:\ngot  %q\nwant %q", got, want)
	}
	if got, want := strings.Join(full, ""), engine.MockText(prompt, 0, 40); got != want {
		t.Errorf("MockText differs:\ngot  %q\nwant %q", got, want)
	}
	for _, k := range []int{1, 17, 39, 40} {
		cont, _, err := collect(t, m, engine.Request{Prompt: prompt, StartOffset: k, MaxTokens: 40, Generated: strings.Join(full[:k], "")})
		if err != nil {
			t.Fatalf("continuation at %d: %v", k, err)
		}
		if got, want := strings.Join(cont, ""), strings.Join(full[k:], ""); got != want {
			t.Errorf("continuation at %d:\ngot  %q\nwant %q", k, got, want)
		}
	}
	for i, tok := range full {
		if !strings.HasSuffix(tok, " ") || strings.Count(tok, " ") != 1 || len(tok) < 2 {
			t.Errorf("token %d = %q, want one word and a space", i, tok)
		}
	}
	distinct := map[string]bool{}
	for _, tok := range full {
		distinct[tok] = true
	}
	if len(distinct) < 10 {
		t.Errorf("only %d distinct words in 40 tokens", len(distinct))
	}
}

func TestMockPromptsDiffer(t *testing.T) {
	a := engine.MockText("hello world", 0, 32)
	b := engine.MockText("hello world!", 0, 32)
	if a == b {
		t.Errorf("different prompts gave the same output %q", a)
	}
}

func TestCountTokens(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{{"", 0}, {"   ", 0}, {"one", 1}, {" two  words\n", 2}, {"a\tb\nc d", 4}} {
		if got := engine.CountTokens(tc.in); got != tc.want {
			t.Errorf("CountTokens(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestMockConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  engine.MockConfig
		ok   bool
	}{
		{"zero is defaults", engine.MockConfig{}, true},
		{"full speed", fullSpeed, true},
		{"negative rate", engine.MockConfig{TokensPerSec: -1}, false},
		{"nan speedup", engine.MockConfig{SpeedupRatio: math.NaN()}, false},
		{"negative ttft", engine.MockConfig{TTFT: -time.Second}, false},
		{"negative blocks", engine.MockConfig{KVBlocks: -1, BlockSize: -2}, false},
		{"negative faults", engine.MockConfig{CrashAfterTokens: -1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if (err == nil) != tc.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tc.ok)
			}
			if _, err := engine.NewMock(tc.cfg); (err == nil) != tc.ok {
				t.Errorf("NewMock() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
	err := engine.MockConfig{TokensPerSec: -1, TTFT: -1}.Validate()
	if err == nil || !strings.Contains(err.Error(), "tokens per second") || !strings.Contains(err.Error(), "ttft") {
		t.Errorf("Validate() = %v, want every problem", err)
	}
}

func TestMockTiming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMock(t, engine.MockConfig{TokensPerSec: 10, TTFT: time.Second, SpeedupRatio: 2})
		start := time.Now()
		var at []time.Duration
		_, err := m.Generate(t.Context(), engine.Request{Prompt: "a b", MaxTokens: 3}, func(engine.Token) error {
			at = append(at, time.Since(start))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		want := []time.Duration{500 * time.Millisecond, 550 * time.Millisecond, 600 * time.Millisecond}
		for i := range want {
			if at[i] != want[i] {
				t.Errorf("token %d at %v, want %v", i, at[i], want[i])
			}
		}
	})
}

func TestMockStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMock(t, engine.MockConfig{TokensPerSec: 1, TTFT: time.Second, KVBlocks: 3, BlockSize: 4})
		if got, want := m.Stats(), (engine.Stats{KVBlocksTotal: 3}); got != want {
			t.Errorf("idle stats %+v, want %+v", got, want)
		}
		var wg sync.WaitGroup
		gen := func(prompt string) {
			wg.Go(func() {
				_, _ = m.Generate(t.Context(), engine.Request{Prompt: prompt, MaxTokens: 5}, func(engine.Token) error { return nil })
			})
		}
		gen("one two three") // 3 prompt tokens
		gen("a b c d e f g") // 7 prompt tokens
		synctest.Wait()
		if got, want := m.Stats(), (engine.Stats{ActiveRequests: 2, KVBlocksUsed: 3, KVBlocksTotal: 3, QueuedPrefillTokens: 10}); got != want {
			t.Errorf("prefill stats %+v, want %+v", got, want)
		}
		time.Sleep(1500 * time.Millisecond) // fake time: one token each
		synctest.Wait()
		// ceil(4/4) + ceil(8/4) = 3 blocks, capped at 3 total.
		if got, want := m.Stats(), (engine.Stats{ActiveRequests: 2, KVBlocksUsed: 3, KVBlocksTotal: 3}); got != want {
			t.Errorf("decode stats %+v, want %+v", got, want)
		}
		wg.Wait()
		if got, want := m.Stats(), (engine.Stats{KVBlocksTotal: 3}); got != want {
			t.Errorf("final stats %+v, want %+v", got, want)
		}
	})
}

func TestMockKVBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMock(t, engine.MockConfig{TokensPerSec: 1, TTFT: time.Second, BlockSize: 4})
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = m.Generate(t.Context(), engine.Request{Prompt: "a b c", MaxTokens: 10}, func(engine.Token) error { return nil })
		}()
		for _, tc := range []struct {
			after time.Duration
			want  int
		}{{0, 1}, {time.Second, 1}, {time.Second, 2}, {4 * time.Second, 3}} {
			time.Sleep(tc.after)
			synctest.Wait()
			if got := m.Stats().KVBlocksUsed; got != tc.want {
				t.Errorf("after +%v: %d blocks, want %d", tc.after, got, tc.want)
			}
		}
		<-done
	})
}

func TestMockCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMock(t, engine.MockConfig{TokensPerSec: 1, TTFT: time.Second})
		ctx, cancel := context.WithCancel(t.Context())
		n := 0
		done := make(chan error)
		go func() {
			_, err := m.Generate(ctx, engine.Request{Prompt: "x", MaxTokens: 1000}, func(engine.Token) error { n++; return nil })
			done <- err
		}()
		time.Sleep(2100 * time.Millisecond)
		start := time.Now()
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Generate after cancel = %v, want context.Canceled", err)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("cancel took %v of fake time, want 0", d)
		}
		if n != 2 {
			t.Errorf("emitted %d tokens, want 2", n)
		}
		if got := m.Stats().ActiveRequests; got != 0 {
			t.Errorf("active after cancel = %d, want 0", got)
		}
	})
}

// TestMockAbortCounted: a generation cancelled during its time to first
// token lets go of the engine at once and counts as aborted, at the moment
// of the cancel; one that finishes, or fails for another reason, does not.
func TestMockAbortCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMock(t, engine.MockConfig{TokensPerSec: 10, TTFT: 5 * time.Second})
		if _, err := m.Generate(t.Context(), engine.Request{Prompt: "x", MaxTokens: 2}, func(engine.Token) error { return nil }); err != nil {
			t.Fatal(err)
		}
		boom := errors.New("boom")
		if _, err := m.Generate(t.Context(), engine.Request{Prompt: "x", MaxTokens: 2}, func(engine.Token) error { return boom }); !errors.Is(err, boom) {
			t.Fatalf("got %v, want the emit error", err)
		}
		if got := m.Stats(); got.Aborted != 0 || !got.LastAbort.IsZero() {
			t.Fatalf("after a finished and a failed generation: aborted %d at %v, want 0", got.Aborted, got.LastAbort)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() {
			_, err := m.Generate(ctx, engine.Request{Prompt: "x", MaxTokens: 100}, func(engine.Token) error {
				t.Error("a token before the first-token time")
				return nil
			})
			done <- err
		}()
		time.Sleep(time.Second)
		synctest.Wait()
		if got := m.Stats(); got.ActiveRequests != 1 || got.QueuedPrefillTokens != 1 {
			t.Fatalf("waiting for the first token: %+v, want 1 active with its prompt queued", got)
		}
		cancelled := time.Now()
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Generate after cancel = %v, want context.Canceled", err)
		}
		got := m.Stats()
		if got.ActiveRequests != 0 || got.Aborted != 1 || !got.LastAbort.Equal(cancelled) {
			t.Errorf("after the cancel: %d active, %d aborted at %v; want 0, 1 at %v", got.ActiveRequests, got.Aborted, got.LastAbort, cancelled)
		}
	})
}

func TestMockEmitError(t *testing.T) {
	m := newMock(t, fullSpeed)
	boom := errors.New("boom")
	_, err := m.Generate(context.Background(), engine.Request{Prompt: "x", MaxTokens: 10}, func(engine.Token) error { return boom })
	if !errors.Is(err, boom) {
		t.Errorf("got %v, want the emit error", err)
	}
}

func TestMockEngineErrorAfter(t *testing.T) {
	m := newMock(t, engine.MockConfig{SpeedupRatio: math.Inf(1), EngineErrorAfter: 2})
	for i := range 4 {
		_, _, err := collect(t, m, engine.Request{Prompt: "x", MaxTokens: 3})
		if wantFail := i >= 2; wantFail != errors.Is(err, engine.ErrFatal) {
			t.Errorf("request %d: err %v, want fatal=%v", i, err, wantFail)
		}
	}
}

func TestMockStallAfterTokens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMock(t, engine.MockConfig{SpeedupRatio: math.Inf(1), StallAfterTokens: 5})
		ctx, cancel := context.WithCancel(t.Context())
		var got []string
		done := make(chan error)
		go func() {
			_, err := m.Generate(ctx, engine.Request{Prompt: "x", MaxTokens: 3}, func(tk engine.Token) error { got = append(got, tk.Text); return nil })
			if err != nil {
				done <- err
				return
			}
			_, err = m.Generate(ctx, engine.Request{Prompt: "x", MaxTokens: 10}, func(tk engine.Token) error { got = append(got, tk.Text); return nil })
			done <- err
		}()
		time.Sleep(time.Hour)
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("stalled engine returned %v", err)
		default:
		}
		if len(got) != 5 {
			t.Errorf("emitted %d tokens before the stall, want 5", len(got))
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("stalled Generate after cancel = %v, want context.Canceled", err)
		}
	})
}

// TestMockHoldAtToken: a generation stops before its token at the hold's
// offset until Release, then goes on with the same text; one that starts
// past the offset, or after the release, is not held; a held one lets go
// when cancelled.
func TestMockHoldAtToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMock(t, engine.MockConfig{SpeedupRatio: math.Inf(1), HoldAtToken: 5})
		gen := func(ctx context.Context, from, to int) (<-chan error, *[]string) {
			var got []string
			done := make(chan error, 1)
			go func() {
				_, err := m.Generate(ctx, engine.Request{Prompt: "x", StartOffset: from, MaxTokens: to}, func(tk engine.Token) error { got = append(got, tk.Text); return nil })
				done <- err
			}()
			return done, &got
		}
		held, heldGot := gen(t.Context(), 0, 10)
		ctx, cancel := context.WithCancel(t.Context())
		cancelled, _ := gen(ctx, 0, 10)
		past, pastGot := gen(t.Context(), 6, 10)
		time.Sleep(time.Hour)
		synctest.Wait()
		if err := <-past; err != nil || strings.Join(*pastGot, "") != engine.MockText("x", 6, 10) {
			t.Errorf("a generation from past the hold = %q, %v; want the text of [6, 10), nil", strings.Join(*pastGot, ""), err)
		}
		select {
		case err := <-held:
			t.Fatalf("held Generate returned %v before the release", err)
		default:
		}
		if got := strings.Join(*heldGot, ""); got != engine.MockText("x", 0, 5) {
			t.Errorf("emitted %q before the release, want the 5 tokens before the hold, %q", got, engine.MockText("x", 0, 5))
		}
		cancel()
		if err := <-cancelled; !errors.Is(err, context.Canceled) {
			t.Errorf("held Generate after cancel = %v, want context.Canceled", err)
		}
		m.Release()
		m.Release() // twice is fine
		if err := <-held; err != nil || strings.Join(*heldGot, "") != engine.MockText("x", 0, 10) {
			t.Errorf("released generation = %q, %v; want the whole text, nil", strings.Join(*heldGot, ""), err)
		}
		after, afterGot := gen(t.Context(), 0, 10)
		if err := <-after; err != nil || len(*afterGot) != 10 {
			t.Errorf("a generation after the release = %d tokens, %v; want 10, nil", len(*afterGot), err)
		}
	})
}

// TestMockCrashAfterTokens runs the crash in a child process (this test
// binary) and checks that it dies by SIGKILL after exactly N tokens.
func TestMockCrashAfterTokens(t *testing.T) {
	if os.Getenv("BATON_MOCK_CRASH_CHILD") == "1" {
		m, err := engine.NewMock(engine.MockConfig{SpeedupRatio: math.Inf(1), CrashAfterTokens: 7})
		if err != nil {
			os.Exit(3)
		}
		_, _ = m.Generate(context.Background(), engine.Request{Prompt: "x", MaxTokens: 100}, func(tk engine.Token) error {
			s := tk.Text
			os.Stdout.WriteString(s + "\n")
			return nil
		})
		os.Exit(0) // not reached
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestMockCrashAfterTokens$")
	cmd.Env = append(os.Environ(), "BATON_MOCK_CRASH_CHILD=1")
	out, err := cmd.Output()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		t.Fatalf("child: %v, want killed", err)
	}
	ws, ok := exitErr.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("child ended with %v, want SIGKILL", exitErr)
	}
	if n := strings.Count(string(out), "\n"); n != 7 {
		t.Errorf("child emitted %d tokens, want 7", n)
	}
}

// TestMockKVBlocksOnBoundaries: the blocks held step up at the token after
// each block boundary, from an empty prompt and from one that fills its
// block exactly, and are all given back at the end.
func TestMockKVBlocksOnBoundaries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMock(t, engine.MockConfig{TokensPerSec: 1, TTFT: time.Second, BlockSize: 2, KVBlocks: 100})
		var wg sync.WaitGroup
		for _, prompt := range []string{"", "a b"} { // 0 and 2 prompt tokens
			wg.Go(func() {
				_, _ = m.Generate(t.Context(), engine.Request{Prompt: prompt, MaxTokens: 4}, func(engine.Token) error { return nil })
			})
		}
		// After k tokens: ceil(k/2) + ceil((2+k)/2) blocks.
		for k, want := range []int{1, 3, 3, 5} {
			synctest.Wait()
			if got := m.Stats(); got.KVBlocksUsed != want || (k == 0) != (got.QueuedPrefillTokens == 2) {
				t.Errorf("after %d tokens: %+v, want %d blocks (and the prompt queued before the first)", k, got, want)
			}
			time.Sleep(time.Second)
		}
		wg.Wait()
		if got := m.Stats(); got.KVBlocksUsed != 0 || got.QueuedPrefillTokens != 0 || got.ActiveRequests != 0 {
			t.Errorf("after the end: %+v, want nothing held", got)
		}
	})
}

// TestMockEmitTime: with EmitTime each token's text is the time it was
// emitted, which EmitTimes reads back, one per token and in order.
func TestMockEmitTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, err := engine.NewMock(engine.MockConfig{EmitTime: true, TTFT: time.Millisecond, TokensPerSec: 1000})
		if err != nil {
			t.Fatal(err)
		}
		var text strings.Builder
		start := time.Now().UnixNano()
		_, err = m.Generate(context.Background(), engine.Request{Prompt: "p", MaxTokens: 5}, func(tok engine.Token) error {
			text.WriteString(tok.Text)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		got := engine.EmitTimes(nil, text.String())
		want := []int64{start + 1e6, start + 2e6, start + 3e6, start + 4e6, start + 5e6}
		if !slices.Equal(got, want) {
			t.Errorf("got emit times %v, want %v (text %q)", got, want, text.String())
		}
	})
}

func TestEmitTimes(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []int64
	}{
		{"none", "a plain answer ", nil},
		{"tokens", "@12 @34 ", []int64{12, 34}},
		{"in an SSE line", `data: {"choices":[{"text":"@5 @6 "}]}`, []int64{5, 6}},
		{"an @ without digits", "mail@ @7 ", []int64{7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := engine.EmitTimes(nil, tc.text); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
