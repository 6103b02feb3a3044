package quota

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/waitfor"
	"github.com/nats-io/nats.go/jetstream"
)

// TestLogSharesAcrossFrontends: what one frontend accounts of a tenant's
// log bytes reaches the others through the bucket and adds to theirs; a
// frontend that stops deletes its key and its bytes stop counting.
func TestLogSharesAcrossFrontends(t *testing.T) {
	_, kv := budgetsKV(t)
	ctx := context.Background()
	a, err := NewLogShares(kv, nil, "fe-a", 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewLogShares(kv, nil, "fe-b", 10*time.Millisecond)
	if _, err := NewLogShares(kv, nil, "", 0); err == nil {
		t.Error("log shares without a frontend id: got no error")
	}
	actx, stopA := context.WithCancel(ctx)
	bctx, stopB := context.WithCancel(ctx)
	aDone, bDone := make(chan error, 1), make(chan error, 1)
	go func() { aDone <- a.Run(actx) }()
	go func() { bDone <- b.Run(bctx) }()
	defer func() {
		stopB()
		if err := <-bDone; err != nil {
			t.Error(err)
		}
	}()

	a.Set(map[string]int64{"alice": 1000, "bob": 5})
	b.Set(map[string]int64{"alice": 300})
	waitfor.Poll(t, "each frontend to add the other's bytes", func() bool {
		return a.Bytes("alice") == 1300 && b.Bytes("alice") == 1300 && b.Bytes("bob") == 5
	})
	if got := a.Bytes("carol"); got != 0 {
		t.Errorf("carol's bytes: got %d, want 0", got)
	}
	a.Set(map[string]int64{"alice": 10})
	waitfor.Poll(t, "a change to reach the other frontend", func() bool { return b.Bytes("alice") == 310 })

	stopA()
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, logPrefix+"fe-a"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("fe-a's key after it stopped: got %v, want it deleted", err)
	}
	waitfor.Poll(t, "a stopped frontend's bytes to stop counting", func() bool { return b.Bytes("alice") == 300 && b.Bytes("bob") == 0 })
}

// endedWatchKV is a bucket whose watches have ended already, as a watch
// started with a context does once that context is done.
type endedWatchKV struct{ jetstream.KeyValue }

func (kv endedWatchKV) Watch(context.Context, string, ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return endedWatcher{}, nil
}

type endedWatcher struct{}

func (endedWatcher) Updates() <-chan jetstream.KeyValueEntry {
	ch := make(chan jetstream.KeyValueEntry)
	close(ch)
	return ch
}
func (endedWatcher) Stop() error { return nil }

// TestLogSharesLeaveWhenTheWatchEndsFirst: the watch of the others' bytes
// ends with the context Run was given, and Run's select may see that
// before the context's end; it must still delete this frontend's key
// (formerly it returned at once and left the key for the bucket's TTL).
// Both are ready from the start here, so each round's select picks either.
func TestLogSharesLeaveWhenTheWatchEndsFirst(t *testing.T) {
	_, kv := budgetsKV(t)
	for round := range 16 {
		s, err := NewLogShares(endedWatchKV{kv}, nil, "fe-a", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(t.Context(), logPrefix+"fe-a", []byte(`{"alice":1}`)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := s.Run(ctx); err != nil {
			t.Fatalf("round %d: Run after its context ended: %v", round, err)
		}
		if _, err := kv.Get(t.Context(), logPrefix+"fe-a"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("round %d: fe-a's key after Run returned: got %v, want it deleted", round, err)
		}
	}
}
