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
	"github.com/baton-dev/baton/internal/waitfor"
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
		natstest.Append(ctx, t, log, subj, evid, id, ev)
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

// smallLog is a server with a 200 KB request stream in memory, one
// partition, and the logs of the frontend and the worker that store there.
type smallLog struct {
	t      *testing.T
	js     jetstream.JetStream
	fe, wk *streams.Log
}

func newSmallLog(t *testing.T) *smallLog {
	t.Helper()
	js := natstest.Start(t).JetStream(t)
	if _, err := streams.Provision(context.Background(), js, streams.Config{MemoryStorage: true, RequestsMaxBytes: 200_000}); err != nil {
		t.Fatal(err)
	}
	fe, wk := logs(t, js)
	return &smallLog{t: t, js: js, fe: fe, wk: wk}
}

// ratio is how full the request stream is.
func (l *smallLog) ratio() float64 {
	l.t.Helper()
	u, err := streams.ReadUsage(context.Background(), l.js, streams.RequestsStream)
	if err != nil {
		l.t.Fatal(err)
	}
	return u.Ratio()
}

// present reports whether request id is still in the log.
func (l *smallLog) present(id string) bool {
	for _, err := range streams.ReadRequest(context.Background(), l.js, 1, id, 1) {
		return err == nil
	}
	return false
}

// monitor is a Monitor of the log that refuses new requests above 0.9 and
// reads every 10 ms; it does not run yet.
func (l *smallLog) monitor() *retention.Monitor {
	l.t.Helper()
	m, err := retention.NewMonitor(l.js, prometheus.NewRegistry(), slog.New(slog.DiscardHandler), retention.Config{HighWater: 0.9, Interval: 10 * time.Millisecond})
	if err != nil {
		l.t.Fatal(err)
	}
	m.SetPartitions(1)
	return m
}

// runMonitor runs m until stop, which fails the test unless Run returned nil;
// a test that ends before stop stops it too.
func runMonitor(t *testing.T, m *retention.Monitor) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
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
		natstest.Append(ctx, t, fe, plan.Subject, events.ID(id, "carried", i), id, ev)
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
	l := newSmallLog(t)
	fe, wk, present := l.fe, l.wk, l.present
	store(t, fe, wk, "inflight", 30, true)
	var finished []string
	for i := 0; l.ratio() <= 0.85; i++ {
		id := fmt.Sprintf("done-%03d", i)
		store(t, fe, wk, id, 20, false)
		finished = append(finished, id)
	}
	m := l.monitor()
	if err := m.Admit("anything"); err != nil {
		t.Fatalf("admission before any reading: %v", err)
	}
	stop := runMonitor(t, m)
	waitfor.Poll(t, "the stream below 0.7 of its size", func() bool { return l.ratio() < 0.7 })
	stop()
	if !present("inflight") {
		t.Fatal("the request in flight was evicted")
	}
	r, _, _ := retention.Read(context.Background(), fe, 1, "inflight")
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
	if r := l.ratio(); r >= 0.7 {
		t.Errorf("usage %.2f after eviction, want below 0.7", r)
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
		natstest.Append(ctx, t, log, subj, evid, ev.(interface{ Request() string }).Request(), ev)
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
