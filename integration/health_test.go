package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
)

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
	resp, err := http.Get(url + "/health")
	if err != nil {
		t.Fatalf("GET %s/health: %v", url, err)
	}
	defer resp.Body.Close()
	var st workerStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("GET %s/health: %v", url, err)
	}
	return resp.StatusCode, st
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
	checkComplete(t, res, prompt, 60)
	st := fe.fullState(t, "canary-stall")
	checkMigrated(t, st, 1, events.MigrationOngoingRequest)
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
		ws, err := fe.workers()
		if err != nil {
			return false
		}
		for _, w := range ws {
			if w.ID == "w1" {
				return w.State == "not_ready" && (w.Reason == "stalled" || w.Reason == "canary_failed")
			}
		}
		return false
	})
	for i := range 3 {
		id := fmt.Sprintf("avoid-%d", i)
		p := "avoid the stalled worker " + id
		res, _ := streamWithin(t, 20*time.Second, fe, id, completion(p, 20), nil)
		checkComplete(t, res, p, 20)
		if st := fe.fullState(t, id); st.Worker != "w2" || len(st.Migrations) != 0 {
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
