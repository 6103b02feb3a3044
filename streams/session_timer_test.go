package streams

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// fakeStore is a sessionStore in memory, so the renewal timers run under
// synctest.
type fakeStore struct {
	mu      sync.Mutex
	data    []byte // nil: no key
	rev     uint64 // revision of the last write (0: none)
	seq     uint64 // the stream's last sequence
	fail    error  // returned by every put while set
	puts    []time.Time
	deletes []uint64 // last of each delete
}

func (f *fakeStore) name() string { return "test/key" }

func (f *fakeStore) create(_ context.Context, data []byte) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.data != nil {
		return 0, jetstream.ErrKeyExists
	}
	return f.store(data), nil
}

func (f *fakeStore) get(context.Context) ([]byte, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.data == nil {
		return nil, 0, jetstream.ErrKeyNotFound
	}
	return f.data, f.rev, nil
}

func (f *fakeStore) put(_ context.Context, data []byte, last uint64) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.puts = append(f.puts, time.Now())
	if f.fail != nil {
		return 0, f.fail
	}
	if last > 0 && last != f.rev {
		return 0, ErrRevisionMismatch
	}
	return f.store(data), nil
}

func (f *fakeStore) delete(_ context.Context, last uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deletes = append(f.deletes, last)
	if last > 0 && last != f.rev {
		return ErrRevisionMismatch
	}
	f.data = nil
	f.seq++
	f.rev = f.seq
	return nil
}

func (f *fakeStore) store(data []byte) uint64 {
	f.data = data
	f.seq++
	f.rev = f.seq
	return f.rev
}

// writeOther is a write by someone else.
func (f *fakeStore) writeOther(data string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.store([]byte(data))
}

func (f *fakeStore) setFail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = err
}

func (f *fakeStore) value() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return string(f.data)
}

func (f *fakeStore) putTimes() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.puts...)
}

type val struct {
	N    int    `json:"n"`
	Conn string `json:"conn,omitempty"`
}

var errDown = errors.New("no responders")

// startSession starts a session of val{N: 1} with a TTL of 3s on a new
// fake store.
func startSession(t *testing.T, exclusive bool) (*fakeStore, *Session[val]) {
	t.Helper()
	st := &fakeStore{}
	s, err := newSession(t.Context(), st, val{N: 1}, SessionConfig[val]{TTL: 3 * time.Second, Exclusive: exclusive})
	if err != nil {
		t.Fatal(err)
	}
	return st, s
}

func isDone(s interface{ Done() <-chan struct{} }) bool {
	select {
	case <-s.Done():
		return true
	default:
		return false
	}
}

func TestSessionRenewsAtAThirdOfTheTTLWithJitter(t *testing.T) {
	for _, exclusive := range []bool{true, false} {
		name := map[bool]string{true: "exclusive", false: "by fiat"}[exclusive]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st, s := startSession(t, exclusive)
				defer s.Close()
				start := time.Now()
				time.Sleep(10*time.Second + time.Millisecond)
				synctest.Wait()
				puts := st.putTimes()
				first := 0 // an exclusive session creates the key; others put it
				if !exclusive {
					first = 1
				}
				if got := len(puts) - first; got < 10 || got > 11 {
					t.Fatalf("got %d renewals in 10s, want 10 or 11 (one every 0.9-1s)", got)
				}
				prev := start
				for i, at := range puts[first:] {
					if gap := at.Sub(prev); gap < 900*time.Millisecond || gap > time.Second {
						t.Errorf("renewal %d after %v, want 0.9s-1s", i, gap)
					}
					prev = at
				}
				if isDone(s) {
					t.Errorf("Done closed, want live (Err %v)", s.Err())
				}
			})
		})
	}
}

func TestSessionLiveness(t *testing.T) {
	cases := []struct {
		name      string
		exclusive bool
		// trouble happens just after the session starts.
		trouble  func(*fakeStore)
		after    time.Duration // how long to wait then
		wantDone bool
		wantErr  error
		wantKey  string // the key's value at the end
	}{
		{name: "exclusive, written by another", exclusive: true,
			trouble: func(f *fakeStore) { f.writeOther(`{"n":9}`) }, after: time.Second,
			wantDone: true, wantErr: ErrSessionLost, wantKey: `{"n":9}`},
		{name: "exclusive, deleted", exclusive: true,
			trouble: func(f *fakeStore) { _ = f.delete(context.Background(), 0) }, after: time.Second,
			wantDone: true, wantErr: ErrSessionLost, wantKey: ""},
		// Loss is noticed at the first renewal a TTL after the last success.
		{name: "exclusive, renewals fail for a TTL", exclusive: true,
			trouble: func(f *fakeStore) { f.setFail(errDown) }, after: 4 * time.Second,
			wantDone: true, wantErr: ErrSessionLost, wantKey: `{"n":1}`},
		{name: "exclusive, renewals fail for less than a TTL", exclusive: true,
			trouble: func(f *fakeStore) { f.setFail(errDown) }, after: 2 * time.Second,
			wantDone: false, wantKey: `{"n":1}`},
		{name: "by fiat, written by another",
			trouble: func(f *fakeStore) { f.writeOther(`{"n":9}`) }, after: time.Second,
			wantDone: false, wantKey: `{"n":1}`},
		{name: "by fiat, deleted: the next renewal puts it back",
			trouble: func(f *fakeStore) { _ = f.delete(context.Background(), 0) }, after: time.Second,
			wantDone: false, wantKey: `{"n":1}`},
		{name: "by fiat, renewals fail for long",
			trouble: func(f *fakeStore) { f.setFail(errDown) }, after: 10 * time.Second,
			wantDone: false, wantKey: `{"n":1}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st, s := startSession(t, tc.exclusive)
				defer s.Close()
				tc.trouble(st)
				time.Sleep(tc.after)
				synctest.Wait()
				if got := isDone(s); got != tc.wantDone {
					t.Errorf("got done %v, want %v (Err %v)", got, tc.wantDone, s.Err())
				}
				if err := s.Err(); !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
					t.Errorf("got Err %v, want %v", err, tc.wantErr)
				}
				if got := st.value(); got != tc.wantKey {
					t.Errorf("got key %q, want %q", got, tc.wantKey)
				}
			})
		})
	}
}

func TestSessionRecoversFromFailuresShorterThanTheTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, s := startSession(t, true)
		defer s.Close()
		st.setFail(errDown)
		time.Sleep(2 * time.Second)
		st.setFail(nil)
		time.Sleep(5 * time.Second) // past the TTL since the failures began
		synctest.Wait()
		if isDone(s) {
			t.Fatalf("got done (Err %v), want live: a renewal succeeded within the TTL", s.Err())
		}
	})
}

func TestSessionUpdate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &fakeStore{}
		var conn atomic.Value
		conn.Store("c1")
		s, err := newSession(t.Context(), st, val{N: 1}, SessionConfig[val]{TTL: 3 * time.Second, Exclusive: true,
			Refresh: func(v *val) { v.Conn = conn.Load().(string) }})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if got, want := st.value(), `{"n":1,"conn":"c1"}`; got != want {
			t.Errorf("got created %s, want %s", got, want)
		}
		if err := s.Update(func(v *val) { v.N = 2 }); err != nil {
			t.Fatal(err)
		}
		if got, want := st.value(), `{"n":2,"conn":"c1"}`; got != want {
			t.Errorf("got updated %s, want %s", got, want)
		}
		st.setFail(errDown)
		if err := s.Update(func(v *val) { v.N = 3 }); !errors.Is(err, errDown) {
			t.Errorf("got Update err %v, want %v", err, errDown)
		}
		if got := s.Value(); got.N != 2 {
			t.Errorf("got value %+v after a failed update, want n 2", got)
		}
		st.setFail(nil)
		conn.Store("c2") // a reconnect: the next renewal refreshes it
		time.Sleep(time.Second)
		synctest.Wait()
		if got, want := st.value(), `{"n":2,"conn":"c2"}`; got != want {
			t.Errorf("got renewed %s, want %s", got, want)
		}
	})
}

func TestSessionEnd(t *testing.T) {
	cases := []struct {
		name        string
		exclusive   bool
		end         func(*Session[val]) error
		wantKey     string
		wantDeletes []uint64
	}{
		{name: "revoke exclusive", exclusive: true, end: func(s *Session[val]) error { return s.Revoke(context.Background()) },
			wantKey: "", wantDeletes: []uint64{1}},
		{name: "revoke by fiat", end: func(s *Session[val]) error { return s.Revoke(context.Background()) },
			wantKey: "", wantDeletes: []uint64{0}},
		{name: "close", exclusive: true, end: func(s *Session[val]) error { s.Close(); return nil },
			wantKey: `{"n":1}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st, s := startSession(t, tc.exclusive)
				if err := tc.end(s); err != nil {
					t.Fatal(err)
				}
				if !isDone(s) || !errors.Is(s.Err(), ErrSessionClosed) {
					t.Errorf("got done %v, Err %v; want done, %v", isDone(s), s.Err(), ErrSessionClosed)
				}
				if got := st.value(); got != tc.wantKey {
					t.Errorf("got key %q, want %q", got, tc.wantKey)
				}
				if !slices.Equal(st.deletes, tc.wantDeletes) {
					t.Errorf("got deletes at %v, want %v", st.deletes, tc.wantDeletes)
				}
				n := len(st.putTimes())
				time.Sleep(5 * time.Second)
				synctest.Wait()
				if got := len(st.putTimes()); got != n {
					t.Errorf("got %d writes after the end, want none", got-n)
				}
				if err := s.Update(func(v *val) { v.N = 5 }); !errors.Is(err, ErrSessionClosed) {
					t.Errorf("got Update after the end %v, want %v", err, ErrSessionClosed)
				}
			})
		})
	}
}

func TestSessionRevokeAfterLossLeavesTheKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, s := startSession(t, true)
		st.writeOther(`{"n":9}`)
		<-s.Done()
		if err := s.Revoke(context.Background()); err != nil {
			t.Fatalf("got Revoke %v, want nil", err)
		}
		if got := st.value(); got != `{"n":9}` {
			t.Errorf("got key %q, want the other writer's", got)
		}
		if !errors.Is(s.Err(), ErrSessionLost) {
			t.Errorf("got Err %v, want %v", s.Err(), ErrSessionLost)
		}
	})
}

func TestSessionCreate(t *testing.T) {
	cases := []struct {
		name     string
		held     string // the key's value before; "" for none
		takeOver func(val) bool
		wantErr  error
		wantKey  string
	}{
		{name: "free", wantKey: `{"n":1}`},
		{name: "held, no TakeOver", held: `{"n":7}`, wantErr: ErrKeyHeld, wantKey: `{"n":7}`},
		{name: "held by another", held: `{"n":7}`, takeOver: func(v val) bool { return v.N == 8 },
			wantErr: ErrKeyHeld, wantKey: `{"n":7}`},
		{name: "held by a value TakeOver allows", held: `{"n":8}`, takeOver: func(v val) bool { return v.N == 8 },
			wantKey: `{"n":1}`},
		{name: "held by something unreadable", held: `not json`, takeOver: func(val) bool { return true },
			wantErr: ErrKeyHeld, wantKey: `not json`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := &fakeStore{}
				if tc.held != "" {
					st.writeOther(tc.held)
				}
				s, err := newSession(t.Context(), st, val{N: 1}, SessionConfig[val]{TTL: 3 * time.Second, Exclusive: true, TakeOver: tc.takeOver})
				if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
					t.Fatalf("got err %v, want %v", err, tc.wantErr)
				}
				if s != nil {
					s.Close()
				}
				if got := st.value(); got != tc.wantKey {
					t.Errorf("got key %q, want %q", got, tc.wantKey)
				}
			})
		})
	}
}

func TestSessionTTLBelowASecond(t *testing.T) {
	if _, err := newSession(t.Context(), &fakeStore{}, val{}, SessionConfig[val]{TTL: 500 * time.Millisecond}); err == nil {
		t.Fatal("got no error for a TTL of 500ms, want one")
	}
}
