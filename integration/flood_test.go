package integration

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// TestWorkerJunkFloodQuarantined: w1's credential (a confined worker user)
// writes 1 MiB messages as fast as it can on its own tokens subjects of
// requests that do not exist, the one write its permissions allow outside
// its attempts, while clients stream through the frontend. Formerly such a
// flood filled the request log in seconds, after which every request got
// 500 log_unavailable for 24 h. Now the frontend finds the junk at its next
// reading of the log, quarantines w1 (a lost event with its reason, its
// lease revoked, its requests moved to w2) and purges what w1 writes at
// every reading: the flood stores more than the log's size, every request
// succeeds, none is refused, and the log never nears its high-water mark.
// The log (512 MiB) takes a writer at 850 MB/s about 0.6 s to fill: a
// flood that fills it within one reading (250 ms) is stopped only after
// (docs/security.md, "How fast a flood can be").
func TestWorkerJunkFloodQuarantined(t *testing.T) {
	const maxBytes = 512 << 20
	c := confinedStack(t, "w1", "w2")
	// Migration on, so that w1's requests in flight when it is quarantined
	// move to w2 (the default, --migration-limit 0, fails them).
	f := c.frontend(nil, append([]string{"--stream-max-bytes", fmt.Sprint(maxBytes), "--migration-limit", "3"}, c.auth...)...)
	c.worker("w1", "--mock-tokens-per-sec", "200", "--mock-ttft", "5ms")
	c.worker("w2", "--mock-tokens-per-sec", "200", "--mock-ttft", "5ms")
	f.waitRoutable(t, "w1", "w2")

	// Clients: four streams at a time, until the flood is over.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var served int
	var failures []string
	const tokens = 40
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				r := postStream(t, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": fmt.Sprintf("client %d request %d", i, n), "max_tokens": tokens}, nil, nil)
				mu.Lock()
				served++
				if r.status != 200 || !r.done || len(strings.Fields(r.text)) != tokens {
					failures = append(failures, fmt.Sprintf("client %d request %d: status %d, done %v, %d tokens, error %s", i, n, r.status, r.done, len(strings.Fields(r.text)), r.errorBody))
				}
				mu.Unlock()
			}
		}()
	}
	// The log's usage, sampled through the flood.
	var peak atomic.Value
	peak.Store(0.0)
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if v := f.metric(t, "baton_log_used_ratio", "stream", "BATON_REQUESTS"); v > peak.Load().(float64) {
				peak.Store(v)
			}
		}
	}()

	nc, _ := c.connectAs("w1")
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(32))
	if err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, 1<<20-4096) // under MaxMsgSize with its headers
	const flood = 3 * maxBytes / 2 / (1 << 20)
	var stored, refused int
	var pending []jetstream.PubAckFuture
	start := time.Now()
	for i := range flood {
		fut, err := js.PublishAsync(streams.RequestTokens(fmt.Sprintf("junk-%d", i), 0, "w1"), junk)
		if err != nil {
			t.Fatalf("w1's junk write %d: %v", i, err)
		}
		pending = append(pending, fut)
		if len(pending) == 32 || i == flood-1 {
			for _, fut := range pending {
				select {
				case <-fut.Ok():
					stored++
				case <-fut.Err():
					refused++
				case <-time.After(30 * time.Second):
					t.Fatal("a junk write unacknowledged after 30 s")
				}
			}
			pending = pending[:0]
		}
	}
	took := time.Since(start)
	close(stop)
	wg.Wait()

	t.Logf("w1 wrote %d MiB in %v (%d stored, %d refused); %d client requests; log peak %.2f",
		flood, took.Round(time.Millisecond), stored, refused, served, peak.Load().(float64))
	for _, fail := range failures {
		t.Error(fail)
	}
	if served == 0 {
		t.Error("no client request ran during the flood")
	}
	// Stored more than the log holds: the junk was purged as it came.
	if stored*(1<<20) < 5*maxBytes/4 {
		t.Errorf("w1's flood stored %d MiB of %d: want over 1.25 times the log's %d MiB (was the log full?)", stored, flood, maxBytes>>20)
	}
	if p := peak.Load().(float64); p >= 0.8 {
		t.Errorf("the log reached %.2f of its size during the flood: want it under the eviction mark 0.8", p)
	}
	waitFor(t, 10*time.Second, "baton_log_workers_quarantined_total and baton_log_junk_purged_messages_total counted", func() bool {
		return f.metric(t, "baton_log_workers_quarantined_total") >= 1 && f.metric(t, "baton_log_junk_purged_messages_total") >= 1
	})
	// w1 is quarantined, whatever lease it registered since; w2 serves.
	waitFor(t, 20*time.Second, "w1 listed as quarantined", func() bool {
		ws, err := f.workers()
		if err != nil {
			return false
		}
		for _, w := range ws {
			if w.ID == "w1" {
				return w.State == "quarantined" && strings.Contains(w.Reason, "outside its attempts")
			}
		}
		return false
	})
	out, errOut, code := runTool(t, batonBin, append([]string{"events", "--worker", "w1", "--nats", c.natsURL}, c.auth...)...)
	if code != 0 || !strings.Contains(out, "baton.worker.lost.v1") || !strings.Contains(out, "outside its attempts") {
		t.Errorf("baton events --worker w1 (exit %d): want the lost event with its reason\n%s%s", code, out, errOut)
	}
	r := postStream(t, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "after the flood", "max_tokens": tokens}, nil, nil)
	if !r.done || len(strings.Fields(r.text)) != tokens {
		t.Errorf("after the flood: status %d, %s", r.status, r.errorBody)
	}
}
