package integration

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/streams"
)

// The four ways past the junk guard of issue 33, on the confined
// deployment of a fleet that writes batched output (`baton nats
// --worker-users FILE --batched-output`): a worker credential may write
// only its own output stream, BATON_OUT_<id>, bounded by its own MaxBytes,
// and nothing on the request log. Each test floods with that credential
// while another tenant's clients stream through the frontend, and checks
// that the flood is bounded by the writer's own limit, that its write on
// the request log is a permissions violation, and that every client
// request is served with no 503 log_full and with the junk guard having
// found nothing: no quarantine, no junk purged, no sampling needed.

// outputMaxBytes is each worker's output stream limit in these tests.
const outputMaxBytes = 8 << 20

// outputOnlyStack is a confined stack on a server that takes the request
// log's tokens subjects from the worker users, with a frontend
// (outputOnlyFrontend) and batched mock workers ids at 200 tokens a
// second.
func outputOnlyStack(t *testing.T, users []string, ids ...string) (*confined, *frontend) {
	t.Helper()
	c := newConfined(t, []string{"--batched-output"}, users...)
	f := c.outputOnlyFrontend()
	for _, id := range ids {
		c.batchedWorker(id, 200)
	}
	f.waitRoutable(t, ids...)
	return c, f
}

// outputOnlyFrontend starts a frontend of a 64 MiB log that answers the
// workers' asks for streams of outputMaxBytes, migrates (3 at most) and
// counts 2 s of silence as a stall.
func (c *confined) outputOnlyFrontend() *frontend {
	return c.frontend(nil, append([]string{"--batched-output", "--worker-output-max-bytes", fmt.Sprint(outputMaxBytes),
		"--stream-max-bytes", fmt.Sprint(64 << 20), "--migration-limit", "3", "--stall-timeout", "2s"}, c.auth...)...)
}

// batchedWorker starts batched mock worker id at rate tokens a second.
func (c *confined) batchedWorker(id string, rate int) {
	c.worker(id, "--batched-output", "--mock-tokens-per-sec", fmt.Sprint(rate), "--mock-ttft", "5ms")
}

// outputWatch is what an output-only test watches while a junk writer
// floods: another tenant's clients (4 at a time, 40 tokens each) and the
// log's peak usage.
type outputWatch struct {
	load *clientLoad
	stop chan struct{}
	peak func() float64
}

func watchOutputOnly(t *testing.T, f *frontend) *outputWatch {
	w := &outputWatch{load: streamClients(t, f, 4, 40), stop: make(chan struct{})}
	w.peak = logPeak(t, f, w.stop)
	return w
}

// end stops the clients and fails t for each request not served, for any
// 503 log_full, for a log that grew past a tenth of its size, and for any
// quarantine or junk purge: the bound is the writer's stream, not the
// guard.
func (w *outputWatch) end(t *testing.T, f *frontend) {
	t.Helper()
	close(w.stop)
	w.load.end(t)
	if w.load.full > 0 {
		t.Errorf("%d client requests refused 503 log_full", w.load.full)
	}
	if peak := w.peak(); peak > 0.1 {
		t.Errorf("the request log reached %.2f of its size", peak)
	}
	if q, p := f.metric(t, "baton_log_workers_quarantined_total"), f.metric(t, "baton_log_junk_purged_messages_total"); q != 0 || p != 0 {
		t.Errorf("the junk guard acted (%.0f quarantined, %.0f purged): the writer's own limit should bound it", q, p)
	}
}

// honest fails t if the server logged a permissions violation of any of
// ids: batched workers serve without writing the request log.
func (c *confined) honest(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if c.violated(id, "") {
			t.Errorf("worker %s broke its permissions:\n%s", id, c.ns.output())
		}
	}
}

// refusedOnLog writes one message with id's credential on the request
// log's tokens subject of id for request, and waits for the server's
// permissions violation.
func (c *confined) refusedOnLog(t *testing.T, id, request string) {
	t.Helper()
	js := c.junkWriter(id)
	subject := streams.RequestTokens(request, 0, id)
	if _, err := js.PublishAsync(subject, make([]byte, 1<<10)); err != nil {
		t.Fatal(err)
	}
	c.expectViolation(id, subject)
}

// floodOwn floods id's own output stream with n messages of size bytes on
// subject(i), and checks that its stream stored at most its limit and
// refused the rest.
func (c *confined) floodOwn(t *testing.T, id string, n, size int, pace time.Duration, subject func(i int) string) {
	t.Helper()
	stored, refused, took := flood(t, c.junkWriter(id), n, size, pace, subject)
	t.Logf("%s wrote %d × %d KiB in %v: %d stored, %d refused", id, n, size>>10, took.Round(time.Millisecond), stored, refused)
	if refused == 0 {
		t.Errorf("%s's stream took all %d MiB: no bound", id, n*size>>20)
	}
	// Top it off: what is left under the limit is smaller than size.
	js := c.junkWriter(id)
	for i := 0; ; i++ {
		if _, err := js.Publish(t.Context(), subject(n+i), make([]byte, 64)); err != nil {
			t.Logf("%s's stream full after %d more of 64 bytes: %v", id, i, err)
			break
		}
		if i == 1<<17 {
			t.Fatalf("%s's stream took %d more messages of 64 bytes", id, i)
		}
	}
	st, err := c.operator(t).Stream(t.Context(), streams.WorkerOutputStream(id))
	if err != nil {
		t.Fatal(err)
	}
	if b := st.CachedInfo().State.Bytes; b > outputMaxBytes {
		t.Errorf("%s's stream holds %d bytes, over its limit of %d", id, b, outputMaxBytes)
	}
}

// TestOutputOnlyWriterWithoutLease: w3's credential, whose worker never
// started, writes on the request log (a violation), asks a frontend for
// its output stream (any credential may, for its own id) and floods it
// with 16 KiB junk on many subjects, 1.5 times its limit. Formerly the
// same credential gave every tenant 503 log_full (112 over 23 s). Now
// its stream refuses what is over its own limit, and the other workers
// serve every client request.
func TestOutputOnlyWriterWithoutLease(t *testing.T) {
	t.Parallel()
	c, f := outputOnlyStack(t, []string{"w1", "w2", "w3"}, "w1", "w2")
	w := watchOutputOnly(t, f)
	c.refusedOnLog(t, "w3", "random-0")
	nc, _ := c.connectAs("w3")
	if _, err := nc.Request(streams.OutputsSubject("w3"), nil, 5*time.Second); err != nil {
		t.Fatalf("w3's ask for its output stream: %v", err)
	}
	const size = 16 << 10
	c.floodOwn(t, "w3", 3*outputMaxBytes/2/size, size, 0, func(i int) string {
		return streams.WorkerOutput("w3", fmt.Sprintf("random-%d", i))
	})
	w.end(t, f)
	c.honest(t, "w1", "w2")
}

// TestOutputOnlySmallJunkOnManySubjects: w1 serves clients, and its
// credential writes 4 KiB junk messages, each on a subject of its own in
// its stream (an owner that does not exist), 1.5 times its limit.
// Formerly, on the request log, the sweep drained about 600 subjects a
// second and clients got 135 × 503 log_full. Now the flood fills w1's own
// stream; w1 then refuses batched dispatches (output_full), its attempts
// caught by the full stream end by the stall timeout and migrate, and
// every client request is served.
func TestOutputOnlySmallJunkOnManySubjects(t *testing.T) {
	t.Parallel()
	c, f := outputOnlyStack(t, []string{"w1", "w2"}, "w1", "w2")
	w := watchOutputOnly(t, f)
	c.refusedOnLog(t, "w1", "many-0")
	const size = 4 << 10
	c.floodOwn(t, "w1", 3*outputMaxBytes/2/size, size, 0, func(i int) string {
		return streams.WorkerOutput("w1", fmt.Sprintf("many-%d", i))
	})
	waitFor(t, 10*time.Second, "w1 to refuse a dispatch output_full", func() bool {
		return strings.Contains(c.workers["w1"].output(), "output stream is full")
	})
	w.end(t, f)
	c.honest(t, "w2")
}

// TestOutputOnlyLargeJunkOnOwnAttempt: w1 serves a long request (200
// tokens at 10 a second), and its credential writes 1 MiB junk messages
// on that request's owner's subject in its stream, the one the owner
// follows, 1.5 times its limit, while other clients stream. Formerly, on
// the request log, that was trusted until the request ended: 183 × 503
// over 39 s. Now the junk fills only w1's stream and is not the victim's
// output (no entry of its attempt): the victim's attempt, refused by the
// full stream, stalls and migrates to w2, and its answer is the
// fault-free one.
func TestOutputOnlyLargeJunkOnOwnAttempt(t *testing.T) {
	t.Parallel()
	c, f := outputOnlyStack(t, []string{"w1", "w2"})
	c.batchedWorker("w1", 10)
	f.waitRoutable(t, "w1")
	victim := streamPast(t, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "the victim", "max_tokens": 200},
		map[string]string{"X-Request-Id": "victim"}, 5)
	c.batchedWorker("w2", 200)
	f.waitRoutable(t, "w1", "w2")
	w := watchOutputOnly(t, f)
	c.refusedOnLog(t, "w1", "victim")
	const size = 1<<20 - 4096 // under the stream's MaxMsgSize with its headers
	c.floodOwn(t, "w1", 3*outputMaxBytes/2/size, size, 20*time.Millisecond, func(int) string {
		return streams.WorkerOutput("w1", f.Name)
	})
	checkComplete(t, <-victim, "the victim", 200)
	if got := f.servingWorker(t, "victim"); got != "w2" {
		t.Errorf("the victim ended on %s, want w2 (migrated off the full stream)", got)
	}
	w.end(t, f)
	c.honest(t, "w2")
}

// TestOutputOnlyFullStreamAfterReRegistration: w1's credential fills
// w1's stream, and w1 restarts and registers again, honestly. Formerly
// the buried quarantine let a frontend started afterwards send w1 5 of
// 10 requests. Now there is no quarantine to bury: a frontend started
// afterwards may route to w1, which read its stream's room when it asked
// for it and refuses every batched dispatch (output_full) until the
// stream has room: all 10 requests are served by w2, none migrated.
func TestOutputOnlyFullStreamAfterReRegistration(t *testing.T) {
	t.Parallel()
	c, f1 := outputOnlyStack(t, []string{"w1", "w2"}, "w1", "w2")
	const size = 64 << 10
	c.floodOwn(t, "w1", 3*outputMaxBytes/2/size, size, 0, func(i int) string {
		return streams.WorkerOutput("w1", f1.Name)
	})
	c.workers["w1"].signal(syscall.SIGTERM)
	c.workers["w1"].wait(20 * time.Second)
	c.batchedWorker("w1", 200)
	f2 := c.outputOnlyFrontend()
	f2.waitRoutable(t, "w1", "w2")
	for i := range 10 {
		prompt := fmt.Sprintf("after %d", i)
		r := postStream(t, f2.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 8}, nil, nil)
		checkComplete(t, r, prompt, 8)
		if w := f2.servingWorker(t, r.requestID); w != "w2" {
			t.Errorf("request %d served by %s, want w2", i, w)
		}
	}
	if q := f2.metric(t, "baton_log_workers_quarantined_total"); q != 0 {
		t.Errorf("%.0f quarantined: the bound is w1's stream, not the guard", q)
	}
	// w1 read its stream's room at its ask, before it registered: it
	// refused every dispatch, and no attempt stalled there.
	if m := f2.metric(t, "dynamo_frontend_model_migration_total"); m != 0 {
		t.Errorf("%.0f migrations: an attempt ran on w1's full stream", m)
	}
	c.honest(t, "w1", "w2")
}
