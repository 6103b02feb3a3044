package streams_test

import (
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/streams"
)

// TestReadBehind reads what a replica that answered the direct gets had not
// returned (appended since, or not applied there yet). A lagging replica
// cannot be staged on one node, so each case states where the replica's
// answer stopped (from): readBehind must supply exactly the request's
// messages from there on, in order, and nothing of another request's. On
// one node its second batched get answers them all: the leader's answers a
// message at a time, for a replica still behind, need a lagging replica,
// which no test stages.
func TestReadBehind(t *testing.T) {
	s := natstest.Start(t)
	js := s.Provision(t)
	ctx := testCtx(t)
	log := streams.NewLog(js, "test")
	var seqs []uint64
	for i, id := range []string{"r", "other", "r", "r", "other"} {
		seq, err := log.Append(ctx, streams.RequestTokens(id, 0, "w1"), log.Envelope(events.ID(id, i), id,
			events.TokensGenerated{RequestID: id, Offset: i, Tokens: []string{"t"}}), -1)
		if err != nil {
			t.Fatal(err)
		}
		if id == "r" {
			seqs = append(seqs, seq)
		}
	}
	for _, tc := range []struct {
		name string
		from uint64 // the next sequence the replica's answer lacked
		want []uint64
	}{
		{"replica had nothing", 1, seqs},
		{"replica missed the last two", seqs[0] + 1, seqs[1:]},
		{"replica missed the last", seqs[2], seqs[2:]},
		{"replica was current", seqs[2] + 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []uint64
			read, ok := streams.ReadBehind(ctx, js, streams.RequestsStream, streams.RequestAll("r"), tc.from, new(uint64),
				func(e events.Envelope, err error) bool {
					if err != nil {
						t.Fatalf("read: %v", err)
					}
					if ev, isTok := e.Event.(events.TokensGenerated); !isTok || ev.RequestID != "r" {
						t.Errorf("read %+v, want only request r's deltas", e.Event)
					}
					got = append(got, e.Seq)
					return true
				})
			if !ok || read != (len(tc.want) > 0) {
				t.Errorf("read, ok = %v, %v; want %v, true", read, ok, len(tc.want) > 0)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got seqs %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("got seqs %v, want %v", got, tc.want)
					break
				}
			}
		})
	}
}
