package streams_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// readAll reads request id from the log, failing the test on error.
func readAll(t *testing.T, ctx context.Context, js jetstream.JetStream, id string, from uint64) []events.Envelope {
	t.Helper()
	var out []events.Envelope
	for e, err := range streams.ReadRequest(ctx, js, 1, id, from) {
		if err != nil {
			t.Fatalf("read %s: %v", id, err)
		}
		out = append(out, e)
	}
	return out
}

// TestLiveFoldEqualsReplay proves invariant 1: a projection folded from the
// republished live messages equals one folded from the stored log.
func TestLiveFoldEqualsReplay(t *testing.T) {
	s := natstest.Start(t)
	js := s.Provision(t)
	nc := s.Connect(t)
	ctx := testCtx(t)
	const id = "req-1"
	sub, err := nc.SubscribeSync(streams.RequestLive(id))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil { // the subscription is in place before the first append
		t.Fatal(err)
	}
	fe := streams.NewLog(js, "baton/frontend/fe-1")
	wk := [2]*streams.Log{streams.NewLog(js, "baton/worker/w1"), streams.NewLog(js, "baton/worker/w2")}
	tokens := func(k, offset int, toks ...string) events.TokensGenerated {
		return events.TokensGenerated{RequestID: id, Attempt: k, Offset: offset, Tokens: toks}
	}
	type step struct {
		log     *streams.Log
		subject string
		ev      events.Event
		evID    string
	}
	evSubj := streams.RequestEvents(id)
	history := []step{
		{fe, evSubj, events.RequestAccepted{RequestID: id, Model: "mock", Endpoint: events.EndpointChat, Prompt: "hi", PromptTokens: 1, MaxTokens: 32, Stream: true, Frontend: "fe-1"}, "accepted"},
		{fe, evSubj, events.RequestRouted{RequestID: id, Attempt: 0, WorkerID: "w1", StartOffset: 0}, "routed.0"},
		{wk[0], streams.RequestTokens(id, 0, "w1"), tokens(0, 0, "The", " quick"), events.ID(id, 0, 0)},
		{wk[0], streams.RequestTokens(id, 0, "w1"), tokens(0, 2, " brown"), events.ID(id, 0, 2)},
		{wk[0], streams.RequestTokens(id, 0, "w1"), tokens(0, 2, " brown"), events.ID(id, 0, 2)}, // retried append: deduplicated
		{wk[0], streams.RequestTokens(id, 0, "w1"), tokens(0, 3, " fox"), events.ID(id, 0, 3)},
		{fe, streams.RequestTokens(id, 0, "w1"), events.AttemptFailed{RequestID: id, Attempt: 0, WorkerID: "w1", Offset: 4, Reason: "lease lost"}, "fence.0"},
		{wk[0], streams.RequestTokens(id, 0, "w1"), tokens(0, 4, " ZOMBIE"), events.ID(id, 0, 4)},
		{fe, evSubj, events.RequestMigrated{RequestID: id, FromAttempt: 0, FromWorker: "w1", Cut: 4, MigrationType: events.MigrationOngoingRequest, Reason: "lease lost", Frontend: "fe-1"}, "migrated.0"},
		{fe, evSubj, events.RequestRouted{RequestID: id, Attempt: 1, WorkerID: "w2", StartOffset: 4}, "routed.1"},
		{wk[1], streams.RequestTokens(id, 1, "w2"), tokens(1, 4, " jumps", " over"), events.ID(id, 1, 4)},
		{wk[1], streams.RequestTokens(id, 1, "w2"), tokens(1, 6, " the", " lazy", " dog"), events.ID(id, 1, 6)},
		{wk[1], streams.RequestTokens(id, 1, "w2"), events.RequestCompleted{RequestID: id, Attempt: 1, FinishReason: "stop", PromptTokens: 1, CompletionTokens: 9}, "completed.1"},
	}
	stored := map[uint64]bool{}
	for i, st := range history {
		seq, err := st.log.Append(ctx, st.subject, st.log.Envelope(st.evID, id, st.ev), -1)
		if err != nil {
			t.Fatalf("append #%d %s: %v", i, st.ev.EventType(), err)
		}
		stored[seq] = true
	}
	if got, want := len(stored), len(history)-1; got != want {
		t.Fatalf("got %d stored messages, want %d (one retry deduplicated)", got, want)
	}

	live := projections.NewRequest()
	for range stored {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("live message: %v", err)
		}
		e, err := streams.Decode(m)
		if err != nil {
			t.Fatalf("decode live %s: %v", m.Subject, err)
		}
		if !stored[e.Seq] {
			t.Errorf("live message seq %d was not acknowledged as stored", e.Seq)
		}
		live.Apply(e)
	}
	replay := projections.NewRequest()
	for _, e := range readAll(t, ctx, js, id, 1) {
		replay.Apply(e)
	}
	if !reflect.DeepEqual(live, replay) {
		t.Errorf("live and replayed projections differ:\n live %+v\nreplay %+v", live, replay)
	}
	if got, want := replay.Text(), "The quick brown fox jumps over the lazy dog"; got != want {
		t.Errorf("got text %q, want %q", got, want)
	}
	if replay.Status != projections.StatusCompleted || replay.Skipped != 0 || len(replay.Attempts) != 2 {
		t.Errorf("got status %s skipped %d attempts %d, want completed, 0, 2", replay.Status, replay.Skipped, len(replay.Attempts))
	}
}

func TestReadRequestNotFound(t *testing.T) {
	s := natstest.Start(t)
	js := s.Provision(t)
	ctx := testCtx(t)
	log := streams.NewLog(js, "test")
	natstest.Append(ctx, t, log, streams.RequestEvents("other"), "x", "other", events.RequestAttached{RequestID: "other", Frontend: "fe"})
	for _, tt := range []struct {
		name string
		id   string
		from uint64
	}{{"unknown id", "nobody", 1}, {"past the end", "other", 2}} {
		t.Run(tt.name, func(t *testing.T) {
			var n int
			var last error
			for _, err := range streams.ReadRequest(ctx, js, 1, tt.id, tt.from) {
				n++
				last = err
			}
			if n != 1 || !errors.Is(last, streams.ErrNotFound) {
				t.Errorf("got %d items, last err %v, want one ErrNotFound", n, last)
			}
		})
	}
}

// TestReadRequestAcrossBatches reads a history longer than one batch direct
// get (1000 messages), interleaved with another request's messages.
func TestReadRequestAcrossBatches(t *testing.T) {
	s := natstest.Start(t)
	js := s.Provision(t)
	ctx := testCtx(t)
	log := streams.NewLog(js, "test")
	const n = 2345
	var futures []jetstream.PubAckFuture
	for i := range n {
		f, err := log.AppendAsync(streams.RequestTokens("big", 0, "w1"), log.Envelope(events.ID("big", 0, i), "big",
			events.TokensGenerated{RequestID: "big", Offset: i, Tokens: []string{fmt.Sprint(i % 10)}}))
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
		if i%3 == 0 {
			f, err := log.AppendAsync(streams.RequestTokens("noise", 0, "w1"), log.Envelope(events.ID("noise", 0, i), "noise",
				events.TokensGenerated{RequestID: "noise", Offset: i, Tokens: []string{"x"}}))
			if err != nil {
				t.Fatal(err)
			}
			futures = append(futures, f)
		}
	}
	acked(t, ctx, futures)

	got := readAll(t, ctx, js, "big", 1)
	if len(got) != n {
		t.Fatalf("read %d events, want %d", len(got), n)
	}
	for i, e := range got {
		if off := e.Event.(events.TokensGenerated).Offset; off != i {
			t.Fatalf("event %d: got offset %d, want %d", i, off, i)
		}
		if i > 0 && e.Seq <= got[i-1].Seq {
			t.Fatalf("event %d: seq %d not after %d", i, e.Seq, got[i-1].Seq)
		}
	}
	// Resuming from the middle returns exactly the rest.
	mid := got[1500]
	rest := readAll(t, ctx, js, "big", mid.Seq)
	if len(rest) != n-1500 || rest[0].Seq != mid.Seq {
		t.Errorf("read from seq %d: got %d events, want %d starting there", mid.Seq, len(rest), n-1500)
	}
	r := projections.NewRequest()
	r.Apply(events.Envelope{Seq: 0, Event: events.RequestAccepted{RequestID: "big", Model: "m"}})
	r.Apply(events.Envelope{Seq: 0, Event: events.RequestRouted{RequestID: "big", WorkerID: "w1"}})
	for _, e := range got {
		r.Apply(e)
	}
	if r.Len() != n || r.Skipped != 0 {
		t.Errorf("folded %d tokens with %d skipped, want %d and 0", r.Len(), r.Skipped, n)
	}
}

func TestProvisionKeepsFirstDefinition(t *testing.T) {
	s := natstest.Start(t)
	js := s.JetStream(t)
	ctx := testCtx(t)
	first := streams.Config{MemoryStorage: true, RequestsMaxAge: time.Hour, MaxMsgsPerSubject: 500}
	second := streams.Config{MemoryStorage: true, RequestsMaxAge: time.Minute, MaxMsgsPerSubject: 5}
	if _, err := streams.Provision(ctx, js, first); err != nil {
		t.Fatalf("provision %+v: %v", first, err)
	}
	// A second component with other limits is refused, naming each one.
	_, err := streams.Provision(ctx, js, second)
	var de *streams.DefinitionError
	// BATON_ENDS keeps the request log's max age too.
	if !errors.As(err, &de) || len(de.Diffs) != 3 || !strings.Contains(err.Error(), "max_age: the server has 1h0m0s, this component 1m0s") ||
		!strings.Contains(err.Error(), "BATON_ENDS max_age") {
		t.Errorf("provision with other limits: got %v, want a DefinitionError naming max_age (of BATON_REQUESTS and BATON_ENDS) and max_msgs_per_subject", err)
	}
	st, err := js.Stream(ctx, streams.RequestsStream)
	if err != nil {
		t.Fatal(err)
	}
	got := st.CachedInfo().Config
	if got.MaxAge != time.Hour || got.MaxMsgsPerSubject != 500 {
		t.Errorf("got max age %v, max msgs per subject %d, want the first definition's 1h, 500", got.MaxAge, got.MaxMsgsPerSubject)
	}
	if got.Discard != jetstream.DiscardNew || !got.DiscardNewPerSubject {
		t.Errorf("got discard %v per subject %v, want DiscardNew per subject", got.Discard, got.DiscardNewPerSubject)
	}
}

func TestProvisionRejectsBadConfig(t *testing.T) {
	s := natstest.Start(t)
	js := s.JetStream(t)
	_, err := streams.Provision(testCtx(t), js, streams.Config{Replicas: 7, RequestsMaxAge: -time.Second})
	if err == nil {
		t.Fatal("got nil error, want config error")
	}
	for _, want := range []string{"replicas", "negative"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want it to mention %q", err, want)
		}
	}
}

// TestSubjectLimitRefusesNewWrites checks that a full subject keeps its
// oldest messages (a live request's first tokens) and refuses the new one.
func TestSubjectLimitRefusesNewWrites(t *testing.T) {
	s := natstest.Start(t)
	js := s.JetStream(t)
	ctx := testCtx(t)
	if _, err := streams.Provision(ctx, js, streams.Config{MemoryStorage: true, MaxMsgsPerSubject: 3}); err != nil {
		t.Fatal(err)
	}
	log := streams.NewLog(js, "test")
	subj := streams.RequestTokens("full", 0, "w1")
	appendDelta := func(subject string, i int) error {
		_, err := log.Append(ctx, subject, log.Envelope(events.ID(subject, i), "full",
			events.TokensGenerated{RequestID: "full", Offset: i, Tokens: []string{"t"}}), -1)
		return err
	}
	for i := range 3 {
		if err := appendDelta(subj, i); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	err := appendDelta(subj, 3)
	if !errors.Is(err, streams.ErrStreamFull) {
		var apiErr *jetstream.APIError
		errors.As(err, &apiErr)
		t.Fatalf("got err %v (api error %+v), want ErrStreamFull", err, apiErr)
	}
	got := readAll(t, ctx, js, "full", 1)
	var offsets []int
	for _, e := range got {
		offsets = append(offsets, e.Event.(events.TokensGenerated).Offset)
	}
	if !reflect.DeepEqual(offsets, []int{0, 1, 2}) {
		t.Errorf("got stored offsets %v, want [0 1 2] (oldest kept)", offsets)
	}
	// The limit is per subject: the next attempt's subject still takes writes.
	if err := appendDelta(streams.RequestTokens("full", 1, "w1"), 0); err != nil {
		t.Errorf("append to another subject: %v", err)
	}
}

func TestStreamLimitErrors(t *testing.T) {
	big := strings.Repeat("x", 600)
	tests := []struct {
		name     string
		cfg      streams.Config
		tokens   string // of each append
		appends  int    // at most this many before one fails
		wantFull bool
	}{
		{"messages per subject", streams.Config{MaxMsgsPerSubject: 2}, "t", 3, true},
		{"stream bytes", streams.Config{RequestsMaxBytes: 4096}, big, 10, true},
		{"message too large is not full", streams.Config{MaxMsgSize: 512}, big, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := natstest.Start(t)
			js := s.JetStream(t)
			ctx := testCtx(t)
			tt.cfg.MemoryStorage = true
			if _, err := streams.Provision(ctx, js, tt.cfg); err != nil {
				t.Fatal(err)
			}
			log := streams.NewLog(js, "test")
			var err error
			for i := 0; err == nil && i < tt.appends; i++ {
				_, err = log.Append(ctx, streams.RequestTokens("r", 0, "w1"), log.Envelope(events.ID("r", i), "r",
					events.TokensGenerated{RequestID: "r", Offset: i, Tokens: []string{tt.tokens}}), -1)
			}
			if err == nil {
				t.Fatalf("%d appends: got nil error, want a refusal", tt.appends)
			}
			if got := errors.Is(err, streams.ErrStreamFull); got != tt.wantFull {
				t.Errorf("got errors.Is(%v, ErrStreamFull) = %v, want %v", err, got, tt.wantFull)
			}
		})
	}
}

// TestAppendMsgAsyncBackpressure: with the async window full, AppendMsgAsync
// waits for an acknowledgement to make room rather than queueing more. The
// "stream" here is a core subscriber that acknowledges when told to.
func TestAppendMsgAsyncBackpressure(t *testing.T) {
	s := natstest.Start(t)
	nc := s.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan *nats.Msg, 2)
	if _, err := nc.Subscribe("bp.>", func(m *nats.Msg) { held <- m }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	log := streams.NewLog(js, "baton/test")
	streams.SetAppendWindow(log, 1)
	msg := func(i int) *nats.Msg {
		h, data, err := events.Marshal(log.Envelope(fmt.Sprint(i), "r1", events.TokensGenerated{RequestID: "r1", Offset: i, Tokens: []string{"t"}}))
		if err != nil {
			t.Fatal(err)
		}
		return &nats.Msg{Subject: "bp.r1", Header: nats.Header(h), Data: data}
	}
	first, err := log.AppendMsgAsync(msg(0))
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		_, err := log.AppendMsgAsync(msg(1))
		second <- err
	}()
	m := <-held // the first append reached the "stream"; its ack is held back
	select {
	case err := <-second:
		t.Fatalf("second append returned (%v) while the window was full, want it to wait", err)
	case <-time.After(400 * time.Millisecond): // long enough to see it return
	}
	if err := m.Respond([]byte(`{"stream":"BP","seq":1}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first.Ok():
	case err := <-first.Err():
		t.Fatalf("first append: %v", err)
	}
	if err := <-second; err != nil {
		t.Fatalf("second append after the ack: %v", err)
	}
}

// ackLost is a JetStream whose first publish is stored but reports a
// timeout, as when the acknowledgement is lost.
type ackLost struct {
	jetstream.JetStream
	lost bool
}

func (a *ackLost) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := a.JetStream.PublishMsg(ctx, m, opts...)
	if err == nil && !a.lost {
		a.lost = true
		return nil, context.DeadlineExceeded
	}
	return ack, err
}

// TestAppendExpectedRetryAfterLostAck: an expected-sequence append whose
// first try was stored but not acknowledged succeeds on its retry (the
// server checks the expected sequence before it deduplicates, so the retry
// alone would be a conflict with itself); a real conflict still is one.
func TestAppendExpectedRetryAfterLostAck(t *testing.T) {
	s := natstest.Start(t)
	js := s.Provision(t)
	ctx := testCtx(t)
	log := streams.NewLog(&ackLost{JetStream: js}, "baton/frontend/fe-1")
	acc := events.RequestAccepted{RequestID: "r1", Model: "m", MaxTokens: 1}
	seq, err := log.Append(ctx, streams.RequestEvents("r1"), log.Envelope("r1.accepted", "r1", acc), 0)
	if err != nil {
		t.Fatalf("append after a lost ack: %v, want success", err)
	}
	if got := readAll(t, ctx, js, "r1", 1); len(got) != 1 || got[0].Seq != seq {
		t.Fatalf("stored %d events (%v), want the one at %d", len(got), got, seq)
	}
	other := streams.NewLog(js, "baton/frontend/fe-2")
	if _, err := other.Append(ctx, streams.RequestEvents("r1"), other.Envelope("r1.accepted-2", "r1", acc), 0); !errors.Is(err, streams.ErrConflict) {
		t.Errorf("another writer's append = %v, want ErrConflict", err)
	}
}

// TestReadRequestYieldsUnreadable: an event of a type this build does not
// know (here a newer version of a known one) is yielded, as an
// events.Unreadable with its sequence and reason, so that a fold steps over
// it knowingly and an expected-sequence append after it does not conflict;
// a message that is not a baton event at all is skipped.
func TestReadRequestYieldsUnreadable(t *testing.T) {
	s := natstest.Start(t)
	js := s.Provision(t)
	ctx := testCtx(t)
	log := streams.NewLog(js, "test")
	subj := streams.RequestEvents("fut")
	if _, err := log.Append(ctx, subj, log.Envelope("a", "fut", events.RequestAttached{RequestID: "fut", Frontend: "fe"}), -1); err != nil {
		t.Fatal(err)
	}
	m, err := streams.NewMsg(subj, log.Envelope("b", "fut", events.RequestAttached{RequestID: "fut", Frontend: "fe2"}))
	if err != nil {
		t.Fatal(err)
	}
	m.Header.Set(events.HeaderType, "baton.request.attached.v2")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subj, Data: []byte("not an event")}); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, ctx, js, "fut", 1)
	if len(got) != 2 {
		t.Fatalf("read %d events, want 2 (the known one and the unreadable one)", len(got))
	}
	u, ok := got[1].Event.(events.Unreadable)
	if !ok || u.Type != "baton.request.attached.v2" || !strings.Contains(u.Reason, "newer version v2") || got[1].Seq != 2 {
		t.Fatalf("second event %#v at seq %d, want an Unreadable newer version at seq 2", got[1].Event, got[1].Seq)
	}
	// A writer that read a subject ending in an unreadable event appends
	// after it, expecting its sequence, without a conflict.
	subj2 := streams.RequestEvents("fut2")
	if _, err := log.Append(ctx, subj2, log.Envelope("c", "fut2", events.RequestAttached{RequestID: "fut2", Frontend: "fe"}), -1); err != nil {
		t.Fatal(err)
	}
	m.Subject = subj2
	m.Header.Set(events.HeaderID, "d")
	m.Header.Set(events.HeaderMsgID, "d")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	got = readAll(t, ctx, js, "fut2", 1)
	last := got[len(got)-1].Seq
	if _, err := log.Append(ctx, subj2, log.Envelope("e", "fut2", events.RequestAttached{RequestID: "fut2", Frontend: "fe3"}), int64(last)); err != nil {
		t.Fatalf("append expecting the unreadable event's sequence %d: %v", last, err)
	}
}

// TestAppendAsyncIsNotRetriedOutOfOrder: an asynchronous append that no
// stream answers fails; it is not re-sent later behind the caller's back,
// where it would be stored after the appends sent after it (all of them
// acknowledged, the earlier one out of order: readers would skip the later
// ones as gaps, and the caller would never know to repair them). Here the
// stream comes into being just after the append: a hidden retry would store
// it.
func TestAppendAsyncIsNotRetriedOutOfOrder(t *testing.T) {
	s := natstest.Start(t)
	ctx := testCtx(t)
	js := s.JetStream(t)
	log := streams.NewLog(js, "test")
	f, err := log.AppendAsync("late.1", log.Envelope("a", "r", events.RequestAttached{RequestID: "r", Frontend: "fe"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LATE", Subjects: []string{"late.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-f.Ok():
		t.Fatal("an append that no stream answered was stored later: a hidden retry, out of order with what followed")
	case err := <-f.Err():
		if !errors.Is(err, jetstream.ErrNoStreamResponse) {
			t.Logf("append failed with %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the append neither failed nor was stored")
	}
}

// acked waits until every append of futures is acknowledged; it fails the
// test if one fails or ctx ends first.
func acked(t *testing.T, ctx context.Context, futures []jetstream.PubAckFuture) {
	t.Helper()
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatalf("append: %v", err)
		case <-ctx.Done():
			t.Fatal("timed out waiting for acks")
		}
	}
}

// swallow subscribes to subject on nc and never answers: a stream leader
// that died with the appends it received.
func swallow(t *testing.T, nc *nats.Conn, subject string) {
	t.Helper()
	if _, err := nc.Subscribe(subject, func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// appendFailure waits for f's error; it fails the test if f succeeds or
// ctx ends first.
func appendFailure(t *testing.T, ctx context.Context, f jetstream.PubAckFuture) error {
	t.Helper()
	select {
	case <-f.Ok():
		t.Fatal("an append nobody answered was acknowledged")
	case err := <-f.Err():
		return err
	case <-ctx.Done():
		t.Fatal("an append nobody answered neither failed nor was acknowledged")
	}
	return nil
}

// TestAppendMsgAsyncAckLost: an asynchronous append that nobody answers
// fails with a transient error once its acknowledgement timeout has passed,
// and leaves the window: the appends after it do not stall.
func TestAppendMsgAsyncAckLost(t *testing.T) {
	s := natstest.Start(t)
	ctx := testCtx(t)
	nc := s.Connect(t)
	swallow(t, nc, "lost.>")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	log := streams.NewLog(js, "baton/test")
	streams.SetAppendWindow(log, 2)
	streams.SetAppendAckTimeout(log, 100*time.Millisecond)
	for round := range 3 { // a window's worth each round: a slot kept by an expired append would stall the next
		start := time.Now()
		var futures []jetstream.PubAckFuture
		for i := range 2 {
			f, err := log.AppendAsync("lost.r", log.Envelope(fmt.Sprint(round, i), "r", events.RequestAttached{RequestID: "r", Frontend: "fe"}))
			if err != nil {
				t.Fatalf("round %d append %d: %v", round, i, err)
			}
			futures = append(futures, f)
		}
		for i, f := range futures {
			err := appendFailure(t, ctx, f)
			if !errors.Is(err, jetstream.ErrAsyncPublishTimeout) || !streams.Transient(err) {
				t.Errorf("round %d append %d failed with %v, want the transient ErrAsyncPublishTimeout", round, i, err)
			}
		}
		if d := time.Since(start); d < 100*time.Millisecond {
			t.Errorf("round %d: the appends failed after %v, before their timeout", round, d)
		}
	}
}

// TestAppendMsgAsyncConnectionLost: the appends pending when the connection
// is lost fail at once (their acknowledgements can no longer come), with a
// transient error, not at their timeout.
func TestAppendMsgAsyncConnectionLost(t *testing.T) {
	s := natstest.Start(t)
	ctx := testCtx(t)
	swallow(t, s.Connect(t), "lost.>")
	p := natstest.NewProxy(t, s.Addr().String())
	nc := natstest.Connect(t, p.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	log := streams.NewLog(js, "baton/test")
	f, err := log.AppendAsync("lost.r", log.Envelope("a", "r", events.RequestAttached{RequestID: "r", Frontend: "fe"}))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p.Cut()
	err = appendFailure(t, ctx, f)
	if !errors.Is(err, nats.ErrDisconnected) || !streams.Transient(err) {
		t.Errorf("failed with %v, want the transient nats.ErrDisconnected", err)
	}
	if d := time.Since(start); d >= streams.AppendAckTimeout {
		t.Errorf("failed %v after the connection was lost, at its timeout: want at once", d)
	}
}

// TestReadRequestOfLargeMessages reads a request whose attempt subject
// holds 80 MiB of 1 MiB messages (a quarantined worker's junk on its own
// attempt) on a connection that counts its reconnects. Read in one batch
// direct get of 1,000 messages, the answer exceeded the server's pending
// bytes for a client (64 MiB): the server disconnected the reader as a slow
// consumer, and its reconnect read the request again, for as long as the
// junk stayed. Each batch is now bounded in bytes.
func TestReadRequestOfLargeMessages(t *testing.T) {
	s := natstest.Start(t)
	js := s.Provision(t)
	ctx := testCtx(t)
	log := streams.NewLog(js, "test")
	natstest.Append(ctx, t, log, streams.RequestEvents("big"), "big.accepted", "big",
		events.RequestAccepted{RequestID: "big", Model: "m", MaxTokens: 10})
	junk := make([]byte, 1<<20-4096)
	var pending []jetstream.PubAckFuture
	for range 80 {
		f, err := js.PublishAsync(streams.RequestTokens("big", 0, "w"), junk)
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, f)
	}
	acked(t, ctx, pending)
	var reconnects atomic.Int32
	rjs := natstest.JetStream(t, s.URL, nats.DisconnectErrHandler(func(*nats.Conn, error) { reconnects.Add(1) }))
	n := 0
	for e, err := range streams.ReadRequest(ctx, rjs, 1, "big", 1) {
		if err != nil {
			t.Fatalf("read after %d events: %v", n, err)
		}
		if _, ok := e.Event.(events.RequestAccepted); ok {
			n++
		}
	}
	if n != 1 || reconnects.Load() != 0 {
		t.Errorf("read %d acceptances with %d disconnects, want 1 and none", n, reconnects.Load())
	}
}

// TestReadRequestPast: a read reports the last sequence it read, past the
// messages that are no baton events (junk), so that the next read starts
// after them.
func TestReadRequestPast(t *testing.T) {
	s := natstest.Start(t)
	js := s.Provision(t)
	ctx := testCtx(t)
	log := streams.NewLog(js, "test")
	natstest.Append(ctx, t, log, streams.RequestEvents("j"), "j.accepted", "j",
		events.RequestAccepted{RequestID: "j", Model: "m", MaxTokens: 10})
	var last uint64
	for range 3 {
		ack, err := js.Publish(ctx, streams.RequestTokens("j", 0, "w"), []byte("junk"))
		if err != nil {
			t.Fatal(err)
		}
		last = ack.Sequence
	}
	var past uint64
	n := 0
	for _, err := range streams.ReadRequestPast(ctx, js, 1, "j", 1, &past) {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 1 || past != last {
		t.Errorf("read %d events, past %d; want the acceptance and past %d, the last junk", n, past, last)
	}
	for _, err := range streams.ReadRequestPast(ctx, js, 1, "j", past+1, &past) {
		if !errors.Is(err, streams.ErrNotFound) {
			t.Errorf("read from past+1: %v, want ErrNotFound", err)
		}
	}
}
