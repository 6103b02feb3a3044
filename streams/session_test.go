package streams_test

import (
	"errors"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

type holder struct {
	ID string `json:"id"`
	N  int    `json:"n"`
}

func sessionKV(t *testing.T) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	js := natstest.Start(t).Provision(t)
	kv, err := js.KeyValue(testCtx(t), streams.LeasesBucket)
	if err != nil {
		t.Fatal(err)
	}
	return js, kv
}

func waitDone(t *testing.T, s *streams.Session[holder], within time.Duration) {
	t.Helper()
	select {
	case <-s.Done():
	case <-time.After(within):
		t.Fatalf("Done not closed within %v", within)
	}
}

// TestSessionOnJetStream: the key carries the TTL and the session's
// revision; a second exclusive session is refused unless TakeOver allows it.
func TestSessionOnJetStream(t *testing.T) {
	js, kv := sessionKV(t)
	ctx := testCtx(t)
	cfg := streams.SessionConfig[holder]{TTL: time.Second, Exclusive: true}
	s, err := streams.NewSession(ctx, js, kv, "w-1", holder{ID: "a"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	msg, err := js.Conn().Request("$JS.API.DIRECT.GET.KV_"+streams.LeasesBucket+".$KV."+streams.LeasesBucket+".w-1", nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := msg.Header.Get("Nats-TTL"); got != "1s" {
		t.Errorf("got Nats-TTL %q, want 1s", got)
	}
	if err := s.Update(func(h *holder) { h.N = 2 }); err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "w-1")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(e.Value()), `{"id":"a","n":2}`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}

	if _, err := streams.NewSession(ctx, js, kv, "w-1", holder{ID: "b"}, cfg); !errors.Is(err, streams.ErrKeyHeld) {
		t.Fatalf("got second session err %v, want %v", err, streams.ErrKeyHeld)
	}
	own := cfg
	own.TakeOver = func(h holder) bool { return h.ID == "a" }
	s2, err := streams.NewSession(ctx, js, kv, "w-1", holder{ID: "a2"}, own)
	if err != nil {
		t.Fatalf("got take-over err %v, want nil", err)
	}
	defer s2.Close()
	// The first session's next renewal finds the key revised under it.
	waitDone(t, s, 2*time.Second)
	if !errors.Is(s.Err(), streams.ErrSessionLost) {
		t.Errorf("got Err %v, want %v", s.Err(), streams.ErrSessionLost)
	}
	if err := s2.Revoke(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "w-1"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("got Get after Revoke %v, want %v", err, jetstream.ErrKeyNotFound)
	}
}

// TestSessionLostOnJetStream: an exclusive session ends when its key is
// deleted; one by fiat writes it back.
func TestSessionLostOnJetStream(t *testing.T) {
	cases := []struct {
		name      string
		exclusive bool
	}{
		{name: "exclusive", exclusive: true},
		{name: "by fiat"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			js, kv := sessionKV(t)
			ctx := testCtx(t)
			s, err := streams.NewSession(ctx, js, kv, "k", holder{ID: "a"}, streams.SessionConfig[holder]{TTL: time.Second, Exclusive: tc.exclusive})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			w, err := kv.Watch(ctx, "k", jetstream.UpdatesOnly())
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			if err := kv.Delete(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			if tc.exclusive {
				waitDone(t, s, 2*time.Second)
				if !errors.Is(s.Err(), streams.ErrSessionLost) {
					t.Errorf("got Err %v, want %v", s.Err(), streams.ErrSessionLost)
				}
				return
			}
			for {
				select {
				case e := <-w.Updates():
					if e != nil && e.Operation() == jetstream.KeyValuePut {
						if got := string(e.Value()); got != `{"id":"a","n":0}` {
							t.Errorf("got %s put back, want the session's value", got)
						}
						if s.Err() != nil {
							t.Errorf("got Err %v, want a live session", s.Err())
						}
						return
					}
				case <-ctx.Done():
					t.Fatal("key not put back")
				}
			}
		})
	}
}

// TestSessionExpiresAfterClose: Close leaves the key to its TTL.
func TestSessionExpiresAfterClose(t *testing.T) {
	js, kv := sessionKV(t)
	ctx := testCtx(t)
	s, err := streams.NewSession(ctx, js, kv, "k", holder{ID: "a"}, streams.SessionConfig[holder]{TTL: time.Second, Exclusive: true})
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, "k", jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	s.Close()
	if _, err := kv.Get(ctx, "k"); err != nil {
		t.Fatalf("got Get after Close %v, want the key still there", err)
	}
	for {
		select {
		case e := <-w.Updates():
			if e != nil && e.Operation() != jetstream.KeyValuePut {
				return // expired
			}
		case <-ctx.Done():
			t.Fatal("key did not expire")
		}
	}
}
