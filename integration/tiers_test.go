package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"
)

// TestPriorityTiers (issue 35, item 4): a primary worker (--priority 1) and
// a fallback (the default tier 0). Every request goes to the primary while
// it is routable, even though the idle fallback ties it on load; once the
// primary is out (kill -9, or SIGTERM: it drains and exits), every request
// goes to the fallback; once it is back, the very next request is the
// primary's again. The response's X-Worker-Id and the request's stored
// worker agree.
func TestPriorityTiers(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			primaryArgs := []string{"--priority", "1"}
			s, fe, _ := faultStack(t, faultOpts{workers: 2, advisory: true,
				perWorker: map[string][]string{"w1": primaryArgs}})
			if got := priorities(t, fe); got["w1"] != 1 || got["w2"] != 0 {
				t.Fatalf("/v1/workers priorities %v, want w1 1 and w2 0", got)
			}

			n := 0
			servedBy := func(phase, want string, count int) {
				t.Helper()
				for range count {
					n++
					id := fmt.Sprintf("tier-%d", n)
					prompt := "tiers " + id
					res, _ := streamWithin(t, 20*time.Second, fe, id, completion(prompt, 8), nil)
					checkComplete(t, res, prompt, 8)
					if got, stored := res.header.Get("X-Worker-Id"), fe.fullState(t, id).Worker; got != want || stored != want {
						t.Fatalf("%s: request %s served by %q (stored %q), want %s", phase, id, got, stored, want)
					}
				}
			}
			servedBy("primary up", "w1", 6)

			primary := s.workers["w1"]
			primary.signal(sig)
			if sig == syscall.SIGTERM {
				if code := primary.wait(10 * time.Second); code != 0 {
					t.Fatalf("the primary exited %d after SIGTERM, want 0", code)
				}
			}
			waitFor(t, 10*time.Second, "the primary out of routing", func() bool {
				ws, err := fe.workers()
				if err != nil {
					return false
				}
				for _, w := range ws {
					if w.ID == "w1" && w.State == "ready" {
						return false
					}
				}
				return true
			})
			servedBy("primary out", "w2", 6)
			// The fallback was the highest routable tier: nothing to count.
			if got := fe.metric(t, "baton_frontend_fallback_dispatches_total", "model", "mock"); got != 0 {
				t.Errorf("fallback dispatches %v with the primary gone, want 0 (the fallback was the top routable tier)", got)
			}

			s.worker("w1", append([]string{"--mock-tokens-per-sec", "100", "--mock-ttft", "10ms"}, primaryArgs...)...)
			fe.waitRoutable(t, "w1", "w2")
			servedBy("primary back", "w1", 6)
		})
	}
}

// priorities reads each worker's priority from f's /v1/workers.
func priorities(t *testing.T, f *frontend) map[string]int {
	t.Helper()
	resp, err := http.Get(f.url + "/v1/workers")
	if err != nil {
		t.Fatalf("GET /v1/workers: %v", err)
	}
	defer resp.Body.Close()
	var out struct {
		Data []struct {
			ID       string `json:"id"`
			Priority *int   `json:"priority"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("decode /v1/workers: %v", err)
	}
	got := map[string]int{}
	for _, w := range out.Data {
		if w.Priority == nil {
			t.Fatalf("/v1/workers: worker %s has no priority", w.ID)
		}
		got[w.ID] = *w.Priority
	}
	return got
}
