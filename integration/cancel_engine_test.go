package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
)

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
	resp, err := http.Get(url + "/health")
	if err != nil {
		t.Fatalf("GET %s/health: %v", url, err)
	}
	defer resp.Body.Close()
	var st engineStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("GET %s/health: %v", url, err)
	}
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
				cancelled := time.Now()
				h.end(t, fe, way)
				at := waitAbort(t, way, read, before.EngineAborted)
				took := at.Sub(cancelled)
				t.Logf("%s: the engine let go %v after the cancel", way, took.Round(100*time.Microsecond))
				if took > abortBudget {
					t.Errorf("%s: the engine aborted %v after the cancel, want within %v", way, took, abortBudget)
				}
				h.checkEnded(t, way)
				if st := engineOf(t, wurl); st.EngineActive != 0 || st.EngineAborted != before.EngineAborted+1 {
					t.Errorf("%s: after the abort the engine holds %d, aborted %d; want 0 and %d", way, st.EngineActive, st.EngineAborted, before.EngineAborted+1)
				}
				if way == "disconnect" {
					// The cut was real: the frontend saw the client go.
					if got := fe.metric(t, "dynamo_frontend_disconnected_clients"); got != disconnected+1 {
						t.Errorf("disconnected_clients = %v, want %v", got, disconnected+1)
					}
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
				cancelled := time.Now()
				h.end(t, fe, way)
				at := waitAbort(t, way, read, before.Aborted)
				took := at.Sub(cancelled)
				t.Logf("%s: the simulator let go %v after the cancel", way, took.Round(100*time.Microsecond))
				if took > abortBudget {
					t.Errorf("%s: the simulator aborted %v after the cancel, want within %v", way, took, abortBudget)
				}
				h.checkEnded(t, way)
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
		waitFor(t, 5*time.Second, id+" accepted", func() bool {
			resp, err := http.Get(fe.url + "/v1/requests/" + id)
			if err == nil {
				resp.Body.Close()
			}
			return err == nil && resp.StatusCode == 200
		})
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
