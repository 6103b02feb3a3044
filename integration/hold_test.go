package integration

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// TestSameIDRaceKeepsTheRunningAttempt: a client's id sent to two
// frontends at once. Each frontend dispatches the request while it appends
// its accepted event (the held dispatch, docs/internals.md); one append
// wins, and the other frontend fences its own dispatch by its hold id and
// serves the winner's request. With one worker both dispatches reach the
// same worker for the same attempt: the fence must not end the attempt the
// winner's dispatch started. Every pair of clients gets the same whole
// answer, each request ran in one attempt with no migration, and the worker
// stays in service with nothing of its output taken for junk.
func TestSameIDRaceKeepsTheRunningAttempt(t *testing.T) {
	s := newStack(t)
	f1, f2 := s.frontend(nil), s.frontend(nil)
	s.worker("w1", "--mock-tokens-per-sec", "400")
	f1.waitRoutable(t, "w1")
	f2.waitRoutable(t, "w1")
	const ids = 30
	for i := range ids {
		id := fmt.Sprintf("race-%d", i)
		body := map[string]any{"model": "mock", "prompt": "same id " + id, "max_tokens": 24}
		var wg sync.WaitGroup
		var res [2]sseResult
		start := make(chan struct{})
		for k, f := range []*frontend{f1, f2} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b := map[string]any{}
				for key, v := range body {
					b[key] = v
				}
				<-start
				res[k] = postStream(t, f.url, "/v1/completions", b, map[string]string{"X-Request-Id": id}, nil)
			}()
		}
		close(start)
		wg.Wait()
		for k, r := range res {
			if r.status != 200 || !r.done || r.errorBody != "" {
				t.Fatalf("%s through frontend %d: status %d done %v error %s", id, k+1, r.status, r.done, r.errorBody)
			}
		}
		if res[0].text != res[1].text || res[0].text == "" {
			t.Fatalf("%s: the two clients got %q and %q", id, res[0].text, res[1].text)
		}
		var st engineState
		getJSON(t, f1.url+"/v1/requests/"+id, 200, &st)
		if st.Status != "completed" || len(st.Attempts) != 1 || len(st.Migrations) != 0 {
			t.Fatalf("%s: %+v, want completed in one attempt with no migration", id, st)
		}
	}
	abandoned := strings.Count(f1.output(), "abandoned a held dispatch") + strings.Count(f2.output(), "abandoned a held dispatch")
	if abandoned == 0 {
		t.Errorf("no frontend lost a race in %d pairs: the test did not exercise the fence", ids)
	}
	t.Logf("%d of %d races lost by a frontend that had dispatched", abandoned, ids)
	for _, f := range []*frontend{f1, f2} {
		if n := f.metric(t, "baton_log_workers_quarantined_total"); n != 0 {
			t.Errorf("%s quarantined %v workers", f.url, n)
		}
	}
	if n := f1.metric(t, "dynamo_frontend_model_migration_total") + f2.metric(t, "dynamo_frontend_model_migration_total"); n != 0 {
		t.Errorf("%v migrations, want none", n)
	}
}
