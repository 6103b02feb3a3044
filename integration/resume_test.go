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
)

// Resume: a client reconnects to its request on another frontend after its
// own died, the detach timeout, and orphans (requests whose frontend died
// with no client reading) adopted by a live frontend.

// resume reconnects to request id on frontend f after SSE id lastID.
func resume(t testing.TB, f *frontend, id, lastID string) sseResult {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, f.url+"/v1/requests/"+id+"/stream", nil)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("resume %s on %s: %v", id, f.Name, err)
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
	s, f1, f2 := twoFrontendsWorkers(t, []string{"--mock-hold-at-token", "40"}) // held there until the kill
	prompt := "resume after a frontend crash"
	first := streamFaults(t, f1, "fe-kill", prompt, 100, true, faultAt{20, func() {
		f1.signal(syscall.SIGKILL)
		s.release("")
	}})
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
	s, f1, f2 := twoFrontendsWorkers(t, []string{"--mock-hold-at-token", "40"}) // held there until the kills
	prompt := "both the frontend and the worker die"
	first := streamFaults(t, f1, "both-die", prompt, 150, true, faultAt{20, func() {
		w := f1.servingWorker(t, "both-die")
		f1.signal(syscall.SIGKILL)
		s.workers[w].signal(syscall.SIGKILL)
		s.release(w)
	}})
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
		return leaveAfter(t, f1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 300},
			map[string]string{"X-Request-Id": id, "X-Resumable": "true"}, 10)
	}
	first := cut("detach-back")
	time.Sleep(500 * time.Millisecond) // the client is away (this is the scenario, not synchronisation)
	rest := resume(t, f1, "detach-back", lastID(first))
	joined(t, first, rest, prompt, 300)

	cut("detach-gone")
	waitFor(t, 10*time.Second, "the abandoned request to be cancelled", func() bool {
		return f1.state(t, "detach-gone").Status == "cancelled"
	})
	workersIdle(t, f1)
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
	waitFor(t, 15*time.Second, f.Name+" to adopt", func() bool { return f.metric(t, "baton_frontend_requests_adopted_total") >= 1 })
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

// holdAt is where the orphan tests' workers hold every request
// (--mock-hold-at-token) until killBoth has killed one: a request held
// there is still running when the kills come, however slow the machine.
const holdAt = 40

// killBoth kills -9 frontend f1 and the worker serving request id, once
// the log holds at least n (at most holdAt) of its tokens, then opens the
// other workers' holds so that the request's continuation runs to its end;
// it returns when it killed them.
func killBoth(t *testing.T, s *stack, f1 *frontend, id string, n int) time.Time {
	t.Helper()
	var st requestState
	waitFor(t, 10*time.Second, id+" to produce tokens", func() bool { st = f1.state(t, id); return st.TokensGenerated >= n })
	if st.Status != "running" {
		t.Fatalf("status %q before the kills, want running: the kills come too late", st.Status)
	}
	f1.signal(syscall.SIGKILL)
	s.workers[st.Worker].signal(syscall.SIGKILL)
	killed := time.Now()
	s.release(st.Worker)
	return killed
}

// TestOrphanBackgroundResponseAdopted: a background response created on
// frontend 1, which no client follows, outlives frontend 1 and its worker,
// both killed: frontend 2 adopts it with no reader, migrates it, and the
// log says it completed with the undisturbed text.
func TestOrphanBackgroundResponseAdopted(t *testing.T) {
	t.Parallel()
	s, f1, f2 := twoFrontendsWorkers(t, []string{"--mock-hold-at-token", strconv.Itoa(holdAt)}, "--default-max-tokens", "300", "--migration-limit", "2")
	question := "nobody reads this background answer"
	created := createBackground(t, f1.url, question)
	if !created.Background {
		t.Fatalf("create: background %v, want true", created.Background)
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
	s, f1, f2 := twoFrontendsWorkers(t, []string{"--mock-hold-at-token", strconv.Itoa(holdAt)}, "--migration-limit", "2", "--detach-timeout", "60s")
	prompt := "the client of this stream left"
	// The client leaves after 10 tokens.
	leaveAfter(t, f1.url, "/v1/chat/completions", map[string]any{
		"model": "mock", "messages": []map[string]any{{"role": "user", "content": prompt}}, "max_tokens": 300,
	}, map[string]string{"X-Request-Id": "left", "X-Resumable": "true"}, 10)
	killed := killBoth(t, s, f1, "left", 20)
	r := waitAdoptedAndCompleted(t, s, f2, "left", killed)
	if want := engine.MockText("user: "+prompt, 0, 300); r.Output != want {
		t.Fatalf("text differs from an undisturbed answer:\n got %q\nwant %q", r.Output, want)
	}
	if got := f2.metric(t, "baton_frontend_requests_adopted_total"); got != 1 {
		t.Errorf("adoptions on frontend 2 = %v, want 1", got)
	}
}

// TestOrphanTakenBackByItsRestartedFrontend: a frontend killed with its
// worker and started again under the same id within the presence TTL (a
// supervisor's restart) takes back the background response its earlier
// run listed: its key never went, so no other frontend would adopt it. The
// response migrates and completes in the log, owned by the same id, with
// the undisturbed text.
func TestOrphanTakenBackByItsRestartedFrontend(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	args := []string{"--migration-limit", "2", "--default-max-tokens", "300"}
	f1 := s.frontend(nil, args...)
	wargs := []string{"--mock-tokens-per-sec", "100", "--mock-ttft", "10ms", "--mock-hold-at-token", strconv.Itoa(holdAt)}
	s.worker("w1", wargs...)
	s.worker("w2", wargs...)
	f1.waitRoutable(t, "w1", "w2")
	question := "taken back after a restart"
	created := createBackground(t, f1.url, question)
	killed := killBoth(t, s, f1, created.ID, 20)
	again := s.frontend(nil, append(args, "--frontend-id", f1.Name)...)
	if since := time.Since(killed); since > 5*time.Second {
		t.Fatalf("the frontend took %v to start again: its key (TTL 6 s) may have expired, which is not what this test checks", since)
	}
	adopted := waitAdopted(t, again, killed)
	var r replayed
	waitFor(t, 30*time.Second, "the response completed in the log", func() bool {
		r = replayOf(t, s, created.ID)
		return r.Request.Status == "completed"
	})
	t.Logf("taken back %v after the kills", adopted)
	if r.Request.Owner != f1.Name {
		t.Errorf("owner %q, want %s (the same id, started again)", r.Request.Owner, f1.Name)
	}
	if len(r.Request.Migrations) != 1 || r.Request.Migrations[0].MigrationType != "ongoing_request" {
		t.Errorf("migrations %+v, want one ongoing_request", r.Request.Migrations)
	}
	if want := engine.MockText("user: "+question, 0, 300); r.Output != want {
		t.Fatalf("text differs from an undisturbed answer:\n got %q\nwant %q", r.Output, want)
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
	created := createBackground(t, f1.url, question)
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
	created := createBackground(t, f1.url, question)
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
