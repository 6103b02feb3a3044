package retention_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/internal/waitfor"
	"github.com/baton-dev/baton/services/retention"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// fleet is a retention.Fleet of fixed workers that records quarantines.
type fleet struct {
	mu          sync.Mutex
	live        []string
	quarantined map[string]string // worker: why
	asked       int               // calls of Workers: one a reading of the guard
}

func (f *fleet) Workers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	var ids []string
	for _, id := range f.live {
		if _, q := f.quarantined[id]; !q {
			ids = append(ids, id)
		}
	}
	return ids
}

func (f *fleet) Quarantined() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id := range f.quarantined {
		ids = append(ids, id)
	}
	return ids
}

func (f *fleet) Junk(_ context.Context, id, why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.quarantined[id] = why
}

func (f *fleet) why(id string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	why, ok := f.quarantined[id]
	return why, ok
}

// guardedLog provisions a 64 MiB request log in memory for a guard test.
func guardedLog(t *testing.T) (js jetstream.JetStream, fe, wk *streams.Log) {
	t.Helper()
	js = natstest.Start(t).JetStream(t)
	if _, err := streams.Provision(context.Background(), js, streams.Config{MemoryStorage: true, RequestsMaxBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	fe, wk = logs(t, js)
	return js, fe, wk
}

// guard runs a Guard of the one-partition log guarding f's workers,
// reading every interval (through a Monitor of its readings, as a
// frontend's does), until the test ends.
func guard(t *testing.T, js jetstream.JetStream, f *fleet, interval time.Duration) *retention.Guard {
	t.Helper()
	m, err := retention.NewMonitor(js, prometheus.NewRegistry(), slog.New(slog.DiscardHandler), retention.Config{Interval: interval})
	if err != nil {
		t.Fatal(err)
	}
	m.SetPartitions(1)
	runUntilEnd(t, m.Run)
	return runGuard(t, js, f, m, interval, 1)
}

// runGuard runs a Guard of a log of parts partitions guarding f's workers,
// reading through usage every interval, until the test ends.
func runGuard(t *testing.T, js jetstream.JetStream, f *fleet, usage retention.UsageReader, interval time.Duration, parts streams.Partitions) *retention.Guard {
	t.Helper()
	g, err := retention.NewGuard(js, usage, prometheus.NewRegistry(), slog.New(slog.DiscardHandler), retention.GuardConfig{Interval: interval})
	if err != nil {
		t.Fatal(err)
	}
	g.SetPartitions(parts)
	g.SetFleet(f)
	runUntilEnd(t, g.Run)
	return g
}

// runUntilEnd runs run until the test ends, and fails the test unless it
// then returns nil.
func runUntilEnd(t *testing.T, run func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

// TestGuardQuarantinesJunkWriters: what a worker wrote since it was last
// looked at is judged at each reading. Compacted requests' carries on w1's
// subjects (80 messages) are not junk, and a late delta of w1's after a
// request's record, and a message on a subject no reader folds, are purged
// without quarantining w1; a 100 KiB message quarantines its worker and is
// purged: w2's on a request that does not exist, w3's on the request in
// flight (an attempt routed to w1); the request in flight and the compact
// records stay.
func TestGuardQuarantinesJunkWriters(t *testing.T) {
	js, fe, wk := guardedLog(t)
	ctx := context.Background()
	for i := range 40 {
		id := fmt.Sprintf("done-%02d", i)
		store(t, fe, wk, id, 5, false)
		if err := retention.CompactFromLog(ctx, fe, 1, id); err != nil {
			t.Fatal(err)
		}
	}
	store(t, fe, wk, "inflight", 10, true)
	st, err := js.Stream(ctx, streams.RequestsStream)
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{live: []string{"w1", "w2", "w3"}, quarantined: map[string]string{}}
	guard(t, js, f, 5*time.Millisecond)
	waitGone := func(what, subject string) {
		t.Helper()
		waitfor.Poll(t, what+" ("+subject+") purged", func() bool {
			_, err := st.GetLastMsgForSubject(ctx, subject)
			return err != nil
		})
	}

	// Each worker is looked at once (a reading each, in turn) before w1
	// comes back from a partition during which its request migrated away
	// and ended: its connection sends the deltas it buffered, on its own
	// attempt's subject, after the end: more than junkMany of them, written
	// since the guard last looked at w1.
	waitfor.Poll(t, "every worker looked at", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.asked > 2*len(f.live)
	})
	late := streams.RequestTokens("done-07", 0, "w1")
	for i := range 200 {
		natstest.Append(ctx, t, wk, late, fmt.Sprint("late-", i), "done-07", events.TokensGenerated{RequestID: "done-07", Offset: 5 + i, Tokens: []string{"late "}})
	}
	waitGone("w1's late deltas", late)
	malformed := "baton.requests.0.junk.tokens.0.w1" // slot 0 is not junk's: no reader folds it
	natstest.Append(ctx, t, wk, malformed, "malformed", "junk", events.TokensGenerated{RequestID: "junk", Tokens: []string{"x"}})
	waitGone("w1's message on a malformed subject", malformed)
	if why, q := f.why("w1"); q {
		t.Fatalf("w1 quarantined for its carries and the late deltas of its own attempt: %s", why)
	}

	junk := streams.RequestTokens("no-such-request", 0, "w2")
	big := wk.Envelope("junk", "no-such-request", events.TokensGenerated{RequestID: "no-such-request", Tokens: []string{strings.Repeat("x", 100<<10)}})
	if _, err := streams.NewLog(js, "baton/worker/w2").Append(ctx, junk, big, -1); err != nil {
		t.Fatal(err)
	}
	waitGone("w2's junk", junk)
	why, q := f.why("w2")
	if !q || !strings.Contains(why, "no-such-request") || !strings.Contains(why, "does not exist") {
		t.Fatalf("w2 after its junk: quarantined %v (%q), want quarantined naming the request", q, why)
	}
	if _, q := f.why("w1"); q {
		t.Error("w1 quarantined with w2")
	}
	// Swept, w2 is looked at again only once it writes again: what it
	// writes later is purged too.
	again := streams.RequestTokens("no-such-request-either", 0, "w2")
	bigAgain := wk.Envelope("junk-again", "no-such-request-either", events.TokensGenerated{RequestID: "no-such-request-either", Tokens: []string{strings.Repeat("x", 100<<10)}})
	if _, err := streams.NewLog(js, "baton/worker/w2").Append(ctx, again, bigAgain, -1); err != nil {
		t.Fatal(err)
	}
	waitGone("w2's junk written after its sweep", again)
	// w3 writes to the request in flight, on its own subject of an attempt
	// routed to w1.
	stray := streams.RequestTokens("inflight", 0, "w3")
	onLive := streams.NewLog(js, "baton/worker/w3").Envelope("stray", "inflight", events.TokensGenerated{RequestID: "inflight", Offset: 10, Tokens: []string{strings.Repeat("y", 100<<10)}})
	if _, err := streams.NewLog(js, "baton/worker/w3").Append(ctx, stray, onLive, -1); err != nil {
		t.Fatal(err)
	}
	waitGone("w3's junk on a request in flight", stray)
	if why, q := f.why("w3"); !q || !strings.Contains(why, "not routed to it") {
		t.Fatalf("w3 after its junk on a request in flight: quarantined %v (%q), want quarantined", q, why)
	}
	r, _, err := retention.Read(ctx, fe, 1, "inflight")
	if err != nil || r.Len() != 10 {
		t.Errorf("the request in flight after the sweeps: %v, %d tokens, want 10", err, r.Len())
	}
	for i := range 40 {
		id := fmt.Sprintf("done-%02d", i)
		if r, _, err := retention.Read(ctx, fe, 1, id); err != nil || r.Text() != "t0 t1 t2 t3 t4 " {
			t.Errorf("%s after the sweeps: %v, %q", id, err, r.Text())
		}
	}
}

// TestGuardFindsJunkAmongHonestWrites: w1 serves a request and, with the
// same credential, writes 40 messages of 100 KiB to a request that does
// not exist between its honest deltas, 300 of them after the junk, all
// between two readings of the guard. The first message w1 wrote since the
// guard last looked is honest, and so are its last: a look at either
// alone passed the junk by, and the next one started after it; the
// partition grew fast, so the check's messages spread over what came
// since the previous reading find it, quarantine w1 and purge it, and the
// request in flight keeps its deltas.
func TestGuardFindsJunkAmongHonestWrites(t *testing.T) {
	js, fe, wk := guardedLog(t)
	ctx := context.Background()
	store(t, fe, wk, "inflight", 10, true)
	f := &fleet{live: []string{"w1"}, quarantined: map[string]string{}}
	// Readings far enough apart that what follows is written between two.
	guard(t, js, f, time.Second)
	waitfor.Poll(t, "the guard's first reading", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.asked > 0
	})
	tokens := streams.RequestTokens("inflight", 0, "w1")
	delta := func(i int) {
		t.Helper()
		natstest.Append(ctx, t, wk, tokens, fmt.Sprint("d-", i), "inflight", events.TokensGenerated{RequestID: "inflight", Offset: i, Tokens: []string{fmt.Sprintf("t%d ", i)}, IDs: []int{i}})
	}
	delta(10)
	junk := streams.RequestTokens("no-such-request", 0, "w1")
	for i := range 40 {
		big := wk.Envelope(fmt.Sprint("junk-", i), "no-such-request", events.TokensGenerated{RequestID: "no-such-request", Tokens: []string{strings.Repeat("x", 100<<10)}})
		if _, err := wk.Append(ctx, junk, big, -1); err != nil {
			t.Fatal(err)
		}
	}
	for i := 11; i < 311; i++ {
		delta(i)
	}
	st, err := js.Stream(ctx, streams.RequestsStream)
	if err != nil {
		t.Fatal(err)
	}
	waitfor.Poll(t, "w1's junk purged", func() bool {
		_, err := st.GetLastMsgForSubject(ctx, junk)
		return err != nil
	})
	if why, q := f.why("w1"); !q || !strings.Contains(why, "no-such-request") {
		t.Fatalf("w1 after its junk among honest deltas: quarantined %v (%q), want quarantined naming the request", q, why)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(tokens))
	if err != nil || info.State.Subjects[tokens] != 311 {
		t.Errorf("w1's deltas of the request in flight after the sweeps: %v, %d messages, want 311", err, info.State.Subjects[tokens])
	}
}

// TestGuardReadingsAreAdmissions: a Guard reads through a Monitor, which
// does not run here: once the guard (with no fleet to check) has read a
// partition above the high-water mark, the Monitor refuses new requests
// there, and Run returns nil when its context ends.
func TestGuardReadingsAreAdmissions(t *testing.T) {
	l := newSmallLog(t)
	ctx, js := context.Background(), l.js
	for i := 0; l.ratio() <= 0.92; i++ {
		store(t, l.fe, l.wk, fmt.Sprintf("done-%03d", i), 20, false)
	}
	m := l.monitor() // not run: the guard's readings are its readings
	g, err := retention.NewGuard(js, m, prometheus.NewRegistry(), slog.New(slog.DiscardHandler), retention.GuardConfig{Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	g.SetPartitions(1)
	if err := m.Admit("anything"); err != nil {
		t.Fatalf("admission before any reading: %v", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run(rctx) }()
	waitfor.Poll(t, "admission refused from the guard's reading", func() bool {
		return errors.Is(m.Admit("anything"), retention.ErrLogFull)
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after its context ended: %v, want nil", err)
	}
}

// TestGuardFindsWriterWithoutLease: the view lists no worker. w1 crashed
// (its lease gone) while serving a request, whose 10 deltas it wrote; w9
// never registered and writes 200 small junk messages on request ids that
// do not exist. The guard's look at any writer's messages finds both by
// the worker their subjects name and checks what each wrote: w9 is
// quarantined by its id and its junk purged; w1's deltas, of an attempt
// routed to it, are honest and stay. Formerly only leased workers were
// looked at.
//
// The guard starts once the 200 are stored: small junk quarantines its
// writer when junkMany of it is in the log at once, and a guard reading
// while the test was still writing (at load 10 the appends came slower
// than its readings) purged each reading's few as an honest worker's
// late deltas, all 200 of them, without ever quarantining w9.
func TestGuardFindsWriterWithoutLease(t *testing.T) {
	js, fe, wk := guardedLog(t)
	ctx := context.Background()
	store(t, fe, wk, "inflight", 10, true)
	for i := range 200 {
		id := fmt.Sprintf("random-%d", i)
		junk := wk.Envelope(fmt.Sprint("junk-", i), id, events.TokensGenerated{RequestID: id, Tokens: []string{strings.Repeat("x", 1<<10)}})
		if _, err := wk.Append(ctx, streams.RequestTokens(id, 0, "w9"), junk, -1); err != nil {
			t.Fatal(err)
		}
	}
	f := &fleet{quarantined: map[string]string{}}
	guard(t, js, f, 20*time.Millisecond)
	waitfor.Poll(t, "w9 quarantined", func() bool { _, q := f.why("w9"); return q })
	if why, _ := f.why("w9"); !strings.Contains(why, "does not exist") {
		t.Errorf("w9's quarantine: %q, want its junk named", why)
	}
	st, err := js.Stream(ctx, streams.RequestsStream)
	if err != nil {
		t.Fatal(err)
	}
	waitfor.Poll(t, "w9's junk purged", func() bool {
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(streams.WorkerTokens("w9")))
		return err == nil && len(info.State.Subjects) == 0
	})
	tokens := streams.RequestTokens("inflight", 0, "w1")
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(tokens))
	if err != nil || info.State.Subjects[tokens] != 10 {
		t.Errorf("w1's deltas of the request in flight: %v, %d messages, want 10", err, info.State.Subjects[tokens])
	}
	if _, q := f.why("w1"); q {
		t.Error("w1 quarantined")
	}
}

// TestGuardSweepsManySubjects: w1, quarantined, wrote one small junk
// message on each of 8,000 subjects (requests that do not exist) while
// its request in flight still needs its deltas. The sweep judges them in
// batched reads (1,024 requests a get) and purges the junk, one subject a
// purge: the request in flight keeps its 10 deltas. It logs the subjects
// swept a second (formerly 512 a reading at most, about 600 a second).
func TestGuardSweepsManySubjects(t *testing.T) {
	js, fe, wk := guardedLog(t)
	ctx := context.Background()
	store(t, fe, wk, "inflight", 10, true)
	st, err := js.Stream(ctx, streams.RequestsStream)
	if err != nil {
		t.Fatal(err)
	}
	msgs := func() uint64 {
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	honest := msgs()
	const n = 8000
	var futs []jetstream.PubAckFuture
	for i := range n {
		// Past 4,000 acks outstanding a publish waits for room: as long as
		// any wait of the test, not the client's default 200 ms, which a
		// loaded machine's server took to ack them (ErrTooManyStalledMsgs).
		fut, err := js.PublishAsync(streams.RequestTokens(fmt.Sprintf("gone-%d", i), 0, "w1"), []byte("junk"), jetstream.WithStallWait(waitfor.Timeout))
		if err != nil {
			t.Fatal(err)
		}
		futs = append(futs, fut)
	}
	for _, fut := range futs {
		select {
		case <-fut.Ok():
		case err := <-fut.Err():
			t.Fatal(err)
		}
	}
	subjects := func() map[string]uint64 {
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(streams.WorkerTokens("w1")))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects
	}
	if got := len(subjects()); got != n+1 {
		t.Fatalf("w1's subjects before the sweep: %d, want %d", got, n+1)
	}
	f := &fleet{live: []string{"w1"}, quarantined: map[string]string{"w1": "junk"}}
	start := time.Now()
	guard(t, js, f, 20*time.Millisecond)
	// Waited for by the stream's message count: a reading of w1's 8,001
	// subjects every few milliseconds, a JS API request as the purges are,
	// slowed the sweep by as much as it measures on a loaded machine.
	waitfor.Poll(t, "w1's junk swept", func() bool { return msgs() == honest })
	took := time.Since(start)
	t.Logf("%d subjects swept in %v: %.0f a second", n, took.Round(time.Millisecond), n/took.Seconds())
	if got := len(subjects()); got != 1 {
		t.Errorf("w1's subjects after the sweep: %d, want 1 (the request in flight's)", got)
	}
	tokens := streams.RequestTokens("inflight", 0, "w1")
	if got := subjects()[tokens]; got != 10 {
		t.Errorf("the request in flight's deltas after the sweep: %d, want 10", got)
	}
}

// TestGuardJudgesSuspectAtOnce: a 200 KiB message on w1's own running
// attempt, which a reader saw go by and told the guard of (Suspect), is
// judged at once, with no reading to meet it (the guard reads once an
// hour here): w1 is quarantined. A large honest message (the request's
// accepted event, on no worker's subject) and a message under
// SuspectSize are not judged.
func TestGuardJudgesSuspectAtOnce(t *testing.T) {
	js, fe, wk := guardedLog(t)
	ctx := context.Background()
	store(t, fe, wk, "inflight", 10, true)
	f := &fleet{live: []string{"w1"}, quarantined: map[string]string{}}
	g := guard(t, js, f, time.Hour)
	tokens := streams.RequestTokens("inflight", 0, "w1")
	small, err := js.Publish(ctx, tokens, make([]byte, retention.SuspectSize-1))
	if err != nil {
		t.Fatal(err)
	}
	g.Suspect(streams.RequestsStream, tokens, small.Sequence, retention.SuspectSize-1)
	g.Suspect(streams.RequestsStream, streams.RequestEvents("inflight"), 1, 1<<20)
	big, err := js.Publish(ctx, tokens, make([]byte, 200<<10))
	if err != nil {
		t.Fatal(err)
	}
	g.Suspect(streams.RequestsStream, tokens, big.Sequence, 200<<10)
	waitfor.Poll(t, "w1 quarantined", func() bool { _, q := f.why("w1"); return q })
	if why, _ := f.why("w1"); !strings.Contains(why, "204800-byte") {
		t.Errorf("w1's quarantine: %q, want the 200 KiB message named", why)
	}
}

// stuckUsage is a UsageReader whose readings never answer but the first
// partition's, which answers (an error) once released.
type stuckUsage struct {
	entered, release chan struct{}
	once             sync.Once
}

func (u *stuckUsage) Read(ctx context.Context, stream string) (streams.Usage, error) {
	if stream == streams.Partitions(2).Stream(0) {
		u.once.Do(func() { close(u.entered) })
		select {
		case <-u.release:
		case <-ctx.Done():
		}
		return streams.Usage{}, errors.New("slow, then gone")
	}
	<-ctx.Done()
	return streams.Usage{}, ctx.Err()
}

// TestGuardJudgesSuspectDuringReading: a suspect told while a reading's
// question hangs is judged as soon as that question returns, before the
// reading's next (which here never answers): it waits for one question,
// not for the whole reading, which takes seconds under a flood.
func TestGuardJudgesSuspectDuringReading(t *testing.T) {
	js, fe, wk := guardedLog(t)
	ctx := context.Background()
	store(t, fe, wk, "inflight", 10, true)
	f := &fleet{live: []string{"w1"}, quarantined: map[string]string{}}
	u := &stuckUsage{entered: make(chan struct{}), release: make(chan struct{})}
	g := runGuard(t, js, f, u, time.Millisecond, 2)
	<-u.entered // the reading's first question hangs
	tokens := streams.RequestTokens("inflight", 0, "w1")
	big, err := js.Publish(ctx, tokens, make([]byte, 200<<10))
	if err != nil {
		t.Fatal(err)
	}
	g.Suspect(streams.RequestsStream, tokens, big.Sequence, 200<<10)
	close(u.release)
	waitfor.Poll(t, "w1 quarantined, the reading's second question unanswered", func() bool { _, q := f.why("w1"); return q })
}

// TestGuardBoundsOwnAttempt: w1 serves a request of max_tokens 10 (an
// attempt's message may hold 64 KiB + 10 × 4 KiB + the prompt's ids) and
// writes four 200 KiB messages on its own attempt's subject (the partition
// grows fast): junk all the same (no reader folds a delta that large), w1
// is quarantined, and its sweep deletes them. Its attempt is then fenced
// (the request migrated to w2), and w1 writes three more there: deleted
// too. The request's 10 honest deltas stay.
func TestGuardBoundsOwnAttempt(t *testing.T) {
	js, fe, wk := guardedLog(t)
	ctx := context.Background()
	store(t, fe, wk, "inflight", 10, true)
	f := &fleet{live: []string{"w1", "w2"}, quarantined: map[string]string{}}
	guard(t, js, f, 20*time.Millisecond)
	tokens := streams.RequestTokens("inflight", 0, "w1")
	big := func(i int) {
		t.Helper()
		if _, err := js.Publish(ctx, tokens, make([]byte, 200<<10)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 4 {
		big(i)
	}
	waitfor.Poll(t, "w1 quarantined", func() bool { _, q := f.why("w1"); return q })
	if why, _ := f.why("w1"); !strings.Contains(why, "its own attempt 0") {
		t.Errorf("w1's quarantine: %q, want its own attempt named", why)
	}
	if _, q := f.why("w2"); q {
		t.Error("w2 quarantined")
	}
	natstest.Append(ctx, t, fe, streams.RequestEvents("inflight"), "m0", "inflight",
		events.RequestMigrated{RequestID: "inflight", FromAttempt: 0, FromWorker: "w1", Cut: 10, MigrationType: "resume", Reason: "worker lost", Frontend: "fe-1"})
	for i := range 3 {
		big(4 + i)
	}
	st, err := js.Stream(ctx, streams.RequestsStream)
	if err != nil {
		t.Fatal(err)
	}
	waitfor.Poll(t, "w1's large messages deleted", func() bool {
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(tokens))
		return err == nil && info.State.Subjects[tokens] == 10
	})
	for seq := uint64(1); ; seq++ {
		m, err := streams.NextOnSubject(ctx, js, streams.RequestsStream, tokens, seq)
		if err != nil || m == nil {
			break
		}
		if len(m.Data) >= 64<<10 {
			t.Errorf("a %d-byte message left at %d", len(m.Data), m.Sequence)
		}
		seq = m.Sequence
	}
}
