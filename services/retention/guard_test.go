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
func guard(t *testing.T, js jetstream.JetStream, f *fleet, interval time.Duration) {
	t.Helper()
	reg, log := prometheus.NewRegistry(), slog.New(slog.DiscardHandler)
	m, err := retention.NewMonitor(js, reg, log, retention.Config{Interval: interval})
	if err != nil {
		t.Fatal(err)
	}
	g, err := retention.NewGuard(js, m, reg, log, retention.GuardConfig{Interval: interval})
	if err != nil {
		t.Fatal(err)
	}
	m.SetPartitions(1)
	g.SetPartitions(1)
	g.SetFleet(f)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- m.Run(ctx) }()
	go func() { done <- g.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Error(err)
			}
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

// TestGuardReadingsAreAdmissions: a Guard reads through a Monitor, which
// does not run here: once the guard (with no fleet to check) has read a
// partition above the high-water mark, the Monitor refuses new requests
// there, and Run returns nil when its context ends.
func TestGuardReadingsAreAdmissions(t *testing.T) {
	js := natstest.Start(t).JetStream(t)
	ctx := context.Background()
	if _, err := streams.Provision(ctx, js, streams.Config{MemoryStorage: true, RequestsMaxBytes: 200_000}); err != nil {
		t.Fatal(err)
	}
	fe, wk := logs(t, js)
	for i := 0; ; i++ {
		u, err := streams.ReadUsage(ctx, js, streams.RequestsStream)
		if err != nil {
			t.Fatal(err)
		}
		if u.Ratio() > 0.92 {
			break
		}
		store(t, fe, wk, fmt.Sprintf("done-%03d", i), 20, false)
	}
	reg, log := prometheus.NewRegistry(), slog.New(slog.DiscardHandler)
	m, err := retention.NewMonitor(js, reg, log, retention.Config{HighWater: 0.9})
	if err != nil {
		t.Fatal(err)
	}
	g, err := retention.NewGuard(js, m, reg, log, retention.GuardConfig{Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m.SetPartitions(1)
	g.SetPartitions(1)
	if err := m.Admit("anything"); err != nil {
		t.Fatalf("admission before any reading: %v", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run(rctx) }()
	eventually(t, "admission refused from the guard's reading", func() bool {
		return errors.Is(m.Admit("anything"), retention.ErrLogFull)
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after its context ended: %v, want nil", err)
	}
}
