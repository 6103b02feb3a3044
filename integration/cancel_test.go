package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
)

// Cancels: by hand (stop and kill), by a client that disconnects, of a
// parent's choices, and before the first token, where the engine's slot
// must come free.

func cancelRequest(t testing.TB, f *frontend, id, mode string) map[string]any {
	t.Helper()
	resp := post(t, f.url+"/v1/requests/"+id+"/cancel", map[string]any{"mode": mode}, nil)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("cancel %s: status %d: %s", id, resp.StatusCode, body)
	}
	var out map[string]any
	_ = json.Unmarshal(body, &out)
	return out
}

// workersIdle waits until no worker reports an active request.
func workersIdle(t testing.TB, f *frontend) {
	t.Helper()
	waitFor(t, 10*time.Second, "workers to go idle", func() bool {
		ws, err := f.workers()
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

// TestCancelStopAndKill: stop ends the stream normally with finish_reason
// cancelled and [DONE]; kill ends it with an error event; a non-streaming
// request that is killed gets 499; cancelling a finished request is a no-op
// that says so; both free the worker.
func TestCancelStopAndKill(t *testing.T) {
	_, f1, _ := twoFrontends(t)
	prompt := "cancel me"
	body := map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 500}
	var once sync.Once
	stopped := postStream(t, f1.url, "/v1/completions", body, map[string]string{"X-Request-Id": "c-stop"}, func(e sseEvent) {
		if n, _ := strconv.Atoi(e.id); n >= 10 {
			once.Do(func() { cancelRequest(t, f1, "c-stop", "stop") })
		}
	})
	if !stopped.done || stopped.finish != "cancelled" || stopped.errorBody != "" {
		t.Errorf("stop: done=%v finish=%q error=%s, want [DONE] and cancelled", stopped.done, stopped.finish, stopped.errorBody)
	}
	if want := engine.MockText(prompt, 0, 500); !strings.HasPrefix(want, stopped.text) || len(stopped.text) >= len(want) {
		t.Errorf("stop: text is not a strict prefix of the full output: %q", stopped.text)
	}
	checkIDs(t, stopped, 0)

	var once2 sync.Once
	killed := postStream(t, f1.url, "/v1/completions", body, map[string]string{"X-Request-Id": "c-kill"}, func(e sseEvent) {
		if n, _ := strconv.Atoi(e.id); n >= 10 {
			once2.Do(func() { cancelRequest(t, f1, "c-kill", "kill") })
		}
	})
	if killed.done || !strings.Contains(killed.errorBody, "cancel") {
		t.Errorf("kill: done=%v error=%q, want an error event and no [DONE]", killed.done, killed.errorBody)
	}

	// Non-streaming, killed from another client while it waits.
	go func() {
		waitFor(t, 10*time.Second, "c-unary to start", func() bool { return answers200(http.DefaultClient, f1.url+"/v1/requests/c-unary") })
		cancelRequest(t, f1, "c-unary", "kill")
	}()
	resp := post(t, f1.url+"/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 500},
		map[string]string{"X-Request-Id": "c-unary"})
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 499 || !strings.Contains(string(b), `"error"`) {
		t.Errorf("killed unary: status %d body %s, want 499 with an error body", resp.StatusCode, b)
	}

	again := cancelRequest(t, f1, "c-stop", "kill")
	if again["cancelled"] != false || !strings.Contains(again["message"].(string), "already ended") {
		t.Errorf("cancel of a finished request = %v, want a no-op that says so", again)
	}
	workersIdle(t, f1)
	if got := f1.metric(t, "dynamo_frontend_model_cancellation_total", "model", "mock"); got != 3 {
		t.Errorf("cancellation_total = %v, want 3", got)
	}
}

// TestClientDisconnectFreesWorker: a non-resumable client that goes away
// kills its request; the worker stops within a token interval.
func TestClientDisconnectFreesWorker(t *testing.T) {
	_, f1, _ := twoFrontends(t)
	leaveAfter(t, f1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "leave early", "max_tokens": 1000},
		map[string]string{"X-Request-Id": "gone"}, 5)
	waitFor(t, 10*time.Second, "the request to be cancelled", func() bool { return f1.state(t, "gone").Status == "cancelled" })
	workersIdle(t, f1)
	st := f1.state(t, "gone")
	time.Sleep(200 * time.Millisecond) // 20 token intervals: nothing more may be generated
	if after := f1.state(t, "gone"); after.TokensGenerated != st.TokensGenerated {
		t.Errorf("tokens grew after the kill: %d -> %d", st.TokensGenerated, after.TokensGenerated)
	}
	if got := f1.metric(t, "dynamo_frontend_disconnected_clients"); got < 1 {
		t.Errorf("disconnected_clients = %v", got)
	}
}

// TestChoicesAndParentCancel: n=3 runs three child requests (each the
// deterministic text), and cancelling a parent stops its children on
// different workers.
func TestChoicesAndParentCancel(t *testing.T) {
	_, f1, f2 := twoFrontends(t)
	prompt := "three ways"
	res := postStream(t, f1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 20, "n": 3},
		map[string]string{"X-Request-Id": "three"}, nil)
	if !res.done {
		t.Fatalf("n=3 stream: %s", res.errorBody)
	}
	want := engine.MockText(prompt, 0, 20)
	for i := range 3 {
		if st := f1.state(t, "three-"+strconv.Itoa(i)); st.Status != "completed" || st.TokensGenerated != 20 {
			t.Errorf("choice %d: %+v", i, st)
		}
	}
	if res.text != want+want+want && len(res.text) != 3*len(want) {
		t.Errorf("n=3 delivered %d bytes, want %d", len(res.text), 3*len(want))
	}

	// A parent with three children, started through two frontends.
	parentDone := make(chan sseResult, 1)
	go func() {
		parentDone <- postStream(t, f1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "parent", "max_tokens": 1000},
			map[string]string{"X-Request-Id": "parent"}, nil)
	}()
	waitFor(t, 10*time.Second, "parent to run", func() bool { return answers200(http.DefaultClient, f1.url+"/v1/requests/parent") })
	children := make(chan sseResult, 3)
	for i, f := range []*frontend{f1, f2, f2} {
		go func() {
			children <- postStream(t, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "child " + strconv.Itoa(i), "max_tokens": 1000},
				map[string]string{"X-Request-Id": "child-" + strconv.Itoa(i), "X-Parent-Request-Id": "parent"}, nil)
		}()
	}
	waitFor(t, 10*time.Second, "children to be linked", func() bool {
		var st struct {
			Children []string `json:"children"`
		}
		getJSON(t, f1.url+"/v1/requests/parent", 200, &st)
		return len(st.Children) == 3
	})
	cancelRequest(t, f2, "parent", "kill")
	if p := <-parentDone; p.done {
		t.Error("parent stream completed after a kill")
	}
	for range 3 {
		if c := <-children; c.done || !strings.Contains(c.errorBody, "cancel") {
			t.Errorf("child: done=%v error=%q, want a cancel error", c.done, c.errorBody)
		}
	}
	workersIdle(t, f1)
}

// A cancel that reaches the frontend before the first token must free the
// engine, not only record a cancel event: in Dynamo a client that left
// before its first token kept its request in the engine for 11-55 s, with no
// abort reaching the engine at all (PR #14507). These tests hold a request
// in its time to first token, cancel it in each way, and watch the engine
// itself: the mock's own count of aborted generations (the worker's status
// server), or the vLLM simulator's (/sim/status).

// abortBudget is how soon after the cancel the engine must have let go.
const abortBudget = 100 * time.Millisecond

// engineStatus is the part of a worker's /health the cancel tests read.
type engineStatus struct {
	InFlight        int    `json:"in_flight"`
	EngineActive    int    `json:"engine_active"`
	EngineAborted   int64  `json:"engine_aborted"`
	EngineLastAbort string `json:"engine_last_abort"`
}

// engineOf reads the worker status server at url (/health answers 503
// with the same body while the worker is not ready).
func engineOf(t testing.TB, url string) engineStatus {
	t.Helper()
	var st engineStatus
	getDecoded(t, url+"/health", &st)
	return st
}

// simStatus is the simulator's /sim/status.
type simStatus struct {
	Running   int       `json:"running"`
	Aborted   int64     `json:"aborted"`
	LastAbort time.Time `json:"last_abort"`
}

func (s *simProc) status(t testing.TB) simStatus {
	t.Helper()
	var st simStatus
	getJSON(t, s.url+"/sim/status", 200, &st)
	return st
}

// cancelWays are the ways a client ends a request before its first token:
// a non-resumable client going away, and the cancel API in each mode.
var cancelWays = []string{"disconnect", "stop", "kill"}

// heldStream is a streaming request waiting for its first token.
type heldStream struct {
	id     string
	cancel context.CancelFunc // the client's own context: cancelling it disconnects
	done   chan sseResult
}

// holdStream starts a non-resumable streaming request id through fe; the
// caller waits until the engine holds it.
func holdStream(t *testing.T, fe *frontend, id string, body map[string]any) *heldStream {
	ctx, cancel := context.WithCancel(context.Background())
	h := &heldStream{id: id, cancel: cancel, done: make(chan sseResult, 1)}
	body["stream"] = true
	go func() {
		resp, err := tryPost(ctx, fe.url+"/v1/completions", body, map[string]string{"X-Request-Id": id})
		if err != nil {
			h.done <- sseResult{}
			return
		}
		defer resp.Body.Close()
		h.done <- readStream(t, resp, nil)
	}()
	t.Cleanup(cancel)
	return h
}

// end ends the held request in way, and returns when the client has done so.
func (h *heldStream) end(t *testing.T, fe *frontend, way string) {
	t.Helper()
	switch way {
	case "disconnect":
		h.cancel()
	default:
		cancelRequest(t, fe, h.id, way)
	}
}

// checkEnded checks how the client's stream ended for way: a stop finishes
// with finish_reason cancelled and [DONE], a kill with an error event; a
// disconnected client reads nothing more.
func (h *heldStream) checkEnded(t *testing.T, way string) {
	t.Helper()
	var res sseResult
	select {
	case res = <-h.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s (%s): the client's stream did not end within 10s of the cancel", h.id, way)
	}
	switch way {
	case "stop":
		if !res.done || res.finish != "cancelled" || res.text != "" {
			t.Errorf("%s (stop): done %v finish %q text %q error %s; want [DONE], cancelled, no text", h.id, res.done, res.finish, res.text, res.errorBody)
		}
	case "kill":
		if res.done || res.errorBody == "" || res.text != "" {
			t.Errorf("%s (kill): done %v text %q error %q; want an error event and no text", h.id, res.done, res.text, res.errorBody)
		}
	}
}

// endTimed ends h in way and checks that who (the engine, the simulator:
// read says how many generations it aborted, and when the last) let go of
// h's generation within abortBudget of it, and that h ended as way ends a
// stream.
func (h *heldStream) endTimed(t *testing.T, fe *frontend, way, who string, read func() (int64, time.Time), abortedBefore int64) {
	t.Helper()
	cancelled := time.Now()
	h.end(t, fe, way)
	at := waitAbort(t, way, read, abortedBefore)
	took := at.Sub(cancelled)
	t.Logf("%s: %s let go %v after the cancel", way, who, took.Round(100*time.Microsecond))
	if took > abortBudget {
		t.Errorf("%s: %s aborted %v after the cancel, want within %v", way, who, took, abortBudget)
	}
	h.checkEnded(t, way)
}

// waitAbort waits until the engine has counted one more abort than before
// and returns when it let go, as the engine recorded it.
func waitAbort(t *testing.T, what string, read func() (int64, time.Time), before int64) time.Time {
	t.Helper()
	var at time.Time
	waitFor(t, 10*time.Second, what+": the engine to abort the generation", func() bool {
		n, last := read()
		at = last
		return n > before
	})
	return at
}

// TestCancelBeforeFirstTokenFreesEngine: a request waits in its engine for
// the first token (a 10 s TTFT, far longer than the test); it is ended by
// its client going away (not resumable), by a stop and by a kill. Each
// time, the engine aborts the generation within 100 ms of the cancel and
// holds nothing afterwards: with the mock engine (its own count, through
// the worker's status server) and with the OpenAI engine in front of the
// vLLM simulator, scripted to send no first token (the simulator's count:
// the HTTP request to it was dropped, not left to run).
func TestCancelBeforeFirstTokenFreesEngine(t *testing.T) {
	t.Run("mock", func(t *testing.T) {
		s := newStack(t)
		fe := s.frontend(nil)
		sys := freePort(t)
		s.worker("w1", "--mock-ttft", "10s", "--system-port", strconv.Itoa(sys))
		fe.waitRoutable(t, "w1")
		wurl := "http://127.0.0.1:" + strconv.Itoa(sys)
		read := func() (int64, time.Time) {
			st := engineOf(t, wurl)
			at, _ := time.Parse(time.RFC3339Nano, st.EngineLastAbort)
			return st.EngineAborted, at
		}
		for _, way := range cancelWays {
			t.Run(way, func(t *testing.T) {
				before := engineOf(t, wurl)
				disconnected := fe.metric(t, "dynamo_frontend_disconnected_clients")
				h := holdStream(t, fe, "early-"+way, completion("early "+way, 50))
				waitFor(t, 10*time.Second, "the engine to hold the request", func() bool { return engineOf(t, wurl).EngineActive == 1 })
				h.endTimed(t, fe, way, "the engine", read, before.EngineAborted)
				if st := engineOf(t, wurl); st.EngineActive != 0 || st.EngineAborted != before.EngineAborted+1 {
					t.Errorf("%s: after the abort the engine holds %d, aborted %d; want 0 and %d", way, st.EngineActive, st.EngineAborted, before.EngineAborted+1)
				}
				if way == "disconnect" {
					// The cut was real: the frontend saw the client go. Its
					// handler counts it as it returns, which may be after
					// the cancel it sent reached the engine.
					waitFor(t, 10*time.Second, fmt.Sprintf("disconnected_clients = %v", disconnected+1), func() bool {
						return fe.metric(t, "dynamo_frontend_disconnected_clients") == disconnected+1
					})
				}
				workersIdle(t, fe)
			})
		}
	})
	t.Run("openai", func(t *testing.T) {
		// The worker's probes must pass: only the test's requests (their
		// prompts say "early") wait for a first token that never comes.
		sim := startSim(t, "sim", "--greedy", "--fault", "stall", "--fault-match", "early")
		s := newStack(t)
		fe := s.frontend(nil)
		sys := freePort(t)
		s.openaiWorker("oa1", sim, "--first-token-timeout", "60s", "--system-port", strconv.Itoa(sys))
		fe.waitRoutable(t, "oa1")
		wurl := "http://127.0.0.1:" + strconv.Itoa(sys)
		read := func() (int64, time.Time) { st := sim.status(t); return st.Aborted, st.LastAbort }
		for _, way := range cancelWays {
			t.Run(way, func(t *testing.T) {
				before := sim.status(t)
				workerBefore := engineOf(t, wurl)
				body := completion("early "+way, 50)
				body["model"] = "sim"
				h := holdStream(t, fe, "early-oa-"+way, body)
				waitFor(t, 10*time.Second, "the simulator to hold the request", func() bool { return sim.status(t).Running == before.Running+1 })
				h.endTimed(t, fe, way, "the simulator", read, before.Aborted)
				waitFor(t, 5*time.Second, "the simulator and the engine to hold nothing", func() bool {
					st := engineOf(t, wurl)
					return sim.status(t).Running == before.Running && st.EngineActive == 0
				})
				if st := engineOf(t, wurl); st.EngineAborted != workerBefore.EngineAborted+1 {
					t.Errorf("%s: the worker's engine counted %d aborts, want %d", way, st.EngineAborted, workerBefore.EngineAborted+1)
				}
				workersIdle(t, fe)
			})
		}
	})
}

// TestCancelBeforeFirstTokenUnderLoad: a worker with two engine slots
// (--max-concurrent-requests 2, a 1 s TTFT) gets round after round of two
// requests that are cancelled before their first token, in every way. A
// slot left occupied by one of them would refuse the next round (503, all
// workers busy). Every round's requests are admitted at once, the engine
// counts every abort. Then cancels race the dispatch itself (sent as soon
// as the request is accepted): the engine is free again after each. At the
// end the worker holds nothing and two requests queued behind the cancels
// take both slots at once and run to their fault-free text.
func TestCancelBeforeFirstTokenUnderLoad(t *testing.T) {
	s := newStack(t)
	fe := s.frontend(nil)
	sys := freePort(t)
	s.worker("w1", "--mock-ttft", "1s", "--mock-tokens-per-sec", "200", "--max-concurrent-requests", "2", "--system-port", strconv.Itoa(sys))
	fe.waitRoutable(t, "w1")
	wurl := "http://127.0.0.1:" + strconv.Itoa(sys)

	const rounds = 9
	start := engineOf(t, wurl)
	var slowest time.Duration
	for r := range rounds {
		hs := make([]*heldStream, 2)
		for i := range hs {
			hs[i] = holdStream(t, fe, fmt.Sprintf("load-%d-%d", r, i), completion(fmt.Sprintf("load %d %d", r, i), 50))
		}
		waitFor(t, 5*time.Second, fmt.Sprintf("round %d: both requests in the engine", r), func() bool { return engineOf(t, wurl).EngineActive == 2 })
		before := engineOf(t, wurl).EngineAborted
		cancelled := time.Now()
		var wg sync.WaitGroup
		for i, h := range hs {
			way := cancelWays[(r*2+i)%len(cancelWays)]
			wg.Go(func() { h.end(t, fe, way) })
		}
		wg.Wait()
		waitFor(t, 5*time.Second, fmt.Sprintf("round %d: both aborts", r), func() bool {
			st := engineOf(t, wurl)
			return st.EngineAborted == before+2 && st.EngineActive == 0
		})
		at, _ := time.Parse(time.RFC3339Nano, engineOf(t, wurl).EngineLastAbort)
		slowest = max(slowest, at.Sub(cancelled))
		for i, h := range hs {
			h.checkEnded(t, cancelWays[(r*2+i)%len(cancelWays)])
		}
	}
	t.Logf("%d rounds of 2 cancels before the first token: the slowest round's engine let go %v after its cancels", rounds, slowest.Round(100*time.Microsecond))
	if slowest > abortBudget {
		t.Errorf("slowest abort %v after the cancel, want within %v", slowest, abortBudget)
	}
	if got := engineOf(t, wurl).EngineAborted - start.EngineAborted; got != 2*rounds {
		t.Errorf("engine aborts = %d, want %d", got, 2*rounds)
	}

	// Cancels that race the dispatch: each is sent as soon as the frontend
	// has answered the POST, before the worker may even have the request.
	// Whether it reached the engine or not, the engine is free again well
	// within the time a leaked generation would hold it (1 s TTFT + 50
	// tokens at 200/s).
	for i := range 12 {
		way := cancelWays[i%len(cancelWays)]
		id := fmt.Sprintf("race-%d", i)
		h := holdStream(t, fe, id, completion("race "+strconv.Itoa(i), 50))
		waitFor(t, 5*time.Second, id+" accepted", func() bool { return answers200(http.DefaultClient, fe.url+"/v1/requests/"+id) })
		h.end(t, fe, way)
		h.checkEnded(t, way)
		waitFor(t, 500*time.Millisecond, id+" ("+way+"): the engine free again", func() bool {
			st := engineOf(t, wurl)
			return st.EngineActive == 0 && st.InFlight == 0
		})
	}

	// Two requests queued behind the cancels take both slots at once and
	// finish with the fault-free text.
	type queued struct {
		prompt string
		res    sseResult
	}
	results := make(chan queued, 2)
	for i := range 2 {
		prompt := "behind " + strconv.Itoa(i)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			body := completion(prompt, 20)
			body["stream"] = true
			resp, err := tryPost(ctx, fe.url+"/v1/completions", body, nil)
			if err != nil {
				results <- queued{prompt, sseResult{errorBody: err.Error()}}
				return
			}
			defer resp.Body.Close()
			results <- queued{prompt, readStream(t, resp, nil)}
		}()
	}
	waitFor(t, 5*time.Second, "both queued requests in the engine at once", func() bool { return engineOf(t, wurl).EngineActive == 2 })
	for range 2 {
		q := <-results
		if want := engine.MockText(q.prompt, 0, 20); q.res.status != 200 || !q.res.done || q.res.text != want {
			t.Errorf("queued request %q: status %d done %v text %q error %s; want the fault-free text", q.prompt, q.res.status, q.res.done, q.res.text, q.res.errorBody)
		}
	}
	workersIdle(t, fe)
	if st := engineOf(t, wurl); st.InFlight != 0 || st.EngineActive != 0 {
		t.Errorf("worker at the end: %d in flight, %d in the engine; want 0", st.InFlight, st.EngineActive)
	}
}
