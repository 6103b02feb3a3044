package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// TestForgedWorkerEventsIgnored: w1's credential reads w2's lease id (a
// direct get on the leases bucket is granted to every worker) and writes a
// draining, a lost and a deregistered naming w2 and that lease on its own
// events subject, the one its permissions allow. Formerly every frontend,
// and every frontend started later, took w2 out of routing and sent every
// new request to w1. Now each frontend logs the events as ignored, w2 stays
// ready, serves the requests once w1 is gone, and baton events says why.
func TestForgedWorkerEventsIgnored(t *testing.T) {
	t.Parallel()
	c := confinedStack(t, "w1", "w2")
	f1 := c.frontend(nil, c.auth...)
	c.worker("w1", "--mock-ttft", "5ms")
	c.worker("w2", "--mock-ttft", "5ms")
	f1.waitRoutable(t, "w1", "w2")

	nc, _ := c.connectAs("w1")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	leases, err := js.KeyValue(ctx, streams.LeasesBucket)
	if err != nil {
		t.Fatal(err)
	}
	entry, err := leases.Get(ctx, "w2")
	if err != nil {
		t.Fatalf("w1 reads w2's lease: %v", err)
	}
	var l events.Lease
	if err := json.Unmarshal(entry.Value(), &l); err != nil {
		t.Fatal(err)
	}
	log := streams.NewLog(js, "baton/worker/w1")
	for i, ev := range []events.Event{
		events.WorkerDraining{WorkerID: "w2", LeaseID: l.LeaseID, Reason: "forged"},
		events.WorkerLost{WorkerID: "w2", LeaseID: l.LeaseID, Reason: "forged"},
		events.WorkerDeregistered{WorkerID: "w2", LeaseID: l.LeaseID},
	} {
		env := log.Envelope(events.ID("forged", string(rune('a'+i))), "w2", ev)
		if _, err := log.Append(ctx, streams.WorkerEvents("w1"), env, -1); err != nil {
			t.Fatalf("w1's write of %s on its own subject: %v", ev.EventType(), err)
		}
	}
	f2 := c.frontend(nil, c.auth...) // started after: folds the stored events
	// f1 follows the stream live; f2 reads the last event of each subject.
	// Each logs the first ignored event; the repeats within the interval of
	// its rate-limited warnings are counted, not written (package ratelog).
	for f, n := range map[*frontend]int{f1: 1, f2: 1} {
		waitFor(t, 10*time.Second, f.name+" to ignore the forged events", func() bool {
			return strings.Count(f.output(), "worker event ignored") >= n
		})
		f.waitRoutable(t, "w1", "w2")
	}

	// With w1 gone, new requests go to w2; formerly 503 (no worker).
	c.workers["w1"].signal(syscall.SIGTERM)
	c.workers["w1"].wait(20 * time.Second)
	for _, f := range []*frontend{f1, f2} {
		f.waitRoutable(t, "w2")
		resp := post(t, f.url+"/v1/completions", map[string]any{"model": "mock", "prompt": "after the forgery", "max_tokens": 3}, nil)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Request-Id") == "" {
			t.Errorf("%s: a request with w2 alone: status %d, want 200", f.name, resp.StatusCode)
		}
	}
	out, errOut, code := runTool(t, batonBin, append([]string{"events", "--worker", "w1", "--nats", c.natsURL}, c.auth...)...)
	if code != 0 || strings.Count(out, "ignored (not the named worker's subject)") != 3 {
		t.Errorf("baton events (exit %d) does not show the three forged events ignored:\n%s\n%s", code, out, errOut)
	}
}

// TestWorkerCannotFloodWorkersStream: formerly w1's credential stored 50
// messages of 1 MiB on its own events subject in 0.33 s, up to about 10 GiB
// of BATON_WORKERS. Now a message above streams.WorkersMaxMsgSize is
// refused, a flood of small ones only rotates w1's own subject (at most
// streams.WorkersMaxMsgsPerSubject kept), and w2's events, routing and
// requests are untouched.
func TestWorkerCannotFloodWorkersStream(t *testing.T) {
	c := confinedStack(t, "w1", "w2")
	f := c.frontend(nil, c.auth...)
	c.worker("w1", "--mock-ttft", "5ms")
	c.worker("w2", "--mock-ttft", "5ms")
	f.waitRoutable(t, "w1", "w2")
	nc, _ := c.connectAs("w1")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	huge := make([]byte, 1<<20)
	for range 5 {
		if _, err := js.Publish(ctx, streams.WorkerEvents("w1"), huge); err == nil {
			t.Fatal("w1 stored 1 MiB on BATON_WORKERS")
		}
	}
	small := make([]byte, streams.WorkersMaxMsgSize-512)
	const n = 2 * streams.WorkersMaxMsgsPerSubject
	start := time.Now()
	for i := range n {
		if _, err := js.PublishAsync(streams.WorkerEvents("w1"), small); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("the flood's acknowledgements did not arrive")
	}
	t.Logf("w1 published %d × %d bytes in %v", n, len(small), time.Since(start))
	op := c.operator(t)
	st, err := op.Stream(ctx, streams.WorkersStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter("baton.workers.>"))
	if err != nil {
		t.Fatal(err)
	}
	if got := info.State.Subjects[streams.WorkerEvents("w1")]; got > streams.WorkersMaxMsgsPerSubject {
		t.Errorf("w1's subject holds %d messages, want at most %d", got, streams.WorkersMaxMsgsPerSubject)
	}
	if got := info.State.Subjects[streams.WorkerEvents("w2")]; got == 0 {
		t.Error("w2's events were evicted by w1's flood")
	}
	if max := uint64(streams.WorkersMaxMsgsPerSubject*streams.WorkersMaxMsgSize + 64<<10); info.State.Bytes > max {
		t.Errorf("BATON_WORKERS holds %d bytes after one worker's flood, want at most %d", info.State.Bytes, max)
	}
	t.Logf("BATON_WORKERS after the flood: %d messages, %d bytes", info.State.Msgs, info.State.Bytes)
	f.waitRoutable(t, "w1", "w2")
	for _, w := range []string{"w1", "w2"} {
		res := postStream(t, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "after the flood " + w, "max_tokens": 4},
			map[string]string{"X-Worker-Id": w}, nil)
		checkComplete(t, res, "after the flood "+w, 4)
	}
}
