package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// outcome is what the fake log does with one append.
type outcome int

const (
	appendOK      outcome = iota
	appendFails           // nothing stored, the append fails (no leader)
	appendAckLost         // stored, but the append fails (the ack was lost)
)

// fakeLog stores appends in order, deduplicates the Nats-Msg-Id of those
// that carry one as JetStream does, and fails them as mode says.
type fakeLog struct {
	mode   outcome
	stored []events.TokensGenerated
	ids    map[string]bool
	tries  int
}

func (l *fakeLog) Envelope(id, subject string, ev events.Event) events.Envelope {
	return events.Envelope{ID: id, Subject: subject, Time: time.Now(), Event: ev}
}

func (l *fakeLog) append(m *nats.Msg) error {
	l.tries++
	if l.mode == appendFails {
		return jetstream.ErrNoStreamResponse
	}
	if id := m.Header.Get(events.HeaderMsgID); id == "" || !l.ids[id] {
		l.ids[id] = true
		l.stored = append(l.stored, decode(m).Event.(events.TokensGenerated))
	}
	if l.mode == appendAckLost {
		return jetstream.ErrAsyncPublishTimeout
	}
	return nil
}

// decode reads an encoded delta back, as a reader of the log would.
func decode(m *nats.Msg) events.Envelope {
	e, err := events.Unmarshal(events.Header(m.Header), m.Data)
	if err != nil {
		panic(fmt.Sprintf("a delta that does not decode: %v", err))
	}
	return e
}

func (l *fakeLog) AppendMsgAsync(m *nats.Msg) (jetstream.PubAckFuture, error) {
	f := &fakeFuture{ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	if err := l.append(m); err != nil {
		f.err <- err
	} else {
		f.ok <- &jetstream.PubAck{}
	}
	return f, nil
}

func (l *fakeLog) Append(ctx context.Context, subject string, e events.Envelope, expect int64) (uint64, error) {
	panic("deltas append only messages")
}

func (l *fakeLog) AppendMsg(_ context.Context, m *nats.Msg, _ int64) (uint64, error) {
	// Append retries a transient failure: the synchronous repair succeeds.
	if err := l.append(m); err != nil && !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
		return 0, err
	}
	return 0, nil
}

type fakeFuture struct {
	ok  chan *jetstream.PubAck
	err chan error
}

func (f *fakeFuture) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f *fakeFuture) Err() <-chan error            { return f.err }
func (f *fakeFuture) Msg() *nats.Msg               { return nil }

// readable is what a reader gets from the stored deltas in order: it accepts
// a delta only if it starts at or before the tokens it has (no gaps).
func readable(stored []events.TokensGenerated, start int) []string {
	var got []string
	for _, ev := range stored {
		have := start + len(got)
		if ev.Offset > have || ev.Offset+len(ev.Tokens) <= have {
			continue
		}
		got = append(got, ev.Tokens[have-ev.Offset:]...)
	}
	return got
}

// TestDeltasRepairBounded flushes one token per delta through append
// failures (elections with lost or no acks) and checks that a reader gets
// every token in order, and that the log stores at most twice the tokens.
func TestDeltasRepairBounded(t *testing.T) {
	const n = 400
	for _, tc := range []struct {
		name  string
		start int
		mode  func(i int) outcome // the log's behaviour when token i is flushed
		exact bool                // every token stored exactly once
	}{
		{name: "no failure", mode: func(int) outcome { return appendOK }, exact: true},
		{name: "one election", start: 7, exact: true, mode: func(i int) outcome {
			if i >= 50 && i < 150 {
				return appendFails
			}
			return appendOK
		}},
		{name: "elections every 40 tokens", exact: true, mode: func(i int) outcome {
			if i%40 >= 20 {
				return appendFails
			}
			return appendOK
		}},
		{name: "acks lost", mode: func(i int) outcome {
			switch {
			case i >= 30 && i < 60, i >= 200 && i < 260:
				return appendAckLost
			case i >= 60 && i < 120:
				return appendFails
			}
			return appendOK
		}},
		{name: "failing until the end", mode: func(i int) outcome {
			if i >= 300 {
				return appendFails
			}
			return appendOK
		}, exact: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := &fakeLog{ids: map[string]bool{}}
			d := newDeltas(log, "baton/worker/w1", "s", "r", 0, tc.start)
			clock := time.Now()
			for i := range n {
				log.mode = tc.mode(i)
				d.add(engine.Token{Text: fmt.Sprint(i)})
				d.flush()
				clock = clock.Add(time.Second) // past any backoff: the repair tries again
				d.poll(clock)
			}
			log.mode = appendOK
			if err := d.settle(context.Background()); err != nil {
				t.Fatalf("settle: %v", err)
			}
			got := readable(log.stored, tc.start)
			if len(got) != n {
				t.Fatalf("a reader gets %d tokens, want %d", len(got), n)
			}
			for i, tok := range got {
				if tok != fmt.Sprint(i) {
					t.Fatalf("token %d is %q, want %q", i, tok, fmt.Sprint(i))
				}
			}
			total := 0
			for _, ev := range log.stored {
				total += len(ev.Tokens)
			}
			t.Logf("%d tokens stored in %d deltas, %d appends tried", total, len(log.stored), log.tries)
			if total > 2*n || (tc.exact && total != n) {
				t.Errorf("the log stores %d tokens for %d; want at most %d (exactly %d: %v)", total, n, 2*n, n, tc.exact)
			}
		})
	}
}

// TestFlowWindowConfirms: the publish that fills the window returns only
// once the server has processed every publish before it; here that shows as
// all of them already delivered to a subscription of the same connection
// (the server answers the flush after delivering them, and the client reads
// in order).
func TestFlowWindowConfirms(t *testing.T) {
	s := natstest.Start(t)
	nc := s.Connect(t)
	sub, err := nc.SubscribeSync("fw.>")
	if err != nil {
		t.Fatal(err)
	}
	const window = 8
	w := newFlowWindow(nc, window)
	for round := 1; round <= 3; round++ {
		for i := range window {
			if err := w.publish(&nats.Msg{Subject: fmt.Sprintf("fw.%d", i), Data: []byte("x")}); err != nil {
				t.Fatal(err)
			}
		}
		if n, _, err := sub.Pending(); err != nil || n != round*window {
			t.Fatalf("after %d full windows, %d messages delivered (%v), want %d", round, n, err, round*window)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.out != 0 || w.flushing {
		t.Errorf("window out %d flushing %v after confirmed rounds, want 0 false", w.out, w.flushing)
	}
}

// BenchmarkDeltasFlush is the worker's cost of one single-token delta on the
// log, as the produce loop sends them at decode rates: encoded, appended
// asynchronously to a real JetStream, and its acknowledgement taken in by a
// later poll. The attempts take turns, each with about one append in
// flight, as 500 streams do on one worker. It reports the CPU time of this
// process per delta (cpu-ns/op, user and system).
//
// The JetStream is embedded (in memory), so its allocations and CPU count
// too, unless BATON_BENCH_NATS names a server (`baton nats`) to use: then
// the figures are the worker side's alone.
func BenchmarkDeltasFlush(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var nc *nats.Conn
	if url := os.Getenv("BATON_BENCH_NATS"); url != "" {
		var err error
		if nc, err = nats.Connect(url); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
	} else {
		nc = natstest.Start(b).Connect(b)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := streams.Provision(ctx, js, streams.Config{MemoryStorage: true, RequestPartitions: 1}); err != nil {
		b.Fatal(err)
	}
	log := streams.NewLog(js, "baton/worker/w1")
	const attempts = 64
	ds := make([]*deltas, attempts)
	run := time.Now().UnixNano() // a server kept between runs deduplicates ids it saw
	for i := range ds {
		id := fmt.Sprintf("bench-%d-%d", run, i)
		ds[i] = newDeltas(log, log.Source(), streams.RequestTokens(id, 0, "w1"), id, 0, 0)
	}
	i := 0
	cpu0 := processCPU(b)
	for b.Loop() {
		d := ds[i%attempts]
		d.add(engine.Token{Text: "tok", ID: i, HasID: true})
		d.idle()
		d.flush()
		i++
	}
	for _, d := range ds {
		if err := d.settle(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(i), "cpu-ns/op")
}

// processCPU is the CPU time this process used so far, user and system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestLogFuturesAnswerWithoutChannels: the log's futures have the Outcome
// method that deltas.poll reads them with (no channel per look); a future
// without it still works, at the price of two channels.
func TestLogFuturesAnswerWithoutChannels(t *testing.T) {
	s := natstest.Start(t)
	log := streams.NewLog(s.Provision(t), "baton/worker/w1")
	d := newDeltas(log, log.Source(), streams.RequestTokens("r", 0, "w1"), "r", 0, 0)
	d.add(engine.Token{Text: "a"})
	d.flush()
	if _, ok := d.sent[0].future.(interface{ Outcome() (bool, error) }); !ok {
		t.Errorf("the log's future %T has no Outcome method: deltas.poll falls back to channels", d.sent[0].future)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.settle(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSentQueueReusesItsArray: appends queued and taken in, a few at a
// time, in order, through many wraps of the queue's array, allocate nothing
// once the array is made.
func TestSentQueueReusesItsArray(t *testing.T) {
	d := &deltas{}
	next, want := 0, 0
	step := func() { // 30 appends, 3 at a time, one left in flight
		for range 10 {
			for range 3 {
				d.pushSent(sentDelta{offset: next})
				next++
			}
			for len(d.sent) > 1 {
				if got := d.sent[0].offset; got != want {
					t.Fatalf("took in offset %d, want %d", got, want)
				}
				d.popSent()
				want++
			}
		}
	}
	step()
	if allocs := testing.AllocsPerRun(100, step); allocs != 0 {
		t.Errorf("%v allocations per 30 appends, want 0", allocs)
	}
	if len(d.sentArr) > 8 {
		t.Errorf("the array grew to %d for a queue of at most 4", len(d.sentArr))
	}
}

// headerLog is a fakeLog that keeps a copy of each message's headers as it
// was appended.
type headerLog struct {
	fakeLog
	sent []nats.Header
}

func (l *headerLog) AppendMsgAsync(m *nats.Msg) (jetstream.PubAckFuture, error) {
	h := nats.Header{}
	for k, v := range m.Header {
		h[k] = append([]string(nil), v...)
	}
	l.sent = append(l.sent, h)
	return l.fakeLog.AppendMsgAsync(m)
}

// TestDeltasReuseHeaders: each delta is encoded into the header map of the
// one before it; every one still goes out with its own headers alone (the
// first delta's upstream TTFT on it only).
func TestDeltasReuseHeaders(t *testing.T) {
	log := &headerLog{fakeLog: fakeLog{ids: map[string]bool{}}}
	d := newDeltas(log, "baton/worker/w1", "s", "r", 0, 5)
	for i := range 3 {
		d.add(engine.Token{Text: fmt.Sprint(i)})
		d.flush()
		d.poll(time.Now())
	}
	if len(log.sent) != 3 {
		t.Fatalf("%d deltas sent, want 3", len(log.sent))
	}
	for i, h := range log.sent {
		if got, want := h.Get(events.HeaderOffset), fmt.Sprint(5+i); got != want {
			t.Errorf("delta %d: %s %q, want %q", i, events.HeaderOffset, got, want)
		}
		if got, want := h.Get(streams.HeaderUpstreamTTFT) != "", i == 0; got != want {
			t.Errorf("delta %d: has %s %v, want %v", i, streams.HeaderUpstreamTTFT, got, want)
		}
	}
	if !reflect.DeepEqual(readable(log.stored, 5), []string{"0", "1", "2"}) {
		t.Errorf("a reader gets %q, want [0 1 2]", readable(log.stored, 5))
	}
}

// TestDeltasMsgIDOnlyWhereRetried: a delta's first asynchronous append,
// never sent again, goes without a Nats-Msg-Id (JetStream keeps no
// deduplication entry for it); a repair, tried again under one id until it
// is stored, carries its id on every try, so that a try whose ack was lost
// and the next store it once.
func TestDeltasMsgIDOnlyWhereRetried(t *testing.T) {
	log := &headerLog{fakeLog: fakeLog{ids: map[string]bool{}}}
	d := newDeltas(log, "baton/worker/w1", "s", "r", 0, 0)
	clock := time.Now()
	for i, mode := range []outcome{appendOK, appendAckLost, appendAckLost, appendOK, appendOK} {
		log.mode = mode
		d.add(engine.Token{Text: fmt.Sprint(i)})
		d.flush()
		clock = clock.Add(time.Second)
		d.poll(clock)
	}
	log.mode = appendOK
	if err := d.settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	originals, repairs := 0, map[string]int{}
	for i, h := range log.sent {
		id := h.Get(events.HeaderMsgID)
		switch {
		case id == "":
			originals++
		case id != h.Get(events.HeaderID):
			t.Errorf("append %d: %s %q is not its ce-id %q", i, events.HeaderMsgID, id, h.Get(events.HeaderID))
		default:
			repairs[id]++
		}
	}
	// Token 0 and 1 each in its own delta; 1's ack is lost, so its repair
	// is tried until stored (three tries, two acks lost) while 2-4 wait,
	// and then go in one delta.
	if originals != 3 {
		t.Errorf("%d appends without %s, want the 3 originals", originals, events.HeaderMsgID)
	}
	tried := 0
	for _, n := range repairs {
		tried += n
	}
	if len(repairs) != 1 || tried != 3 {
		t.Errorf("repairs %v: want one, tried three times under its id", repairs)
	}
	if len(log.stored) != 4 {
		t.Errorf("%d deltas stored, want 4: the originals and the repair once", len(log.stored))
	}
	if got := readable(log.stored, 0); !reflect.DeepEqual(got, []string{"0", "1", "2", "3", "4"}) {
		t.Errorf("a reader gets %q", got)
	}
}
