package integration

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Engine liveness and worker health. Issue 35, items 2 and 3: an engine
// is watched, not only used, and its probe tells a busy server from a dead
// one.

// within waits for cond as waitFor does and returns how long it took.
func within(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	waitFor(t, timeout, what, cond)
	return time.Since(start)
}

// TestEngineKilledWhileIdle: with no traffic, a worker whose engine's server
// is killed is not_ready within 3 s (engine_unreachable); /health stays 200
// "degraded", naming it, while its model has another ready worker, and is
// 503 model_not_ready once the model has none, while /v1/models drops the
// model and keeps the one still served. A server back on its port makes the
// worker ready again.
func TestEngineKilledWhileIdle(t *testing.T) {
	portA := freePort(t)
	simA := startSimOn(t, "sim-a", portA, "--greedy")
	simB := startSim(t, "sim-b", "--greedy")
	s := newStack(t)
	fe := s.frontend(nil)
	s.openaiWorker("a", simA)
	s.openaiWorker("b", simB)
	s.worker("m") // the mock model stays served throughout
	fe.waitRoutable(t, "a", "b", "m")
	if code, body := healthOf(t, fe); code != 200 || body["status"] != "healthy" {
		t.Fatalf("/health with every worker ready: %d %v, want 200 healthy", code, body)
	}

	simA.signal(syscall.SIGKILL)
	took := within(t, 5*time.Second, "a not_ready", func() bool {
		w, _ := fe.listedWorker(t, "a")
		return w.State == "not_ready"
	})
	t.Logf("engine killed while idle: worker not_ready after %v", took)
	if took > 3*time.Second {
		t.Errorf("a dead engine seen after %v, want within 3 s", took)
	}
	if w, _ := fe.listedWorker(t, "a"); w.Reason != "engine_unreachable" {
		t.Errorf("a's reason %q, want engine_unreachable", w.Reason)
	}
	code, body := healthOf(t, fe)
	if out, _ := body["workers_out"].([]any); code != 200 || body["status"] != "degraded" || len(out) != 1 || out[0] != "a" {
		t.Errorf("/health with a out and b ready: %d %v, want 200 degraded naming a", code, body)
	}
	if got := listedModels(t, fe); !slices.Equal(got, []string{"mock", "sim"}) {
		t.Errorf("/v1/models with b ready lists %v, want [mock sim]", got)
	}

	simB.signal(syscall.SIGKILL)
	waitFor(t, 5*time.Second, "b not_ready", func() bool { w, _ := fe.listedWorker(t, "b"); return w.State == "not_ready" })
	code, body = healthOf(t, fe)
	if missing, _ := body["models_not_ready"].([]any); code != http.StatusServiceUnavailable || body["status"] != "not_ready" ||
		body["reason"] != "model_not_ready" || len(missing) != 1 || missing[0] != "sim" {
		t.Errorf("/health with no sim worker ready: %d %v, want 503 model_not_ready naming sim", code, body)
	}
	if got := listedModels(t, fe); !slices.Equal(got, []string{"mock"}) {
		t.Errorf("/v1/models with no sim worker ready lists %v, want [mock]", got)
	}

	startSimOn(t, "sim-a-again", portA, "--greedy")
	took = within(t, 10*time.Second, "a ready again", func() bool { w, _ := fe.listedWorker(t, "a"); return w.State == "ready" })
	t.Logf("engine back: worker ready after %v", took)
	if code, body := healthOf(t, fe); code != 200 || body["status"] != "degraded" {
		t.Errorf("/health with a back, b out: %d %v, want 200 degraded", code, body)
	}
}

// TestEngineHungStreamMoved: a stream on a worker whose engine's server is
// stopped (SIGSTOP) moves to another worker within 5 s, far inside the 30 s
// stall timeout, and completes there; the worker is not_ready (engine_hung)
// until its server runs again.
func TestEngineHungStreamMoved(t *testing.T) {
	simA := startSim(t, "sim-hang", "--greedy", "--token-delay", "30ms")
	simB := startSim(t, "sim-ok", "--greedy", "--token-delay", "5ms")
	fe := simsAB(t, simA, simB)
	// A long answer pinned to b keeps it loaded, so that the stream goes to a.
	long := loadB(t, fe, 3000)

	tokens := make(chan struct{}, 1000)
	res := make(chan sseResult, 1)
	go func() {
		res <- postStream(t, fe.url, "/v1/chat/completions", chatRequest("a stream on a hung server", 200, nil),
			map[string]string{"X-Request-Id": "hung-1"}, func(sseEvent) {
				select {
				case tokens <- struct{}{}:
				default:
				}
			})
	}()
	for range 5 {
		select {
		case <-tokens:
		case <-time.After(20 * time.Second):
			t.Fatal("no tokens from the stream")
		}
	}
	if st := fe.state(t, "hung-1"); st.Worker != "a" {
		t.Fatalf("the stream runs on %q, want a", st.Worker)
	}
	simA.signal(syscall.SIGSTOP)
	defer simA.signal(syscall.SIGCONT)
	took := within(t, 10*time.Second, "the stream moved off a", func() bool { return len(fe.state(t, "hung-1").Migrations) > 0 })
	t.Logf("engine stopped: stream moved after %v", took)
	if took > 5*time.Second {
		t.Errorf("the stream moved %v after its engine stopped, want within 5 s", took)
	}
	r := <-res
	if r.status != 200 || !r.done {
		t.Fatalf("hung-1: status %d done %v %s; want the answer continued on b", r.status, r.done, r.errorBody)
	}
	st := fe.state(t, "hung-1")
	if m := st.Migrations[0]; m.FromWorker != "a" || m.Reason != "engine_hung" || st.Worker != "b" {
		t.Errorf("migration %+v, now on %s; want from a for engine_hung, to b", m, st.Worker)
	}
	if w, _ := fe.listedWorker(t, "a"); w.State != "not_ready" || w.Reason != "engine_hung" {
		t.Errorf("a is %s (%s), want not_ready engine_hung", w.State, w.Reason)
	}
	simA.signal(syscall.SIGCONT)
	waitFor(t, 10*time.Second, "a ready again", func() bool { w, _ := fe.listedWorker(t, "a"); return w.State == "ready" })
	post(t, fe.url+"/v1/requests/long-on-b/cancel", map[string]any{"mode": "stop"}, nil).Body.Close()
	<-long
}

// TestProbeBusyThenReady: a server that answers the start-up probe 429
// (Retry-After 2) or 503 (none: 5 s) leaves its worker ready but busy, out
// of routing, then ready with every capability once the probe runs again;
// one that answers 400 about the request (a content policy) is ready at
// once and serves.
func TestProbeBusyThenReady(t *testing.T) {
	for _, tc := range []struct {
		fault string
		busy  bool
	}{{"429:2", true}, {"503", true}, {"policy", false}} {
		t.Run(tc.fault, func(t *testing.T) {
			t.Parallel()
			args := []string{"--greedy", "--fault", tc.fault, "--fault-match", `"Hello"`}
			if tc.busy {
				args = append(args, "--fault-requests", "2") // the probe's chat and completions
			}
			sim := startSim(t, "sim-"+tc.fault, args...)
			s := newStack(t)
			fe := s.frontend(nil)
			start := time.Now()
			s.openaiWorker("w", sim)
			var sawBusy bool
			if tc.fault == "503" { // busy for 5 s: long enough to be asked
				waitFor(t, 20*time.Second, "w busy", func() bool {
					w, _ := fe.listedWorker(t, "w")
					return w.State == "ready" && w.Load.Busy
				})
				sawBusy = true
				resp := post(t, fe.url+"/v1/chat/completions", chatRequest("while busy", 2, nil), nil)
				resp.Body.Close()
				if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
					t.Errorf("a request while the only worker is busy: %d (Retry-After %q), want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
				}
			}
			waitFor(t, 20*time.Second, "w ready, not busy, every capability probed", func() bool {
				w, _ := fe.listedWorker(t, "w")
				sawBusy = sawBusy || (w.State == "ready" && w.Load.Busy)
				if w.State != "" && w.State != "ready" {
					t.Fatalf("w is %s (%s), want ready: the server answered", w.State, w.Reason)
				}
				return w.State == "ready" && !w.Load.Busy && w.Capabilities["token_ids"]
			})
			t.Logf("probe answered %s: busy seen %v, ready after %v", tc.fault, sawBusy, time.Since(start))
			if sawBusy != tc.busy {
				t.Errorf("busy seen %v, want %v", sawBusy, tc.busy)
			}
			body := chatRequest(fmt.Sprintf("served after a %s probe", tc.fault), 4, nil)
			if r := postStream(t, fe.url, "/v1/chat/completions", body, nil, nil); r.status != 200 || !r.done {
				t.Errorf("a request after the probe: %d %s, want served", r.status, r.errorBody)
			}
		})
	}
}

// Worker health: the status server and canary checks, proven against real
// processes.

// workerStatus is the body of a worker's /health.
type workerStatus struct {
	Status    string            `json:"status"`
	Endpoints map[string]string `json:"endpoints"`
	Engine    string            `json:"engine"`
	Lease     string            `json:"lease"`
	Draining  bool              `json:"draining"`
}

// getStatus reads a worker's /health: its HTTP status and body.
func getStatus(t *testing.T, url string) (int, workerStatus) {
	t.Helper()
	var st workerStatus
	return getDecoded(t, url+"/health", &st), st
}

// TestCanaryCatchesStalledEngine: w1 runs canaries (every second of
// idleness, 1 s timeout) and its engine stalls after 20 tokens of clients'
// requests (its canaries are not counted).
// Canaries pass while it works. A request routed to w1 stalls; the frontend
// (stall timeout 1 s) migrates it to w2, where it completes with the exact
// text. w1's status server then says notready (503) and the frontend's
// discovery shows w1 not_ready, so new requests avoid it, although w1 is
// the less loaded worker; w1 stays live (/live 200) and serves its metrics.
func TestCanaryCatchesStalledEngine(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	fe := s.frontend(nil, "--migration-limit", "3", "--stall-timeout", "1s")
	wargs := []string{"--mock-tokens-per-sec", "100", "--mock-ttft", "10ms"}
	sysPort := freePort(t)
	sys := "http://127.0.0.1:" + strconv.Itoa(sysPort)
	s.workerEnv = []string{"DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS=1", "DYN_HEALTH_CHECK_ENABLED=true",
		"DYN_CANARY_WAIT_TIME=1", "DYN_HEALTH_CHECK_REQUEST_TIMEOUT=1"}
	s.worker("w1", append(wargs, "--system-port", strconv.Itoa(sysPort), "--mock-stall-after-tokens", "20")...)
	s.workerEnv = []string{"DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS=1"}
	s.worker("w2", wargs...)
	fe.waitRoutable(t, "w1", "w2")
	w1 := &frontend{url: sys} // for metric()

	// While the engine works, canaries pass and w1 is ready.
	waitFor(t, 10*time.Second, "a passing canary on w1", func() bool {
		return w1.metric(t, "baton_worker_canary_total", "outcome", "success") >= 1
	})
	if code, st := getStatus(t, sys); code != 200 || st.Status != "ready" || st.Endpoints["generate"] != "ready" {
		t.Fatalf("w1 /health before the stall: %d %+v, want 200 ready", code, st)
	}

	// w2 carries a pinned request, so the router prefers w1.
	occupy(t, fe, "w2")
	prompt := "a stalled engine is caught"
	res, _ := streamWithin(t, 20*time.Second, fe, "canary-stall", completion(prompt, 60), nil)
	st := migratedOnce(t, fe, "canary-stall", res, prompt, 60)
	if m := st.Migrations[0]; m.FromWorker != "w1" || m.Offset != 20 || st.Worker != "w2" {
		// Canaries pass through the engine but its scripted faults count
		// clients' tokens only: the request got all 20.
		t.Errorf("migration %+v, now on %s; want from w1 at its 20th token, to w2", m, st.Worker)
	}

	// The stalled request's fence leaves the engine suspect; the canary
	// that follows times out: w1 is not ready, and stays so.
	waitFor(t, 10*time.Second, "w1 /health 503 notready", func() bool {
		code, st := getStatus(t, sys)
		return code == http.StatusServiceUnavailable && st.Status == "notready" && st.Endpoints["generate"] == "notready" &&
			(st.Engine == "stalled" || st.Engine == "canary_failed") && st.Lease == "live" && !st.Draining
	})
	waitFor(t, 10*time.Second, "w1 not_ready in the frontend's discovery", func() bool {
		w, ok := fe.workerNamed("w1")
		return ok && w.State == "not_ready" && (w.Reason == "stalled" || w.Reason == "canary_failed")
	})
	for i := range 3 {
		id := fmt.Sprintf("avoid-%d", i)
		p := "avoid the stalled worker " + id
		res, _ := streamWithin(t, 20*time.Second, fe, id, completion(p, 20), nil)
		checkComplete(t, res, p, 20)
		if st := fe.state(t, id); st.Worker != "w2" || len(st.Migrations) != 0 {
			t.Errorf("%s ran on %s with migrations %+v; want w2 directly (w1 is not ready)", id, st.Worker, st.Migrations)
		}
	}
	if code, st := getStatus(t, sys); code != http.StatusServiceUnavailable || st.Status != "notready" {
		t.Errorf("w1 /health after the new requests: %d %+v, want still notready", code, st)
	}
	if got := w1.metric(t, "baton_worker_canary_total", "outcome", "failure"); got < 1 {
		t.Errorf("failed canaries on w1 = %v, want >= 1", got)
	}
	if got := w1.metric(t, "baton_worker_ready"); got != 0 {
		t.Errorf("baton_worker_ready = %v, want 0", got)
	}

	resp, err := http.Get(sys + "/live")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("w1 /live = %d, want 200 (not ready is not dead)", resp.StatusCode)
	}
	resp, err = http.Get(sys + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"dynamo_component_requests_total", "dynamo_component_inflight_requests"} {
		if !strings.Contains(string(body), name) {
			t.Errorf("w1 /metrics has no %s", name)
		}
	}
}
