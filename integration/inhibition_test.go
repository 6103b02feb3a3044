package integration

import (
	"testing"
	"time"
)

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
			a := fe.fullState(t, "a")
			if len(a.Attempts) != 2 || a.Attempts[0].WorkerID != "w1" || a.Attempts[1].WorkerID != "w2" {
				t.Fatalf("request A attempts = %+v, want w1 (stalled) then w2", a.Attempts)
			}
			// Once w1 has dropped A's fenced attempt, it is again the least
			// loaded worker: only inhibition can keep B away from it.
			waitFor(t, 10*time.Second, "w1 idle and routable", func() bool {
				ws, err := fe.workers()
				if err != nil {
					return false
				}
				for _, w := range ws {
					if w.ID == "w1" {
						return w.State == "ready" && w.Load.ActiveRequests == 0
					}
				}
				return false
			})

			promptB := "inhibition B " + tc.name
			res, _ = streamWithin(t, 20*time.Second, fe, "b", completion(promptB, 30), nil)
			checkComplete(t, res, promptB, 30)
			b := fe.fullState(t, "b")
			if len(b.Attempts) == 0 || b.Attempts[0].WorkerID != tc.wantB || len(b.Migrations) != tc.migrsB {
				t.Fatalf("request B attempts %+v migrations %+v: want the first on %s and %d migrations",
					b.Attempts, b.Migrations, tc.wantB, tc.migrsB)
			}
		})
	}
}
