package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/streams"
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

	// Clients: four streams at a time, until the flood is over; the log's
	// usage sampled through it.
	const tokens = 40
	load := streamClients(t, f, 4, tokens)
	stop := make(chan struct{})
	peak := logPeak(t, f, stop)
	const flooded = 3 * maxBytes / 2 / (1 << 20)
	stored, refused, took := flood(t, c.junkWriter("w1"), flooded, 1<<20-4096, 0, func(i int) string { // under MaxMsgSize with its headers
		return streams.RequestTokens(fmt.Sprintf("junk-%d", i), 0, "w1")
	})
	close(stop)
	load.end(t)

	t.Logf("w1 wrote %d MiB in %v (%d stored, %d refused); log peak %.2f",
		flooded, took.Round(time.Millisecond), stored, refused, peak())
	// Stored more than the log holds: the junk was purged as it came.
	if stored*(1<<20) < 5*maxBytes/4 {
		t.Errorf("w1's flood stored %d MiB of %d: want over 1.25 times the log's %d MiB (was the log full?)", stored, flooded, maxBytes>>20)
	}
	if p := peak(); p >= 0.8 {
		t.Errorf("the log reached %.2f of its size during the flood: want it under the eviction mark 0.8", p)
	}
	waitFor(t, 10*time.Second, "baton_log_workers_quarantined_total and baton_log_junk_purged_messages_total counted", func() bool {
		return f.metric(t, "baton_log_workers_quarantined_total") >= 1 && f.metric(t, "baton_log_junk_purged_messages_total") >= 1
	})
	// w1 is quarantined, whatever lease it registered since; w2 serves.
	f.waitQuarantined(t, "w1", 20*time.Second)
	out, errOut, code := runTool(t, batonBin, append([]string{"events", "--worker", "w1", "--nats", c.natsURL}, c.auth...)...)
	if code != 0 || !strings.Contains(out, "baton.worker.lost.v1") || !strings.Contains(out, "outside its attempts") {
		t.Errorf("baton events --worker w1 (exit %d): want the lost event with its reason\n%s%s", code, out, errOut)
	}
	r := postStream(t, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "after the flood", "max_tokens": tokens}, nil, nil)
	if !r.done || len(strings.Fields(r.text)) != tokens {
		t.Errorf("after the flood: status %d, %s", r.status, r.errorBody)
	}
}
