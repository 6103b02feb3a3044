package integration

import (
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/baton-dev/baton/streams"
)

// TestCheckFloodRefused: w1's credential sends checks as fast as 64
// goroutines can, each about a request routed to it with a long history
// (each costs a frontend a read of that log). Formerly this held a frontend
// at 0.62 of a core and a 1-token completion went from p50 55 ms to 272 ms;
// now the checks past w1's rate are refused unread, and the frontend's p50
// stays within twice its idle value.
func TestCheckFloodRefused(t *testing.T) {
	c := confinedStack(t, "w1", "w2")
	f := c.frontend(nil, c.auth...)
	c.worker("w1", "--mock-speedup-ratio", "100")
	c.worker("w2", "--mock-ttft", "1ms")
	f.waitRoutable(t, "w1", "w2")
	const long = "flood-history"
	res := postStream(t, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "a long answer", "max_tokens": 2000},
		map[string]string{"X-Worker-Id": "w1", "X-Request-Id": long}, nil)
	checkComplete(t, res, "a long answer", 2000)

	p50 := func() time.Duration {
		var ds []time.Duration
		for range 25 {
			start := time.Now()
			resp := post(t, f.url+"/v1/completions", map[string]any{"model": "mock", "prompt": "quick", "max_tokens": 1},
				map[string]string{"X-Worker-Id": "w2"})
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("a 1-token completion: status %d", resp.StatusCode)
			}
			ds = append(ds, time.Since(start))
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	idle := p50()

	nc, _ := c.connectAs("w1")
	check, _ := json.Marshal(streams.Check{RequestID: long, Attempt: 0})
	for range 3 {
		start := time.Now()
		m, err := nc.Request(streams.CheckSubject("w1"), check, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("one check: %v, %d bytes", time.Since(start), len(m.Data))
	}
	stop := make(chan struct{})
	var answered, refused, dropped atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				m, err := nc.Request(streams.CheckSubject("w1"), check, 2*time.Second)
				if err != nil {
					dropped.Add(1) // refused without a reply, past the answered refusals
					continue
				}
				var r streams.CheckReply
				if json.Unmarshal(m.Data, &r) == nil && r.RetryAfterMS > 0 {
					refused.Add(1)
				} else {
					answered.Add(1)
				}
			}
		})
	}
	waitFor(t, 20*time.Second, "w1's checks to be refused", func() bool { return refused.Load() > 0 })
	flooded := p50()
	close(stop)
	wg.Wait()
	t.Logf("1-token completion p50: idle %v, under w1's check flood %v; checks answered %d, refused %d, unanswered %d",
		idle, flooded, answered.Load(), refused.Load(), dropped.Load())
	if flooded > 2*idle+5*time.Millisecond {
		t.Errorf("p50 under the check flood %v, want at most twice the idle %v", flooded, idle)
	}
}
