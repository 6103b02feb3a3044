package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Workers confined to their own requests (per-worker users): a worker's
// attacks on another's requests, and, below, its credential against the
// other workers: events forged for another worker, and floods of the
// workers stream and of checks.

// confined is a stack on a `baton nats` that enforces per-worker users
// (--worker-users): the frontends log in as "frontend", each worker as its
// own user, pinned to its own subjects.
type confined struct {
	*stack
	ns   *proc
	auth []string // the frontend's (and tools') credentials flags
}

func confinedStack(t *testing.T, workers ...string) *confined {
	t.Helper()
	return newConfined(t, nil, workers...)
}

// newConfined is confinedStack on a `baton nats` given natsArgs too.
func newConfined(t *testing.T, natsArgs []string, workers ...string) *confined {
	t.Helper()
	dir := t.TempDir()
	users := filepath.Join(dir, "workers")
	var lines strings.Builder
	for _, id := range workers {
		lines.WriteString(id + " " + id + "-password-0123456789\n")
	}
	if err := os.WriteFile(users, []byte(lines.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	args := append([]string{"nats", "--port", strconv.Itoa(port), "--store-dir", filepath.Join(dir, "nats"),
		"--user", "frontend", "--password", "frontend-password-0123", "--worker-users", users}, natsArgs...)
	ns := start(t, "nats", nil, args...)
	waitFor(t, 20*time.Second, "nats to serve", func() bool {
		nc, err := nats.Connect(url, nats.UserInfo("frontend", "frontend-password-0123"))
		if err == nil {
			nc.Close()
		}
		return err == nil
	})
	return &confined{stack: &stack{t: t, dir: dir, natsURL: url, workers: map[string]*proc{}}, ns: ns,
		auth: []string{"--nats-user", "frontend", "--nats-password", "frontend-password-0123"}}
}

// worker starts worker id as its own user.
func (c *confined) worker(id string, args ...string) {
	c.t.Helper()
	all := append([]string{"worker", "--nats", c.natsURL, "--worker-id", id}, args...)
	c.workers[id] = start(c.t, "worker-"+id, []string{"NATS_USER=" + id, "NATS_PASSWORD=" + id + "-password-0123456789"}, all...)
}

// connectAs connects with worker id's credential, the way its worker does
// (its own inbox prefix), and collects the server's asynchronous errors.
func (c *confined) connectAs(id string) (*nats.Conn, *asyncErrors) {
	c.t.Helper()
	errs := &asyncErrors{}
	nc, err := nats.Connect(c.natsURL, nats.UserInfo(id, id+"-password-0123456789"),
		nats.CustomInboxPrefix(streams.WorkerInboxPrefix(id)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs.add(err) }))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(nc.Close)
	return nc, errs
}

// expectViolations is the error handler of a connection that a test has
// break its permissions on purpose: the refusal is what the test checks,
// so a permissions violation is not printed (nats.go's default handler
// prints every async error to stderr, where it reads as a failure); any
// other error is, as by default.
func expectViolations(nc *nats.Conn, _ *nats.Subscription, err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		fmt.Fprintf(os.Stderr, "nats: %v on connection %s\n", err, nc.ConnectedUrlRedacted())
	}
}

// jetStreamAs is a JetStream client on a connection with id's credentials
// (connectAs), for a test that writes as a worker would.
func (c *confined) jetStreamAs(id string) jetstream.JetStream {
	c.t.Helper()
	nc, _ := c.connectAs(id)
	js, err := jetstream.New(nc)
	if err != nil {
		c.t.Fatal(err)
	}
	return js
}

// violated reports whether the server logged a permissions violation of
// user on subject.
func (c *confined) violated(user, subject string) bool {
	for _, line := range strings.Split(c.ns.output(), "\n") {
		if strings.Contains(line, "Violation") && strings.Contains(line, "user:"+user) && strings.Contains(line, subject) {
			return true
		}
	}
	return false
}

// expectViolation waits for the server's log of user's violation on subject.
func (c *confined) expectViolation(user, subject string) {
	c.t.Helper()
	waitFor(c.t, 10*time.Second, "a permissions violation of "+user+" on "+subject, func() bool { return c.violated(user, subject) })
}

type asyncErrors struct {
	mu   sync.Mutex
	errs []string
}

func (a *asyncErrors) add(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.errs = append(a.errs, err.Error())
}

// TestWorkerConfinedToItsRequests: a worker credential (w1's) against a
// request routed to another worker (w2), on a server that enforces
// per-worker users. Formerly every attack below worked with zero
// violations; now each is a permissions violation, or lands on a subject
// of w1's own that the frontends read for no attempt of the victim (so the
// fold ignores it, and the frontend's guard purges it as junk), and the
// victim's answer is the fault-free text.
func TestWorkerConfinedToItsRequests(t *testing.T) {
	t.Parallel()
	c := confinedStack(t, "w1", "w2")
	// No compaction at the end, so that replay shows w1's writes ignored;
	// baton compact then purges them, as the owner would have.
	f := c.frontend(nil, append([]string{"--log-compaction=false"}, c.auth...)...)
	c.worker("w1", "--mock-tokens-per-sec", "200", "--mock-ttft", "5ms")
	// The victim runs on w2, held at its token 60 until every attack is
	// done (SIGUSR1 opens the hold).
	c.worker("w2", "--mock-tokens-per-sec", "200", "--mock-ttft", "5ms", "--mock-hold-at-token", "60")
	f.waitRoutable(t, "w1", "w2")

	const id, prompt, maxTokens = "victim-1", "the victim's secret prompt", 120
	result := streamPast(t, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": maxTokens},
		map[string]string{"X-Worker-Id": "w2", "X-Request-Id": id}, 0)

	nc, asyncErrs := c.connectAs("w1")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	writeAttacks(ctx, t, c, js, id)
	commandAttacks(t, c, nc, id)
	if st := f.state(t, id); st.Status != "running" {
		t.Fatalf("the victim is %s after %d tokens right after w1's writes, want running (held): a forged event was taken",
			st.Status, st.TokensGenerated)
	}
	readAttacks(t, c, nc, id)
	cctx, ccancel := context.WithTimeout(ctx, time.Second)
	if _, err := js.CreateStream(cctx, jetstream.StreamConfig{Name: "CAPTURE", Subjects: []string{"baton.live.requests.>"},
		RePublish: &jetstream.RePublish{Source: ">", Destination: streams.WorkerInboxPrefix("w1") + ".stolen.>"}}); err == nil {
		t.Error("w1 created a stream capturing every request's live subjects")
	}
	ccancel()
	c.expectViolation("w1", "$JS.API.STREAM.CREATE.CAPTURE")

	c.workers["w2"].signal(syscall.SIGUSR1) // the attacks are over: the victim may finish
	res := <-result
	checkComplete(t, res, prompt, maxTokens)
	if st := f.state(t, id); st.Status != "completed" || st.Worker != "w2" {
		t.Errorf("the victim's state %+v, want completed on w2", st)
	}
	// What w1 stored on its own subjects of the victim's attempts is junk
	// (attempt 0 was routed to w2, attempt 1 to nobody): the frontend's
	// guard purges it (services/retention/guard.go).
	fnc, err := nats.Connect(c.natsURL, nats.UserInfo("frontend", "frontend-password-0123"))
	if err != nil {
		t.Fatal(err)
	}
	defer fnc.Close()
	fjs, err := jetstream.New(fnc)
	if err != nil {
		t.Fatal(err)
	}
	reqs, err := fjs.Stream(ctx, streams.RequestsStream)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the frontend to purge w1's writes on the victim's subjects", func() bool {
		for _, k := range []int{0, 1} {
			if _, err := reqs.GetLastMsgForSubject(ctx, streams.RequestTokens(id, k, "w1")); err == nil {
				return false
			}
		}
		return true
	})
	if f.metric(t, "baton_log_junk_purged_messages_total") < 1 {
		t.Error("baton_log_junk_purged_messages_total: want w1's writes counted")
	}
	if _, errOut, code := runTool(t, batonBin, append([]string{"compact", id, "--nats", c.natsURL}, c.auth...)...); code != 0 {
		t.Fatalf("baton compact: exit %d: %s", code, errOut)
	}
	out, errOut, code := runTool(t, batonBin, append([]string{"replay", id, "--nats", c.natsURL}, c.auth...)...)
	if code != 0 || strings.Contains(out, projectionsNotRouted) || strings.Contains(out, "PWNED") || !strings.Contains(out, "compacted") {
		t.Errorf("after baton compact, replay (exit %d) still shows w1's writes, or no compact record:\n%s\n%s", code, out, errOut)
	}
	if st := f.state(t, id); st.Status != "completed" || st.Worker != "w2" || st.TokensGenerated != maxTokens {
		t.Errorf("the victim's state after compaction %+v, want completed on w2 with %d tokens", st, maxTokens)
	}
	asyncErrs.mu.Lock()
	t.Logf("w1's asynchronous errors: %q", asyncErrs.errs)
	asyncErrs.mu.Unlock()
}

// projectionsNotRouted is what baton replay says of an attempt's output on
// a worker's subject that routed did not name.
const projectionsNotRouted = "not the routed worker"

// readAttacks: w1 tries to read the victim's prompt and answer, every
// other worker's dispatches and commands, and a frontend's inbox.
func readAttacks(t *testing.T, c *confined, nc *nats.Conn, id string) {
	t.Helper()
	for _, subj := range []string{"baton.live.requests.>", "baton.live." + strings.TrimPrefix(streams.RequestAll(id), "baton."),
		"baton.dispatch.w2", "baton.commands.w2", "baton.dispatch.*", "_INBOX.>", streams.WorkerInboxPrefix("w2") + ".>"} {
		if _, err := nc.Subscribe(subj, func(m *nats.Msg) { t.Errorf("w1 received %s", m.Subject) }); err != nil {
			t.Fatal(err)
		}
	}
	_ = nc.Flush()
	for _, api := range []struct{ subj, body string }{
		{"$JS.API.DIRECT.GET.BATON_REQUESTS", `{"last_by_subj":"` + streams.RequestEvents(id) + `"}`},
		{"$JS.API.DIRECT.GET.BATON_REQUESTS." + streams.RequestEvents(id), ``},
		{"$JS.API.STREAM.MSG.GET.BATON_REQUESTS", `{"seq":1}`},
		{"$JS.API.CONSUMER.CREATE.BATON_REQUESTS", `{"stream_name":"BATON_REQUESTS","config":{"deliver_policy":"all","ack_policy":"none"}}`},
	} {
		if m, err := nc.Request(api.subj, []byte(api.body), time.Second); err == nil {
			t.Errorf("w1's %s was answered: %s", api.subj, m.Data)
		}
	}
	for _, subj := range []string{"baton.live.requests.>", "baton.dispatch.w2", "baton.commands.w2", "_INBOX.>",
		"$JS.API.DIRECT.GET.BATON_REQUESTS", "$JS.API.STREAM.MSG.GET.BATON_REQUESTS", "$JS.API.CONSUMER.CREATE.BATON_REQUESTS"} {
		c.expectViolation("w1", subj)
	}
}

// writeAttacks: w1 tries to inject tokens into the victim's answer and to
// forge its completion and its cancel: on w2's subject and on the events
// subject (permissions violations), and on the subject of its own for the
// victim's attempt (stored, and ignored by every reader).
func writeAttacks(ctx context.Context, t *testing.T, c *confined, js jetstream.JetStream, id string) {
	t.Helper()
	log := streams.NewLog(js, "baton/worker/w1")
	// From offset 0 on, so that whatever the victim's offset, a reader that
	// took it would take its tail: the rest of the answer.
	pwned := events.TokensGenerated{RequestID: id, Attempt: 0, Offset: 0, Tokens: slices.Repeat([]string{"PWNED "}, 200)}
	forged := events.RequestCompleted{RequestID: id, Attempt: 0, FinishReason: "stop", CompletionTokens: 2}
	cancelled := events.RequestCancelled{RequestID: id, Mode: events.CancelKill, Reason: "forged"}
	for i, w := range []struct {
		subject string
		ev      events.Event
		stored  bool // NATS lets w1 write it: the readers must ignore it
	}{
		{streams.RequestTokens(id, 0, "w2"), pwned, false},
		{streams.RequestTokens(id, 0, "w2"), forged, false},
		{streams.RequestEvents(id), cancelled, false},
		{streams.RequestEvents(id), forged, false},
		{streams.RequestTokens(id, 0, "w1"), pwned, true},
		{streams.RequestTokens(id, 0, "w1"), forged, true},
		{streams.RequestTokens(id, 0, "w1"), cancelled, true},
		{streams.RequestTokens(id, 1, "w1"), pwned, true},
	} {
		env := log.Envelope("attack-"+strconv.Itoa(i), id, w.ev)
		actx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := log.Append(actx, w.subject, env, -1)
		cancel()
		switch {
		case w.stored && err != nil:
			t.Errorf("w1's write of %s to its own subject %s: %v", w.ev.EventType(), w.subject, err)
		case !w.stored && err == nil:
			t.Errorf("w1 stored %s on %s", w.ev.EventType(), w.subject)
		case !w.stored:
			c.expectViolation("w1", w.subject)
		}
	}
}

// TestDetachedRequestCancelledByAFrontend: the owning frontend of a
// resumable request crashes and no client comes back. The worker, which may
// no longer write the request's events subject, asks a live frontend, which
// cancels the request once the detach timeout has passed; the worker stops
// and the server logs no violation of the worker's.
func TestDetachedRequestCancelledByAFrontend(t *testing.T) {
	t.Parallel()
	c := confinedStack(t, "w1")
	detach := []string{"--detach-timeout", "1500ms"}
	f1 := c.frontend(nil, append(detach, c.auth...)...)
	f2 := c.frontend(nil, append(detach, c.auth...)...)
	c.worker("w1", "--mock-tokens-per-sec", "50", "--mock-ttft", "5ms")
	f1.waitRoutable(t, "w1")
	f2.waitRoutable(t, "w1")
	const id = "orphan-1"
	var once sync.Once
	postStream(t, f1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "left behind", "max_tokens": 5000},
		map[string]string{"X-Request-Id": id, "X-Resumable": "true"}, func(e sseEvent) {
			if n, _ := strconv.Atoi(e.id); n >= 10 {
				once.Do(func() { f1.signal(syscall.SIGKILL) }) // the owner crashes; the client is gone with it
			}
		})
	waitFor(t, 30*time.Second, "the orphaned request to be cancelled", func() bool {
		return f2.state(t, id).Status == "cancelled"
	})
	waitFor(t, 10*time.Second, "w1 to go idle", func() bool {
		ws, err := f2.workers()
		return err == nil && len(ws) == 1 && ws[0].Load.ActiveRequests == 0
	})
	if !strings.Contains(f2.output(), "cancelled detached request") {
		t.Errorf("frontend-2 did not log the detach cancel:\n%s", f2.output())
	}
	if strings.Contains(c.ns.output(), "Violation") {
		t.Errorf("permissions violations:\n%s", c.ns.output())
	}
}

// commandAttacks: w1 tries to stop w2's generation of the victim (a kill on
// w2's command subject), to dispatch work to w2, and to answer for the
// frontends (a check on w2's subject): each a permissions violation.
func commandAttacks(t *testing.T, c *confined, nc *nats.Conn, id string) {
	t.Helper()
	kill, _ := json.Marshal(streams.Command{RequestID: id, Attempt: 0, Kind: streams.CommandCancel, Mode: events.CancelKill})
	dispatch, _ := json.Marshal(events.Dispatch{RequestID: id, Attempt: 1, Model: "mock", Prompt: "x", MaxTokens: 1})
	for _, m := range []struct {
		subj string
		data []byte
	}{{streams.CommandSubject("w2"), kill}, {streams.DispatchSubject("w2"), dispatch}, {streams.CheckSubject("w2"), []byte(`{}`)}} {
		if err := nc.Publish(m.subj, m.data); err != nil {
			t.Fatal(err)
		}
		c.expectViolation("w1", m.subj)
	}
}

// confinedPair starts a confined stack with workers w1 and w2 and one
// frontend that can route to both.
func confinedPair(t *testing.T) (*confined, *frontend) {
	t.Helper()
	c := confinedStack(t, "w1", "w2")
	f := c.frontend(nil, c.auth...)
	c.worker("w1", "--mock-ttft", "5ms")
	c.worker("w2", "--mock-ttft", "5ms")
	f.waitRoutable(t, "w1", "w2")
	return c, f
}

// TestForgedWorkerEventsIgnored: w1's credential reads w2's lease id (a
// direct get on the leases bucket is granted to every worker) and writes a
// draining, a lost and a deregistered naming w2 and that lease on its own
// events subject, the one its permissions allow. Formerly every frontend,
// and every frontend started later, took w2 out of routing and sent every
// new request to w1. Now each frontend logs the events as ignored, w2 stays
// ready, serves the requests once w1 is gone, and baton events says why.
func TestForgedWorkerEventsIgnored(t *testing.T) {
	t.Parallel()
	c, f1 := confinedPair(t)
	js := c.jetStreamAs("w1")
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
		waitFor(t, 10*time.Second, f.Name+" to ignore the forged events", func() bool {
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
			t.Errorf("%s: a request with w2 alone: status %d, want 200", f.Name, resp.StatusCode)
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
	c, f := confinedPair(t)
	js := c.jetStreamAs("w1")
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
