package integration

import (
	"fmt"
	"syscall"
	"testing"
	"time"
)

// Routing: which worker the next request goes to, by priority tier, and
// around a worker that just failed on the request path (inhibition).

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
					if got, stored := res.header.Get("X-Worker-Id"), fe.state(t, id).Worker; got != want || stored != want {
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
	got := map[string]int{}
	for _, w := range f.listWorkers(t) {
		if w.Priority == nil {
			t.Fatalf("/v1/workers: worker %s has no priority", w.ID)
		}
		got[w.ID] = *w.Priority
	}
	return got
}

// TestInhibitionWindow observes local inhibition from outside: which worker
// gets the next request after a worker failed on the request path.
//
// w1 stalls after 5 tokens (it stays leased and in discovery); w2 carries a
// long pinned request, so the least-loaded router prefers the idle w1
// whenever w1 is routable. Request A goes to w1, stalls, and migrates to w2
// (1 s stall timeout). Request B follows at once:
//   - with the default window (5 s), w1 is inhibited, so B's first attempt
//     runs on w2 even though w2 is the more loaded worker;
//   - with DYN_RUNTIME_INHIBITED_DURATION_SECS=0, w1 is the least loaded
//     routable worker again, so B's first attempt runs on w1 (and, as w1
//     still stalls, B migrates and completes anyway).
func TestInhibitionWindow(t *testing.T) {
	for _, tc := range []struct {
		name   string
		env    []string
		wantB  string // worker of request B's first attempt
		migrsB int
	}{
		{"default", nil, "w2", 0},
		{"disabled", []string{"DYN_RUNTIME_INHIBITED_DURATION_SECS=0"}, "w1", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, fe, _ := faultStack(t, faultOpts{workers: 2, frontendEnv: tc.env,
				perWorker:    map[string][]string{"w1": {"--mock-stall-after-tokens", "5"}},
				frontendArgs: []string{"--migration-limit", "3", "--stall-timeout", "1s"}})
			occupy(t, fe, "w2")

			promptA := "inhibition A " + tc.name
			res, _ := streamWithin(t, 20*time.Second, fe, "a", completion(promptA, 30), nil)
			checkComplete(t, res, promptA, 30)
			a := fe.state(t, "a")
			if len(a.Attempts) != 2 || a.Attempts[0].WorkerID != "w1" || a.Attempts[1].WorkerID != "w2" {
				t.Fatalf("request A attempts = %+v, want w1 (stalled) then w2", a.Attempts)
			}
			// Once w1 has dropped A's fenced attempt, it is again the least
			// loaded worker: only inhibition can keep B away from it.
			waitFor(t, 10*time.Second, "w1 idle and routable", func() bool {
				w, ok := fe.workerNamed("w1")
				return ok && w.State == "ready" && w.Load.ActiveRequests == 0
			})

			promptB := "inhibition B " + tc.name
			res, _ = streamWithin(t, 20*time.Second, fe, "b", completion(promptB, 30), nil)
			checkComplete(t, res, promptB, 30)
			b := fe.state(t, "b")
			if len(b.Attempts) == 0 || b.Attempts[0].WorkerID != tc.wantB || len(b.Migrations) != tc.migrsB {
				t.Fatalf("request B attempts %+v migrations %+v: want the first on %s and %d migrations",
					b.Attempts, b.Migrations, tc.wantB, tc.migrsB)
			}
		})
	}
}
