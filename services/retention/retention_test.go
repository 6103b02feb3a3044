package retention_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/retention"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// store appends a request's history as a frontend and a worker would: the
// accepted and routed decisions, tokens deltas of attempt 0 (n tokens), and
// the completion unless running.
func store(t *testing.T, fe, wk *streams.Log, id string, n int, running bool) {
	t.Helper()
	ctx := context.Background()
	app := func(log *streams.Log, subj string, evid string, ev events.Event) {
		t.Helper()
		if _, err := log.Append(ctx, subj, log.Envelope(evid, id, ev), -1); err != nil {
			t.Fatalf("append %s: %v", ev.EventType(), err)
		}
	}
	app(fe, streams.RequestEvents(id), events.ID(id, "accepted"), events.RequestAccepted{RequestID: id, Model: "mock",
		Endpoint: events.EndpointCompletions, Prompt: "p", PromptTokens: 1, MaxTokens: n, Frontend: "fe-1"})
	app(fe, streams.RequestEvents(id), events.ID(id, "routed", 0), events.RequestRouted{RequestID: id, Attempt: 0, WorkerID: "w1"})
	tokens := streams.RequestTokens(id, 0, "w1")
	for i := range n {
		app(wk, tokens, events.ID(id, 0, i), events.TokensGenerated{RequestID: id, Attempt: 0, Offset: i,
			Tokens: []string{fmt.Sprintf("t%d ", i)}, IDs: []int{i}})
	}
	if !running {
		app(wk, tokens, events.ID(id, 0, "completed"), events.RequestCompleted{RequestID: id, Attempt: 0, FinishReason: "length", CompletionTokens: n})
	}
}

func logs(t *testing.T, js jetstream.JetStream) (fe, wk *streams.Log) {
	return streams.NewLog(js, "baton/frontend/fe-1"), streams.NewLog(js, "baton/worker/w1")
}

// state is what every reader renders of a request.
func state(r *projections.Request) string {
	ids, _ := r.TokenIDs()
	return fmt.Sprintf("%s %s %q %v %+v %d", r.Status, r.FinishReason, r.Text(), ids, r.Attempts, r.PromptTokens())
}

// TestCompactionRaces: two frontends compact one request at once while a
// reader folds it over and over: one record is stored, the deltas are
// gone, and every read folds to the state of the full history.
func TestCompactionRaces(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.Provision(t)
	fe, wk := logs(t, js)
	const id = "race-1"
	store(t, fe, wk, id, 400, false)
	full, _, err := retention.Read(context.Background(), fe, 1, id)
	if err != nil {
		t.Fatal(err)
	}
	want := state(full)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = retention.CompactFromLog(ctx, fe, 1, id)
		}()
	}
	stop := make(chan struct{})
	var reads int
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			r, _, err := retention.Read(ctx, fe, 1, id)
			if err != nil {
				t.Errorf("read during compaction: %v", err)
				return
			}
			if got := state(r); got != want {
				t.Errorf("a read during compaction folded\n %s\nwant %s", got, want)
				return
			}
			reads++
		}
	}()
	wg.Wait()
	close(stop)
	<-readerDone
	for i, err := range errs {
		if err != nil {
			t.Errorf("compactor %d: %v", i, err)
		}
	}
	var records, deltas int
	for e, err := range streams.ReadRequest(ctx, js, 1, id, 1) {
		if err != nil {
			t.Fatal(err)
		}
		switch e.Event.(type) {
		case events.RequestCompacted:
			records++
		case events.TokensGenerated, events.RequestCompleted:
			if !strings.HasPrefix(e.ID, id+".carried") {
				deltas++
			}
		}
	}
	if records != 1 || deltas != 0 {
		t.Errorf("after two compactions: %d records and %d deltas, want 1 and 0", records, deltas)
	}
	after, _, _ := retention.Read(ctx, fe, 1, id)
	if got := state(after); got != want || !after.Compacted() {
		t.Errorf("after compaction: %s (compacted %v), want %s", got, after.Compacted(), want)
	}
	old := foldWithout(t, js, id, events.TypeRequestCompacted)
	if old.Text() != full.Text() || old.Status != full.Status || old.FinishReason != full.FinishReason {
		t.Errorf("a reader that predates compact records folds %s %q %q, want %s %q %q",
			old.Status, old.Text(), old.FinishReason, full.Status, full.Text(), full.FinishReason)
	}
	t.Logf("%d reads during compaction", reads)
}

// TestCompactionLeavesAnEarlierCarry: a compaction stored its carry and
// then lost the race for the record (here: its record expects a sequence
// that has passed); a second compaction reads the request with that carry
// in it and stores its record. The record covers the history but not the
// carry (its Through stops before it), so its purge leaves the carry, and
// a reader that predates compact records still folds the whole answer.
// (Two frontends compacting at once met this now and then:
// TestCompactionRaces.)
func TestCompactionLeavesAnEarlierCarry(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.Provision(t)
	fe, wk := logs(t, js)
	ctx := context.Background()
	const id = "carry-race"
	store(t, fe, wk, id, 50, false)
	first, seq, err := retention.Read(ctx, fe, 1, id)
	if err != nil {
		t.Fatal(err)
	}
	want := state(first)
	plan, err := retention.Record(first)
	if err != nil || plan == nil || plan.Subject == "" {
		t.Fatalf("first compaction's plan: %+v, %v", plan, err)
	}
	if err := retention.Compact(ctx, fe, 1, id, plan, retention.Subjects(first), seq-1, 0, nil); !errors.Is(err, streams.ErrConflict) {
		t.Fatalf("first compaction, its record expecting a sequence passed: %v, want a conflict after its carry", err)
	}
	if err := retention.CompactFromLog(ctx, fe, 1, id); err != nil {
		t.Fatal(err)
	}
	after, _, err := retention.Read(ctx, fe, 1, id)
	if err != nil || state(after) != want || !after.Compacted() {
		t.Fatalf("after the second compaction: %v, %s (compacted %v), want %s", err, state(after), after.Compacted(), want)
	}
	old := foldWithout(t, js, id, events.TypeRequestCompacted)
	if old.Text() != first.Text() || old.Status != first.Status {
		t.Errorf("a reader that predates compact records folds %s %q, want %s %q", old.Status, old.Text(), first.Status, first.Text())
	}
}

// foldWithout folds request id from the log as a reader that does not know
// event type typ (an earlier release) does: skipping it.
func foldWithout(t *testing.T, js jetstream.JetStream, id, typ string) *projections.Request {
	t.Helper()
	r := projections.NewRequest()
	for e, err := range streams.ReadRequest(context.Background(), js, 1, id, 1) {
		if err != nil {
			t.Fatal(err)
		}
		if e.Type() != typ {
			r.Apply(e)
		}
	}
	return r
}

// TestCompactionInterruptedIsFinished: a frontend that stored the record and
// died before the purge leaves a request that reads the same; the next
// compaction only purges.
func TestCompactionInterruptedIsFinished(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.Provision(t)
	fe, wk := logs(t, js)
	const id = "crash-1"
	store(t, fe, wk, id, 20, false)
	ctx := context.Background()
	r, seq, err := retention.Read(ctx, fe, 1, id)
	if err != nil {
		t.Fatal(err)
	}
	want := state(r)
	plan, err := retention.Record(r)
	if err != nil {
		t.Fatal(err)
	}
	// The carry and the record, and no purge: the frontend died here.
	for i, ev := range plan.Carry {
		if _, err := fe.Append(ctx, plan.Subject, fe.Envelope(events.ID(id, "carried", i), id, ev), -1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := fe.Append(ctx, streams.RequestEvents(id), fe.Envelope(events.ID(id, "compacted"), id, plan.Record), int64(seq)); err != nil {
		t.Fatal(err)
	}
	mid, _, _ := retention.Read(ctx, fe, 1, id)
	if got := state(mid); got != want {
		t.Fatalf("between record and purge: %s, want %s", got, want)
	}
	if err := retention.CompactFromLog(ctx, fe, 1, id); err != nil {
		t.Fatal(err)
	}
	after, _, _ := retention.Read(ctx, fe, 1, id)
	if got := state(after); got != want {
		t.Fatalf("after the purge: %s, want %s", got, want)
	}
	if u, _ := streams.ReadUsage(ctx, js, streams.RequestsStream); u.Msgs != 5 {
		t.Errorf("%d messages left, want 5 (accepted, routed, the carried delta and completion, the record)", u.Msgs)
	}
	if old := foldWithout(t, js, id, events.TypeRequestCompacted); old.Text() != r.Text() || old.Status != r.Status {
		t.Errorf("a reader that predates compact records folds %s %q, want %s %q", old.Status, old.Text(), r.Status, r.Text())
	}
	// A request still running is refused.
	store(t, fe, wk, "running-1", 5, true)
	if err := retention.CompactFromLog(ctx, fe, 1, "running-1"); err == nil || !strings.Contains(err.Error(), "not finished") {
		t.Errorf("compaction of a running request: %v, want not finished", err)
	}
}

// TestEvictionOldestFinishedFirst fills a small request stream with
// finished requests, one request in flight at the head, and a message on a
// malformed subject: the monitor evicts finished requests from the oldest
// on, and the malformed subject, until the stream is below its band, and
// keeps the request in flight whole.
func TestEvictionOldestFinishedFirst(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.JetStream(t)
	ctx := context.Background()
	if _, err := streams.Provision(ctx, js, streams.Config{MemoryStorage: true, RequestsMaxBytes: 200_000}); err != nil {
		t.Fatal(err)
	}
	fe, wk := logs(t, js)
	store(t, fe, wk, "inflight", 30, true)
	var finished []string
	for i := 0; ; i++ {
		u, err := streams.ReadUsage(ctx, js, streams.RequestsStream)
		if err != nil {
			t.Fatal(err)
		}
		if u.Ratio() > 0.85 {
			break
		}
		id := fmt.Sprintf("done-%03d", i)
		store(t, fe, wk, id, 20, false)
		finished = append(finished, id)
	}
	m, err := retention.NewMonitor(js, prometheus.NewRegistry(), slog.New(slog.DiscardHandler), retention.Config{HighWater: 0.9, Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m.SetPartitions(1)
	if err := m.Admit("anything"); err != nil {
		t.Fatalf("admission before any reading: %v", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Run(rctx) }()
	eventually(t, "the stream below 0.7 of its size", func() bool {
		u, err := streams.ReadUsage(ctx, js, streams.RequestsStream)
		if err != nil {
			t.Fatal(err)
		}
		return u.Ratio() < 0.7
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	present := func(id string) bool {
		for _, err := range streams.ReadRequest(ctx, js, 1, id, 1) {
			return err == nil
		}
		return false
	}
	if !present("inflight") {
		t.Fatal("the request in flight was evicted")
	}
	r, _, _ := retention.Read(ctx, fe, 1, "inflight")
	if r.Len() != 30 {
		t.Errorf("the request in flight has %d tokens left, want 30", r.Len())
	}
	// Oldest first: a prefix of the finished requests is gone, the rest remain.
	gone := 0
	for gone < len(finished) && !present(finished[gone]) {
		gone++
	}
	for _, id := range finished[gone:] {
		if !present(id) {
			t.Errorf("%s was evicted before an older one was", id)
		}
	}
	if gone == 0 || gone == len(finished) {
		t.Errorf("%d of %d finished requests evicted, want some, oldest first", gone, len(finished))
	}
	if u, _ := streams.ReadUsage(ctx, js, "BATON_REQUESTS"); u.Ratio() >= 0.7 {
		t.Errorf("usage %.2f after eviction, want below 0.7", u.Ratio())
	}
}

// eventually waits up to 10 s for cond, which another goroutine (the
// monitor) makes true: a stream has no event for what a purge removed, so
// it is asked every few milliseconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

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

// guard runs a Monitor of the one-partition log guarding f's workers,
// reading every interval, until the test ends.
func guard(t *testing.T, js jetstream.JetStream, f *fleet, interval time.Duration) {
	t.Helper()
	m, err := retention.NewMonitor(js, prometheus.NewRegistry(), slog.New(slog.DiscardHandler), retention.Config{Interval: interval})
	if err != nil {
		t.Fatal(err)
	}
	m.SetPartitions(1)
	m.SetFleet(f)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
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
		eventually(t, what+" ("+subject+") purged", func() bool {
			_, err := st.GetLastMsgForSubject(ctx, subject)
			return err != nil
		})
	}

	// Each worker is looked at once (a reading each, in turn) before w1
	// comes back from a partition during which its request migrated away
	// and ended: its connection sends the deltas it buffered, on its own
	// attempt's subject, after the end: more than junkMany of them, written
	// since the guard last looked at w1.
	eventually(t, "every worker looked at", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.asked > 2*len(f.live)
	})
	late := streams.RequestTokens("done-07", 0, "w1")
	for i := range 200 {
		if _, err := wk.Append(ctx, late, wk.Envelope(fmt.Sprint("late-", i), "done-07", events.TokensGenerated{RequestID: "done-07", Offset: 5 + i, Tokens: []string{"late "}}), -1); err != nil {
			t.Fatal(err)
		}
	}
	waitGone("w1's late deltas", late)
	malformed := "baton.requests.0.junk.tokens.0.w1" // slot 0 is not junk's: no reader folds it
	if _, err := wk.Append(ctx, malformed, wk.Envelope("malformed", "junk", events.TokensGenerated{RequestID: "junk", Tokens: []string{"x"}}), -1); err != nil {
		t.Fatal(err)
	}
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
	eventually(t, "the guard's first reading", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.asked > 0
	})
	tokens := streams.RequestTokens("inflight", 0, "w1")
	delta := func(i int) {
		t.Helper()
		if _, err := wk.Append(ctx, tokens, wk.Envelope(fmt.Sprint("d-", i), "inflight", events.TokensGenerated{RequestID: "inflight", Offset: i, Tokens: []string{fmt.Sprintf("t%d ", i)}, IDs: []int{i}}), -1); err != nil {
			t.Fatal(err)
		}
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
	eventually(t, "w1's junk purged", func() bool {
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

// TestCompactionPurgesEveryAttempt: a request that migrated has a tokens
// subject per attempt, and compaction purges each one (one literal purge a
// subject, streams.PurgeSubjectsThrough), leaving the carry, the other
// requests interleaved with it untouched, and a fold of the same state.
func TestCompactionPurgesEveryAttempt(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.Provision(t)
	fe, wk := logs(t, js)
	w2 := streams.NewLog(js, "baton/worker/w2")
	ctx := context.Background()
	const id, other = "moved-1", "beside-1"
	app := func(log *streams.Log, subj, evid string, ev events.Event) {
		t.Helper()
		if _, err := log.Append(ctx, subj, log.Envelope(evid, ev.(interface{ Request() string }).Request(), ev), -1); err != nil {
			t.Fatalf("append %s: %v", ev.EventType(), err)
		}
	}
	store(t, fe, wk, other, 0, true) // accepted and routed; its deltas come between the moved one's
	app(fe, streams.RequestEvents(id), events.ID(id, "accepted"), events.RequestAccepted{RequestID: id, Model: "mock",
		Endpoint: events.EndpointCompletions, Prompt: "p", PromptTokens: 1, MaxTokens: 10, Frontend: "fe-1"})
	app(fe, streams.RequestEvents(id), events.ID(id, "routed", 0), events.RequestRouted{RequestID: id, Attempt: 0, WorkerID: "w1"})
	for i := range 10 {
		if i == 5 { // attempt 0 fenced, attempt 1 on w2 from offset 5
			app(fe, streams.RequestTokens(id, 0, "w1"), events.ID(id, 0, "fenced"), events.AttemptFailed{RequestID: id, Attempt: 0, WorkerID: "w1", Offset: 5, Reason: "lost"})
			app(fe, streams.RequestEvents(id), events.ID(id, "routed", 1), events.RequestRouted{RequestID: id, Attempt: 1, WorkerID: "w2", StartOffset: 5})
		}
		k, log, w := 0, wk, "w1"
		if i >= 5 {
			k, log, w = 1, w2, "w2"
		}
		app(log, streams.RequestTokens(id, k, w), events.ID(id, k, i), events.TokensGenerated{RequestID: id, Attempt: k, Offset: i,
			Tokens: []string{fmt.Sprintf("t%d ", i)}, IDs: []int{i}})
		app(wk, streams.RequestTokens(other, 0, "w1"), events.ID(other, 0, i), events.TokensGenerated{RequestID: other, Attempt: 0, Offset: i,
			Tokens: []string{fmt.Sprintf("o%d ", i)}, IDs: []int{i}})
	}
	app(w2, streams.RequestTokens(id, 1, "w2"), events.ID(id, 1, "completed"), events.RequestCompleted{RequestID: id, Attempt: 1, FinishReason: "length", CompletionTokens: 10})
	full, _, err := retention.Read(ctx, fe, 1, id)
	if err != nil {
		t.Fatal(err)
	}
	beside, _, err := retention.Read(ctx, fe, 1, other)
	if err != nil {
		t.Fatal(err)
	}
	if got := retention.Subjects(full); !slices.Equal(got, []string{streams.RequestTokens(id, 0, "w1"), streams.RequestTokens(id, 1, "w2")}) {
		t.Fatalf("subjects of a request in two attempts: %q", got)
	}
	if err := retention.CompactFromLog(ctx, fe, 1, id); err != nil {
		t.Fatal(err)
	}
	left := map[string]int{}
	for e, err := range streams.ReadRequest(ctx, js, 1, id, 1) {
		if err != nil {
			t.Fatal(err)
		}
		if e.Stored != streams.RequestEvents(id) {
			left[e.Stored+" "+e.ID]++
		}
	}
	want := map[string]int{
		streams.RequestTokens(id, 1, "w2") + " " + events.ID(id, "carried", 0): 1,
		streams.RequestTokens(id, 1, "w2") + " " + events.ID(id, "carried", 1): 1,
	}
	if !maps.Equal(left, want) {
		t.Errorf("tokens subjects after compaction hold %v, want only the carry %v", left, want)
	}
	after, _, _ := retention.Read(ctx, fe, 1, id)
	if got := state(after); got != state(full) || !after.Compacted() {
		t.Errorf("after compaction: %s (compacted %v), want %s", got, after.Compacted(), state(full))
	}
	if again, _, _ := retention.Read(ctx, fe, 1, other); state(again) != state(beside) || again.Text() != "o0 o1 o2 o3 o4 o5 o6 o7 o8 o9 " {
		t.Errorf("the request beside it: %s, want %s", state(again), state(beside))
	}
}
