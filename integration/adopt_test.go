package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

// replayed is what `baton replay --json` says of a request: its state as
// folded from the log, and its text.
type replayed struct {
	Request struct {
		Status     string `json:"status"`
		Owner      string `json:"owner"`
		Migrations []struct {
			MigrationType string `json:"migration_type"`
		} `json:"migrations"`
	} `json:"request"`
	Output string `json:"output"`
}

// replayOf folds request id from the log with `baton replay --json`: no
// frontend reads it, so none takes it over for a reader.
func replayOf(t *testing.T, s *stack, id string) replayed {
	t.Helper()
	out, errOut, code := runTool(t, batonBin, "replay", "--json", "--nats", s.natsURL, id)
	if code != 0 {
		t.Fatalf("replay %s: exit %d: %s", id, code, errOut)
	}
	var r replayed
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("replay --json %s: %v", id, err)
	}
	return r
}

// waitAdopted waits until frontend f counts an adoption, and returns how
// long after killed that was (to within a poll of its metrics).
func waitAdopted(t *testing.T, f *frontend, killed time.Time) time.Duration {
	t.Helper()
	waitFor(t, 15*time.Second, f.name+" to adopt", func() bool { return f.metric(t, "baton_frontend_requests_adopted_total") >= 1 })
	return time.Since(killed)
}

// waitAdoptedAndCompleted waits, with no reader, until frontend-2 (f2)
// adopted request id and the log says it completed, for at most 30 s after
// killed, and logs how long each took.
func waitAdoptedAndCompleted(t *testing.T, s *stack, f2 *frontend, id string, killed time.Time) replayed {
	t.Helper()
	adopted := waitAdopted(t, f2, killed)
	var r replayed
	waitFor(t, 30*time.Second, id+" completed in the log, with no reader", func() bool {
		r = replayOf(t, s, id)
		return r.Request.Status == "completed"
	})
	t.Logf("%s: adopted %v after the kills, completed in the log %v after them (to within a replay)", id, adopted, time.Since(killed))
	if r.Request.Owner != "frontend-2" {
		t.Errorf("owner %q, want frontend-2 (the adopter)", r.Request.Owner)
	}
	if len(r.Request.Migrations) != 1 || r.Request.Migrations[0].MigrationType != "ongoing_request" {
		t.Errorf("migrations %+v, want one ongoing_request", r.Request.Migrations)
	}
	return r
}

// killBoth kills -9 frontend f1 and the worker serving request id, once
// the log holds at least n of its tokens; it returns when.
func killBoth(t *testing.T, s *stack, f1 *frontend, id string, n int) time.Time {
	t.Helper()
	var st requestState
	waitFor(t, 10*time.Second, id+" to produce tokens", func() bool { st = f1.state(t, id); return st.TokensGenerated >= n })
	if st.Status != "running" {
		t.Fatalf("status %q before the kills, want running: the kills come too late", st.Status)
	}
	f1.signal(syscall.SIGKILL)
	s.workers[st.Worker].signal(syscall.SIGKILL)
	return time.Now()
}

// TestOrphanBackgroundResponseAdopted: a background response created on
// frontend 1, which no client follows, outlives frontend 1 and its worker,
// both killed: frontend 2 adopts it with no reader, migrates it, and the
// log says it completed with the undisturbed text.
func TestOrphanBackgroundResponseAdopted(t *testing.T) {
	t.Parallel()
	s, f1, f2 := twoFrontends(t, "--default-max-tokens", "300", "--migration-limit", "2")
	question := "nobody reads this background answer"
	created, err := sdk(f1.url, "").Responses.New(context.Background(), responses.ResponseNewParams{
		Model: "mock", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(question)},
		Background: openai.Bool(true),
	})
	if err != nil || !created.Background {
		t.Fatalf("create: %v, background %v", err, created.Background)
	}
	killed := killBoth(t, s, f1, created.ID, 20)
	r := waitAdoptedAndCompleted(t, s, f2, created.ID, killed)
	if want := engine.MockText("user: "+question, 0, 300); r.Output != want {
		t.Fatalf("text differs from an undisturbed answer:\n got %q\nwant %q", r.Output, want)
	}
	if got := f2.metric(t, "baton_frontend_requests_adopted_total"); got != 1 {
		t.Errorf("adoptions on frontend 2 = %v, want 1", got)
	}
	// Only now a client reads it, on frontend 2: the completed response.
	if got := getResponse(t, apiClient{url: f2.url}, created.ID); got["status"] != "completed" {
		t.Errorf("GET on frontend 2: status %v, want completed", got["status"])
	}
}

// TestOrphanResumableStreamAdopted: an X-Resumable chat stream whose client
// left, then whose frontend and worker are killed, is adopted and completes
// in the log. (A plain request whose frontend died is not adopted, and is
// cancelled after the detach timeout as before: TestCrashedFrontendLeaksNothing.)
func TestOrphanResumableStreamAdopted(t *testing.T) {
	t.Parallel()
	s, f1, f2 := twoFrontends(t, "--migration-limit", "2", "--detach-timeout", "60s")
	prompt := "the client of this stream left"
	// The client leaves after 10 tokens.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f1.url+"/v1/chat/completions", jsonBody(map[string]any{
		"model": "mock", "messages": []map[string]any{{"role": "user", "content": prompt}}, "max_tokens": 300, "stream": true,
	}))
	req.Header.Set("X-Request-Id", "left")
	req.Header.Set("X-Resumable", "true")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readStream(t, resp, func(e sseEvent) {
		if n, _ := strconv.Atoi(e.id); n >= 10 {
			cancel()
		}
	})
	resp.Body.Close()
	cancel()
	killed := killBoth(t, s, f1, "left", 20)
	r := waitAdoptedAndCompleted(t, s, f2, "left", killed)
	if want := engine.MockText("user: "+prompt, 0, 300); r.Output != want {
		t.Fatalf("text differs from an undisturbed answer:\n got %q\nwant %q", r.Output, want)
	}
	if got := f2.metric(t, "baton_frontend_requests_adopted_total"); got != 1 {
		t.Errorf("adoptions on frontend 2 = %v, want 1", got)
	}
}

// TestOrphanResumableStillDetaches: an adopted resumable request that no
// client comes back to is still cancelled after the detach timeout: the
// adoption does not keep it alive for good.
func TestOrphanResumableStillDetaches(t *testing.T) {
	t.Parallel()
	s, f1, f2 := twoFrontends(t, "--detach-timeout", "2s")
	var once sync.Once
	res := postStream(t, f1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "gone for good", "max_tokens": 3000},
		map[string]string{"X-Request-Id": "gone", "X-Resumable": "true"}, func(e sseEvent) {
			if n, _ := strconv.Atoi(e.id); n >= 10 {
				once.Do(func() { f1.signal(syscall.SIGKILL) })
			}
		})
	if res.done {
		t.Fatal("the stream completed before the kill")
	}
	killed := time.Now()
	waitFor(t, 15*time.Second, "the adopted request to be cancelled", func() bool {
		return replayOf(t, s, "gone").Request.Status == "cancelled"
	})
	t.Logf("cancelled %v after the kill", time.Since(killed))
	r := replayOf(t, s, "gone")
	if r.Request.Owner != "frontend-2" {
		t.Errorf("owner %q, want frontend-2 (the adopter, which cancels it)", r.Request.Owner)
	}
	if got := f2.metric(t, "baton_frontend_requests_adopted_total"); got != 1 {
		t.Errorf("adoptions on frontend 2 = %v, want 1", got)
	}
	workersIdle(t, f2)
}

// TestOrphanAdoptedAtPresenceExpiry: without the disconnect advisory (no
// system account), a killed frontend's background response is adopted when
// its presence key expires, within the presence TTL (6 s) of the kill; its
// worker lives, so it is not migrated.
func TestOrphanAdoptedAtPresenceExpiry(t *testing.T) {
	s := newStack(t)
	args := []string{"--migration-limit", "2", "--default-max-tokens", "1200"}
	f1 := s.frontend(nil, args...)
	f2 := s.frontend(nil, args...)
	s.worker("w1", "--mock-tokens-per-sec", "100", "--mock-ttft", "10ms")
	f1.waitRoutable(t, "w1")
	question := "adopted when the key expires"
	created, err := sdk(f1.url, "").Responses.New(context.Background(), responses.ResponseNewParams{
		Model: "mock", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(question)},
		Background: openai.Bool(true),
	})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	waitFor(t, 10*time.Second, "tokens", func() bool { return f1.state(t, created.ID).TokensGenerated >= 10 })
	f1.signal(syscall.SIGKILL)
	killed := time.Now()
	adopted := waitAdopted(t, f2, killed)
	t.Logf("adopted %v after the kill", adopted)
	// The key expires 6 s after its last renewal at most; the server's
	// expiry of it and this test's polls of the log add a little.
	if adopted > 8*time.Second {
		t.Errorf("adopted %v after the kill, want within the presence TTL (6 s) and 2 s of slack", adopted)
	}
	waitFor(t, 30*time.Second, "the response completed", func() bool {
		return replayOf(t, s, created.ID).Request.Status == "completed"
	})
	r := replayOf(t, s, created.ID)
	if r.Request.Owner != "frontend-2" {
		t.Errorf("owner %q, want frontend-2 (the adopter)", r.Request.Owner)
	}
	if want := engine.MockText("user: "+question, 0, 1200); r.Output != want || len(r.Request.Migrations) != 0 {
		t.Errorf("text equal to an undisturbed answer: %v, migrations %+v (want none)", r.Output == want, r.Request.Migrations)
	}
}

// TestOrphanAdoptedAfterShutdown: a frontend shut down (SIGTERM) deletes
// its presence key once its streams are cut, and the background response it
// owned is adopted at once and completes, on its own worker.
func TestOrphanAdoptedAfterShutdown(t *testing.T) {
	t.Parallel()
	s, f1, f2 := twoFrontends(t, "--default-max-tokens", "800")
	question := "handed over at shutdown"
	created, err := sdk(f1.url, "").Responses.New(context.Background(), responses.ResponseNewParams{
		Model: "mock", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(question)},
		Background: openai.Bool(true),
	})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	waitFor(t, 10*time.Second, "tokens", func() bool { return f1.state(t, created.ID).TokensGenerated >= 10 })
	f1.signal(syscall.SIGTERM)
	if code := f1.wait(15 * time.Second); code != 0 {
		t.Fatalf("frontend 1 exited %d, want 0", code)
	}
	stopped := time.Now()
	t.Logf("seen adopted %v after frontend 1 exited (the first poll)", waitAdopted(t, f2, stopped))
	waitFor(t, 30*time.Second, "the response completed", func() bool {
		return replayOf(t, s, created.ID).Request.Status == "completed"
	})
	r := replayOf(t, s, created.ID)
	if want := engine.MockText("user: "+question, 0, 800); r.Output != want || r.Request.Owner != "frontend-2" || len(r.Request.Migrations) != 0 {
		t.Errorf("owner %q, migrations %+v, text undisturbed %v: want frontend-2, none, true", r.Request.Owner, r.Request.Migrations, r.Output == want)
	}
}
