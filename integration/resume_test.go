package integration

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
)

// resume reconnects to request id on frontend f after SSE id lastID.
func resume(t testing.TB, f *frontend, id, lastID string) sseResult {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, f.url+"/v1/requests/"+id+"/stream", nil)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("resume %s on %s: %v", id, f.name, err)
	}
	defer resp.Body.Close()
	return readStream(t, resp, nil)
}

// lastID is the id of the last event a client saw (its resume point).
func lastID(res sseResult) string {
	if len(res.events) == 0 {
		return "0"
	}
	return res.events[len(res.events)-1].id
}

// joined checks that a first, cut stream and its resumption form the exact
// fault-free output with contiguous ids.
func joined(t *testing.T, first, rest sseResult, prompt string, maxTokens int) {
	t.Helper()
	from, _ := strconv.Atoi(lastID(first))
	checkIDs(t, first, 0)
	if rest.status != 200 || !rest.done {
		t.Fatalf("resumed stream: status %d done %v error %s", rest.status, rest.done, rest.errorBody)
	}
	checkIDs(t, rest, from)
	if got, want := first.text+rest.text, engine.MockText(prompt, 0, maxTokens); got != want {
		t.Fatalf("resumed text differs from a fault-free run:\n got %q\nwant %q", got, want)
	}
}

// twoFrontends starts NATS, two frontends (with the disconnect fast path)
// and two workers at 100 tokens/s, on a request log of testPartitions
// partitions.
func twoFrontends(t *testing.T, frontendArgs ...string) (*stack, *frontend, *frontend) {
	t.Helper()
	return twoFrontendsWorkers(t, nil, frontendArgs...)
}

// twoFrontendsWorkers is twoFrontends with workerArgs added to both workers'.
func twoFrontendsWorkers(t *testing.T, workerArgs []string, frontendArgs ...string) (*stack, *frontend, *frontend) {
	t.Helper()
	s := newStack(t)
	s.partitions = testPartitions
	args := append([]string{"--nats-system-url", s.sysURL(), "--migration-limit", "3"}, frontendArgs...)
	f1 := s.frontend(nil, args...)
	f2 := s.frontend(nil, args...)
	wargs := append([]string{"--mock-tokens-per-sec", "100", "--mock-ttft", "10ms"}, workerArgs...)
	s.worker("w1", wargs...)
	s.worker("w2", wargs...)
	f1.waitRoutable(t, "w1", "w2")
	f2.waitRoutable(t, "w1", "w2")
	s.checkPartitions(t, testPartitions)
	return s, f1, f2
}

// releaseWhenOwned opens the hold (--mock-hold-at-token) of the worker with
// process pid once frontend f reports that it owns request id, in the
// background: the test goroutine meanwhile resumes the stream, which waits
// for the rest. A request held until its new owner has taken it over is
// still running when the takeover is looked for, however slow the machine.
// If f never owns it within 30 s the hold opens anyway, and the test's own
// checks say what went wrong.
func releaseWhenOwned(f *frontend, id, owner string, pid int) {
	go func() {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			var st struct {
				Owner string `json:"owner"`
			}
			resp, err := http.Get(f.url + "/v1/requests/" + id)
			if err == nil {
				ok := resp.StatusCode == 200 && decodeJSON(resp.Body, &st) == nil && st.Owner == owner
				resp.Body.Close()
				if ok {
					break
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		_ = syscall.Kill(pid, syscall.SIGUSR1)
	}()
}

// TestResumeAfterFrontendKill kills the frontend mid-stream; the client
// resumes on the other frontend from its last SSE id and gets exactly the rest.
func TestResumeAfterFrontendKill(t *testing.T) {
	t.Parallel()
	_, f1, f2 := twoFrontends(t)
	prompt := "resume after a frontend crash"
	var once sync.Once
	first := postStream(t, f1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 100},
		map[string]string{"X-Request-Id": "fe-kill", "X-Resumable": "true"}, func(e sseEvent) {
			if n, _ := strconv.Atoi(e.id); n >= 20 {
				once.Do(func() { f1.signal(syscall.SIGKILL) })
			}
		})
	if first.done {
		t.Fatal("the first stream completed: the kill came too late")
	}
	rest := resume(t, f2, "fe-kill", lastID(first))
	joined(t, first, rest, prompt, 100)
	if got := f2.metric(t, "dynamo_frontend_model_resume_total", "model", "mock"); got != 1 {
		t.Errorf("resume_total on frontend 2 = %v, want 1", got)
	}
}

// TestResumeMigratesWhenWorkerDiedUnattended kills the frontend, then the
// serving worker while no frontend owns the request; the frontend the client
// resumes on takes the request over and migrates it.
func TestResumeMigratesWhenWorkerDiedUnattended(t *testing.T) {
	t.Parallel()
	s, f1, f2 := twoFrontends(t)
	prompt := "both the frontend and the worker die"
	var once sync.Once
	first := postStream(t, f1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 150},
		map[string]string{"X-Request-Id": "both-die", "X-Resumable": "true"}, func(e sseEvent) {
			if n, _ := strconv.Atoi(e.id); n >= 20 {
				once.Do(func() {
					w := f1.servingWorker(t, "both-die")
					f1.signal(syscall.SIGKILL)
					s.workers[w].signal(syscall.SIGKILL)
				})
			}
		})
	rest := resume(t, f2, "both-die", lastID(first))
	joined(t, first, rest, prompt, 150)
	st := f2.state(t, "both-die")
	if len(st.Migrations) != 1 || st.Migrations[0].MigrationType != "ongoing_request" {
		t.Errorf("migrations = %+v, want one ongoing_request", st.Migrations)
	}
	if got := f2.metric(t, "dynamo_frontend_model_migration_total", "migration_type", "ongoing_request"); got != 1 {
		t.Errorf("frontend 2 migrations = %v, want 1", got)
	}
}

// TestResumeCases covers resume after completion, from 0, past the end, with
// bad offsets, of unknown ids, and two clients resuming one request on two
// frontends at once.
func TestResumeCases(t *testing.T) {
	t.Parallel()
	_, f1, f2 := twoFrontends(t)
	prompt := "resume cases"
	full := postStream(t, f1.url, "/v1/chat/completions", map[string]any{
		"model": "mock", "messages": []map[string]any{{"role": "user", "content": prompt}}, "max_tokens": 30,
	}, map[string]string{"X-Request-Id": "done-1"}, nil)
	if !full.done {
		t.Fatalf("first run failed: %s", full.errorBody)
	}
	for _, from := range []string{"0", "", "10", "30"} {
		res := resume(t, f2, "done-1", from)
		n, _ := strconv.Atoi(from)
		if !res.done || res.text != full.text[len(textOfTokens(full.text, n)):] {
			t.Errorf("resume from %q: done=%v text %q", from, res.done, res.text)
		}
		checkIDs(t, res, n)
	}
	for _, c := range []struct{ lastID, want string }{
		{"-1", "400"}, {"abc", "400"}, {"31", "400"},
	} {
		res := resume(t, f2, "done-1", c.lastID)
		if strconv.Itoa(res.status) != c.want {
			t.Errorf("Last-Event-ID %q: status %d, want %s (%s)", c.lastID, res.status, c.want, res.errorBody)
		}
	}
	if res := resume(t, f2, "no-such-request", ""); res.status != 404 {
		t.Errorf("unknown id: status %d, want 404", res.status)
	}

	// Two clients resume one live request on two frontends at once: both get
	// the whole text.
	var once sync.Once
	started := make(chan struct{})
	var first sseResult
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		first = postStream(t, f1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 80},
			map[string]string{"X-Request-Id": "shared"}, func(e sseEvent) { once.Do(func() { close(started) }) })
	}()
	<-started
	results := make([]sseResult, 2)
	for i, f := range []*frontend{f1, f2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = resume(t, f, "shared", "0")
		}()
	}
	wg.Wait()
	want := engine.MockText(prompt, 0, 80)
	for i, res := range append(results, first) {
		if res.text != want || !res.done {
			t.Errorf("client %d: done=%v text %q, want %q", i, res.done, res.text, want)
		}
	}
	if st := f2.state(t, "shared"); st.Status != "completed" {
		t.Errorf("state = %+v", st)
	}
}

// textOfTokens returns the first n tokens of a mock text (each ends with a space).
func textOfTokens(text string, n int) string {
	i, seen := 0, 0
	for seen < n && i < len(text) {
		if text[i] == ' ' {
			seen++
		}
		i++
	}
	return text[:i]
}

// TestDetachTimeout: a resumable client that leaves and comes back within the
// detach timeout continues; one that never comes back is cancelled at the
// timeout and the worker is freed.
func TestDetachTimeout(t *testing.T) {
	_, f1, _ := twoFrontends(t, "--detach-timeout", "1500ms")
	prompt := "come back later"
	// Leave after 10 tokens, come back 0.5 s later.
	cut := func(id string) sseResult {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f1.url+"/v1/completions",
			jsonBody(map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 300, "stream": true}))
		req.Header.Set("X-Request-Id", id)
		req.Header.Set("X-Resumable", "true")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return readStream(t, resp, func(e sseEvent) {
			if n, _ := strconv.Atoi(e.id); n >= 10 {
				cancel()
			}
		})
	}
	first := cut("detach-back")
	time.Sleep(500 * time.Millisecond) // the client is away (this is the scenario, not synchronisation)
	rest := resume(t, f1, "detach-back", lastID(first))
	joined(t, first, rest, prompt, 300)

	cut("detach-gone")
	waitFor(t, 10*time.Second, "the abandoned request to be cancelled", func() bool {
		return f1.state(t, "detach-gone").Status == "cancelled"
	})
	waitFor(t, 10*time.Second, "workers to go idle", func() bool {
		ws, err := f1.workers()
		if err != nil {
			return false
		}
		for _, w := range ws {
			if w.Load.ActiveRequests != 0 {
				return false
			}
		}
		return true
	})
}

// TestCrashedFrontendLeaksNothing: a frontend dies mid-stream and no client
// ever re-attaches: the worker cancels the request once the detach timeout
// has passed since the owner vanished, and goes idle.
func TestCrashedFrontendLeaksNothing(t *testing.T) {
	t.Parallel()
	_, f1, f2 := twoFrontends(t, "--detach-timeout", "1s")
	var once sync.Once
	first := postStream(t, f1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "orphan", "max_tokens": 2000},
		map[string]string{"X-Request-Id": "orphan"}, func(e sseEvent) {
			if n, _ := strconv.Atoi(e.id); n >= 10 {
				once.Do(func() { f1.signal(syscall.SIGKILL) })
			}
		})
	if first.done {
		t.Fatal("stream completed before the kill")
	}
	waitFor(t, 15*time.Second, "the orphaned request to be cancelled", func() bool {
		return f2.state(t, "orphan").Status == "cancelled"
	})
	workersIdle(t, f2)
	if st := f2.state(t, "orphan"); st.TokensGenerated >= 2000 {
		t.Errorf("the orphan ran to the end (%d tokens): nothing cancelled it", st.TokensGenerated)
	}
}
