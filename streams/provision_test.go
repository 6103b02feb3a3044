package streams_test

import (
	"context"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
)

func TestProvisionIsIdempotent(t *testing.T) {
	s := natstest.Start(t)
	js := s.JetStream(t)
	ctx := context.Background()
	for i := range 3 {
		if _, err := streams.Provision(ctx, js, streams.Config{MemoryStorage: true}); err != nil {
			t.Fatalf("provision #%d: %v", i, err)
		}
	}
	for _, name := range []string{streams.RequestsStream, streams.WorkersStream, "KV_" + streams.LeasesBucket, "KV_" + streams.LoadBucket} {
		if _, err := js.Stream(ctx, name); err != nil {
			t.Errorf("stream %s: %v", name, err)
		}
	}
}

func TestAppendRepublishesWithLastSequence(t *testing.T) {
	s := natstest.Start(t)
	js := s.Provision(t)
	nc := s.Connect(t)
	ctx := context.Background()
	sub, err := nc.SubscribeSync(streams.RequestLive("r1"))
	if err != nil {
		t.Fatal(err)
	}
	// The appends go through another connection: make sure the server has
	// the subscription before the first one.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	log := streams.NewLog(js, "test")
	ev := events.TokensGenerated{RequestID: "r1", Attempt: 0, Offset: 0, Tokens: []string{"a ", "b "}}
	seq1, err := log.Append(ctx, streams.RequestTokens("r1", 0, "w1"), log.Envelope("r1.0.0", "r1", ev), -1)
	if err != nil {
		t.Fatal(err)
	}
	ev.Offset = 2
	seq2, err := log.Append(ctx, streams.RequestTokens("r1", 0, "w1"), log.Envelope("r1.0.2", "r1", ev), int64(seq1))
	if err != nil {
		t.Fatal(err)
	}
	// A retry of the same id is deduplicated, not stored twice.
	if _, err := log.Append(ctx, streams.RequestTokens("r1", 0, "w1"), log.Envelope("r1.0.2", "r1", ev), -1); err != nil {
		t.Fatal(err)
	}
	// A stale expectation conflicts.
	if _, err := log.Append(ctx, streams.RequestTokens("r1", 0, "w1"), log.Envelope("r1.0.9", "r1", ev), int64(seq1)); err == nil {
		t.Fatal("stale expected sequence: got nil error, want conflict")
	}
	var got []*nats.Msg
	for range 2 {
		m, err := sub.NextMsg(2 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m)
	}
	e, err := streams.Decode(got[1])
	if err != nil {
		t.Fatal(err)
	}
	if e.Seq != seq2 || e.LastSeq != seq1 {
		t.Errorf("republished seq/last = %d/%d, want %d/%d", e.Seq, e.LastSeq, seq2, seq1)
	}
	// Neither the deduplicated retry nor the refused write is republished:
	// the next live message is the next stored one.
	seq3, err := log.Append(ctx, streams.RequestEvents("r1"), log.Envelope("r1.attached", "r1", events.RequestAttached{RequestID: "r1", Frontend: "fe"}), -1)
	if err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(2 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := streams.Decode(m); err != nil || e.Seq != seq3 {
		t.Errorf("next republish: got seq %d (err %v), want %d", e.Seq, err, seq3)
	}
	var n int
	for e, err := range streams.ReadRequest(ctx, js, 1, "r1", 1) {
		if e.Type() == events.TypeRequestAttached {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
		if e.Type() != events.TypeTokensGenerated {
			t.Errorf("type %s", e.Type())
		}
	}
	if n != 2 {
		t.Errorf("read %d events, want 2", n)
	}
}
