package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// The four ways past the junk guard of issue 33, each on the confined
// deployment (confinedStack: per-worker credentials), with another
// tenant's clients streaming through it: all of theirs served, none
// refused 503 log_full, and the junk writer quarantined.

// clientLoad is clients streaming through a frontend until stop: n at a
// time, each request of tokens tokens, every result counted.
type clientLoad struct {
	mu       sync.Mutex
	served   int
	full     int // 503 log_full
	failures []string
	stop     chan struct{}
	wg       sync.WaitGroup
}

// streamClients starts n clients of f, each sending requests of tokens
// tokens one after another until the load's end.
func streamClients(t *testing.T, f *frontend, n, tokens int) *clientLoad {
	l := &clientLoad{stop: make(chan struct{})}
	for i := range n {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for k := 0; ; k++ {
				select {
				case <-l.stop:
					return
				default:
				}
				r := postStream(t, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": fmt.Sprintf("client %d request %d", i, k), "max_tokens": tokens}, nil, nil)
				l.mu.Lock()
				l.served++
				if r.status == 503 && strings.Contains(r.errorBody, "log_full") {
					l.full++
				}
				if r.status != 200 || !r.done || len(strings.Fields(r.text)) != tokens {
					l.failures = append(l.failures, fmt.Sprintf("client %d request %d: status %d, done %v, %d tokens, error %s", i, k, r.status, r.done, len(strings.Fields(r.text)), r.errorBody))
				}
				l.mu.Unlock()
			}
		}()
	}
	return l
}

// end stops the clients, waits for them and fails t for each failed
// request, or if none ran.
func (l *clientLoad) end(t *testing.T) {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, fail := range l.failures {
		t.Error(fail)
	}
	if l.served == 0 {
		t.Error("no client request ran")
	}
	t.Logf("clients: %d requests, %d refused 503 log_full, %d failed", l.served, l.full, len(l.failures))
}

// waitQuarantined waits until f lists worker id quarantined for junk.
func (f *frontend) waitQuarantined(t *testing.T, id string, within time.Duration) {
	t.Helper()
	waitFor(t, within, id+" listed as quarantined on "+f.Name, func() bool {
		ws, err := f.workers()
		if err != nil {
			return false
		}
		for _, w := range ws {
			if w.ID == id {
				return w.State == "quarantined" && strings.Contains(w.Reason, "outside its attempts")
			}
		}
		return false
	})
}

// junkWriter is worker id's credential on JetStream, as a junk writer
// uses it.
func (c *confined) junkWriter(id string) jetstream.JetStream {
	c.t.Helper()
	nc, _ := c.connectAs(id)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(64))
	if err != nil {
		c.t.Fatal(err)
	}
	return js
}

// flood publishes n messages of size bytes with js, on subject(i), 32
// awaited at a time, one every pace (0: as fast as it can), and counts
// those stored and refused (the log full).
func flood(t *testing.T, js jetstream.JetStream, n, size int, pace time.Duration, subject func(i int) string) (stored, refused int, took time.Duration) {
	t.Helper()
	junk := make([]byte, size)
	var pending []jetstream.PubAckFuture
	var tick <-chan time.Time
	if pace > 0 {
		tk := time.NewTicker(pace)
		defer tk.Stop()
		tick = tk.C
	}
	start := time.Now()
	for i := range n {
		if tick != nil {
			<-tick
		}
		fut, err := js.PublishAsync(subject(i), junk)
		if err != nil {
			t.Fatalf("junk write %d: %v", i, err)
		}
		pending = append(pending, fut)
		if len(pending) == 32 || i == n-1 {
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
	return stored, refused, time.Since(start)
}

// logPeak samples f's baton_log_used_ratio of BATON_REQUESTS every 50 ms
// until stop, and returns its highest reading.
func logPeak(t *testing.T, f *frontend, stop <-chan struct{}) func() float64 {
	var mu sync.Mutex
	var peak float64
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			v := f.metric(t, "baton_log_used_ratio", "stream", "BATON_REQUESTS")
			mu.Lock()
			peak = max(peak, v)
			mu.Unlock()
		}
	}()
	return func() float64 {
		<-done
		mu.Lock()
		defer mu.Unlock()
		return peak
	}
}

// quarantinedAt watches the quarantine record of worker id (on
// baton.workers.<id>.quarantine) from now on, until stop, and returns how
// long after now it was first seen (0: never).
func (c *confined) quarantinedAt(t *testing.T, id string, stop <-chan struct{}) func() time.Duration {
	js := c.operator(t)
	start := time.Now()
	var took time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := streams.LastOnSubject(context.Background(), js, streams.WorkersStream, streams.WorkerQuarantine(id))
			if err == nil && m != nil {
				took = time.Since(start)
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return func() time.Duration { <-done; return took }
}

// guardWatch is what a guard test watches while a junk writer floods:
// the other tenant's clients (4 at a time, 40 tokens each), the log's
// peak usage and when the writer's quarantine was recorded.
type guardWatch struct {
	load        *clientLoad
	stop        chan struct{}
	peak        func() float64
	quarantined func() time.Duration
}

// watchGuard starts the clients of f and the watches, for junk writer id.
func (c *confined) watchGuard(t *testing.T, f *frontend, id string) *guardWatch {
	w := &guardWatch{load: streamClients(t, f, 4, 40), stop: make(chan struct{})}
	w.peak = logPeak(t, f, w.stop)
	w.quarantined = c.quarantinedAt(t, id, w.stop)
	return w
}

// end stops the clients and the watches, fails t for each client request
// not served (and for any refused 503 log_full, or the writer never
// quarantined), and returns the log's peak and the time to quarantine.
func (w *guardWatch) end(t *testing.T) (peak float64, quarantined time.Duration) {
	t.Helper()
	close(w.stop)
	w.load.end(t)
	if w.load.full > 0 {
		t.Errorf("%d client requests refused 503 log_full", w.load.full)
	}
	peak, quarantined = w.peak(), w.quarantined()
	if quarantined == 0 {
		t.Error("the junk writer not quarantined")
	}
	return peak, quarantined
}

// guardFrontend starts a frontend of a maxBytes log, with migration on
// (a quarantined worker's requests move), and mock workers ids at rate
// tokens a second, and waits until it routes to them.
func (c *confined) guardFrontend(t *testing.T, maxBytes int, rate string, ids ...string) *frontend {
	f := c.frontend(nil, append([]string{"--stream-max-bytes", fmt.Sprint(maxBytes), "--migration-limit", "3"}, c.auth...)...)
	for _, id := range ids {
		c.worker(id, "--mock-tokens-per-sec", rate, "--mock-ttft", "5ms")
	}
	f.waitRoutable(t, ids...)
	return f
}

// TestGuardFindsWriterWithoutLease: w3's credential, which holds no lease
// (its worker never started), writes 16 KiB junk messages on random
// request ids, 1.5 times the 128 MiB log, while clients stream through the
// frontend. Formerly nobody looked at it: 112 × 503 log_full over 23 s,
// no quarantine. Now the guard's look at any writer's messages finds w3
// by the worker its subjects name, quarantines it by its id (a record on
// baton.workers.w3.quarantine) and purges what it writes: every client
// request is served, none refused.
func TestGuardFindsWriterWithoutLease(t *testing.T) {
	const maxBytes = 128 << 20
	c := confinedStack(t, "w1", "w2", "w3")
	f := c.guardFrontend(t, maxBytes, "200", "w1", "w2")
	w := c.watchGuard(t, f, "w3")
	const size = 16 << 10
	stored, refused, took := flood(t, c.junkWriter("w3"), 3*maxBytes/2/size, size, 0, func(i int) string {
		return streams.RequestTokens(fmt.Sprintf("random-%d", i), 0, "w3")
	})
	waitFor(t, 10*time.Second, "w3's quarantine recorded", func() bool { return f.metric(t, "baton_log_workers_quarantined_total") >= 1 })
	peak, q := w.end(t)
	t.Logf("w3 wrote %d × 16 KiB in %v (%d stored, %d refused); quarantined after %v; log peak %.2f",
		stored+refused, took.Round(time.Millisecond), stored, refused, q.Round(time.Millisecond), peak)
	if refused > 0 {
		t.Errorf("%d junk writes refused: the log filled", refused)
	}
	if f.metric(t, "baton_log_junk_purged_messages_total") < 1 {
		t.Error("no junk purged")
	}
}

// TestQuarantinedWorkerSmallJunkOnManySubjects: w1 serves clients, and
// its credential writes 4 KiB junk messages, each on a subject of its own
// (a request id that does not exist), 1.5 times the 128 MiB log. It is
// quarantined after 64 of them; quarantine stops dispatches, not writes,
// so the flood goes on: formerly the sweep drained about 600 subjects a
// second, the log reached 0.99999 and clients got 135 × 503 log_full.
// Now the sweep judges the subjects in batched reads and, once none of
// w1's output is needed, purges all it wrote in one request a reading:
// every client request is served, none refused.
func TestQuarantinedWorkerSmallJunkOnManySubjects(t *testing.T) {
	const maxBytes = 128 << 20
	c := confinedStack(t, "w1", "w2")
	f := c.guardFrontend(t, maxBytes, "200", "w1", "w2")
	w := c.watchGuard(t, f, "w1")
	const size = 4 << 10
	stored, refused, took := flood(t, c.junkWriter("w1"), 3*maxBytes/2/size, size, 0, func(i int) string {
		return streams.RequestTokens(fmt.Sprintf("many-%d", i), 0, "w1")
	})
	peak, q := w.end(t)
	purged := f.metric(t, "baton_log_junk_purged_messages_total")
	t.Logf("w1 wrote %d × 4 KiB on as many subjects in %v (%d stored, %d refused); quarantined after %v; %.0f purged, %.0f subjects a second from the quarantine to the flood's end; log peak %.2f",
		stored+refused, took.Round(time.Millisecond), stored, refused, q.Round(time.Millisecond), purged, purged/(took-q).Seconds(), peak)
	js := c.operator(t)
	waitFor(t, 10*time.Second, "all w1 wrote purged", func() bool {
		st, err := js.Stream(t.Context(), streams.RequestsStream)
		if err != nil {
			return false
		}
		info, err := st.Info(t.Context(), jetstream.WithSubjectFilter(streams.WorkerTokens("w1")))
		return err == nil && len(info.State.Subjects) == 0
	})
	if refused > 0 {
		t.Errorf("%d junk writes refused: the log filled", refused)
	}
}

// TestQuarantinedWorkerLargeJunkOnOwnAttempt: w1 serves a long request
// (200 tokens at 10 a second, max_tokens 200: a message of its attempts
// may hold about 0.85 MiB), and its credential writes 1 MiB junk messages
// on that request's own attempt subject, one every 80 ms (13 MB/s, the
// request outlasts it), 1.5 times the 128 MiB log, while other clients
// stream. Formerly that was trusted until the request ended,
// which the worker decides: 183 × 503 over 39 s. Now a message over the
// attempt's bound is junk: w1 is quarantined, its request migrates to w2
// and completes, what w1 writes there after the fence is deleted, and
// every client request is served.
func TestQuarantinedWorkerLargeJunkOnOwnAttempt(t *testing.T) {
	const maxBytes = 128 << 20
	c := confinedStack(t, "w1", "w2")
	f := c.guardFrontend(t, maxBytes, "10", "w1")
	const victimTokens = 200
	victim := make(chan sseResult, 1)
	go func() {
		victim <- postStream(t, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "the victim", "max_tokens": victimTokens},
			map[string]string{"X-Request-Id": "victim"}, nil)
	}()
	waitFor(t, 10*time.Second, "the victim served by w1", func() bool {
		var st requestState
		resp, err := http.Get(f.url + "/v1/requests/victim")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == 200 && json.NewDecoder(resp.Body).Decode(&st) == nil && st.Worker == "w1" && st.TokensGenerated > 0
	})
	c.worker("w2", "--mock-tokens-per-sec", "200", "--mock-ttft", "5ms")
	f.waitRoutable(t, "w1", "w2")

	w := c.watchGuard(t, f, "w1")
	const size = 1<<20 - 4096 // under MaxMsgSize with its headers
	stored, refused, took := flood(t, c.junkWriter("w1"), 3*maxBytes/2/size, size, 80*time.Millisecond, func(int) string {
		return streams.RequestTokens("victim", 0, "w1")
	})
	r := <-victim
	peak, q := w.end(t)
	t.Logf("w1 wrote %d × 1 MiB on its own attempt in %v (%d stored, %d refused); quarantined after %v; %.0f junk messages purged; log peak %.2f",
		stored+refused, took.Round(time.Millisecond), stored, refused, q.Round(time.Millisecond), f.metric(t, "baton_log_junk_purged_messages_total"), peak)
	if r.status != 200 || !r.done || len(strings.Fields(r.text)) != victimTokens {
		t.Errorf("the victim: status %d, done %v, %d tokens, %s", r.status, r.done, len(strings.Fields(r.text)), r.errorBody)
	}
	if refused > 0 {
		t.Errorf("%d junk writes refused: the log filled", refused)
	}
}

// TestQuarantineOutlivesReRegistration: w1 is quarantined for a large junk
// message; its lease revoked, it registers again: its honest registration
// is the last event on its events subject, where the quarantine was. A frontend started
// afterwards still lists it quarantined (the frontend's record on
// baton.workers.w1.quarantine, which w1's credential cannot write), and
// sends it none of 10 requests. Formerly it listed w1 ready and sent it 5.
func TestQuarantineOutlivesReRegistration(t *testing.T) {
	c := confinedStack(t, "w1", "w2")
	f1 := c.frontend(nil, c.auth...)
	c.worker("w1", "--mock-tokens-per-sec", "500")
	c.worker("w2", "--mock-tokens-per-sec", "500")
	f1.waitRoutable(t, "w1", "w2")

	js := c.junkWriter("w1")
	if _, err := js.Publish(t.Context(), streams.RequestTokens("junk-1", 0, "w1"), make([]byte, 100<<10)); err != nil {
		t.Fatal(err)
	}
	f1.waitQuarantined(t, "w1", 10*time.Second)
	// Its credential cannot write the quarantine record.
	_, _ = js.PublishAsync(streams.WorkerQuarantine("w1"), []byte("{}"))
	c.expectViolation("w1", streams.WorkerQuarantine("w1"))
	// w1 finds its lease revoked and registers again, on its own.
	jsOp := c.operator(t)
	waitFor(t, 20*time.Second, "w1 registered again", func() bool {
		m, err := streams.LastOnSubject(t.Context(), jsOp, streams.WorkersStream, streams.WorkerEvents("w1"))
		return err == nil && m != nil && m.Header.Get(events.HeaderType) == events.TypeWorkerRegistered
	})

	f2 := c.frontend(nil, c.auth...)
	f2.waitRoutable(t, "w2")
	f2.waitQuarantined(t, "w1", 5*time.Second)
	for i := range 10 {
		r := postStream(t, f2.url, "/v1/completions", map[string]any{"model": "mock", "prompt": fmt.Sprintf("after %d", i), "max_tokens": 8}, nil, nil)
		if r.status != 200 || !r.done {
			t.Fatalf("request %d through f2: status %d, %s", i, r.status, r.errorBody)
		}
		if w := f2.servingWorker(t, r.requestID); w != "w2" {
			t.Errorf("request %d served by %s, want w2", i, w)
		}
	}
}
