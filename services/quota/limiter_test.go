package quota

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/internal/waitfor"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// clock is a clock the test moves by hand. The bucket is a real embedded
// JetStream, whose network waits testing/synctest cannot fake, so the
// limiters read this clock instead; their lease timers are real and set
// past the end of each test (Lease is a minute in these tests unless one
// says otherwise).
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func budgetsKV(t testing.TB) (*natstest.Server, jetstream.KeyValue) {
	t.Helper()
	s := natstest.Start(t)
	js := s.Provision(t)
	kv, err := js.KeyValue(context.Background(), streams.BudgetsBucket)
	if err != nil {
		t.Fatalf("budgets bucket: %v", err)
	}
	return s, kv
}

func newLimiter(t testing.TB, kv jetstream.KeyValue, id string, b Budgets, c *clock, lease time.Duration) *Limiter {
	t.Helper()
	l, err := New(kv, nil, b, Config{Frontend: id, Lease: lease, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, h := range l.tenants {
			if h.timer != nil {
				h.timer.Stop()
			}
		}
	})
	return l
}

func rpm(tenant string, n int64) Budgets {
	return Budgets{Tenants: map[string]Budget{tenant: {RPM: n}}}
}

// admitted records the times of admissions, and checks that no 60-second
// window [t, t+60s) holds more than limit.
type admitted []time.Duration

func (a admitted) maxInWindow() int {
	most := 0
	for i := range a {
		n := 0
		for j := i; j < len(a) && a[j] < a[i]+time.Minute; j++ {
			n++
		}
		most = max(most, n)
	}
	return most
}

// TestEveryWindowHolds: a client that asks every 100 ms for three minutes,
// through one frontend or alternately through two sharing the bucket, gets
// at most the budget in every 60-second window, the first one included,
// and close to it.
func TestEveryWindowHolds(t *testing.T) {
	for _, tc := range []struct {
		name      string
		limit     int64
		frontends int
	}{
		{"one frontend, rpm 30", 30, 1},
		{"two frontends, rpm 30", 30, 2},
		{"two frontends, rpm 1", 1, 2},
		{"two frontends, rpm 200", 200, 2},
		{"two frontends, tpm 3000, 7 a request", 3000, -2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, kv := budgetsKV(t)
			c := &clock{now: time.Unix(1_800_000_000, 0)}
			start := c.Now()
			// A negative number of frontends: the budget is tpm, of 7
			// tokens a request, counted in requests of 7.
			b, cost, units := rpm("alice", tc.limit), int64(0), tc.limit
			if tc.frontends < 0 {
				tc.frontends = -tc.frontends
				b, cost, units = Budgets{Tenants: map[string]Budget{"alice": {TPM: tc.limit}}}, 7, tc.limit/7
			}
			var ls []*Limiter
			for i := range tc.frontends {
				ls = append(ls, newLimiter(t, kv, "fe-"+string(rune('a'+i)), b, c, time.Minute))
			}
			var got admitted
			per := make([]int, tc.frontends)
			for i := 0; c.Now().Sub(start) < 3*time.Minute; i++ {
				k := i % tc.frontends
				_, _, err := ls[k].Acquire(context.Background(), "alice", cost)
				var over *OverError
				switch {
				case err == nil:
					got = append(got, c.Now().Sub(start))
					per[k]++
				case errors.As(err, &over):
					if over.RetryAfter <= 0 {
						t.Fatalf("over with Retry-After %v, want a positive wait", over.RetryAfter)
					}
				default:
					t.Fatal(err)
				}
				c.advance(100 * time.Millisecond)
			}
			t.Logf("admitted %d in 3 minutes, per frontend %v, at most %d in a 60 s window", len(got), per, got.maxInWindow())
			if most := got.maxInWindow(); most > int(units) {
				t.Errorf("got %d admitted in one 60 s window, want at most %d", most, units)
			}
			first := 0
			for _, a := range got {
				if a < time.Minute {
					first++
				}
			}
			if min := int(float64(units) * 0.85); first < min || first > int(units) {
				t.Errorf("got %d admitted in the first minute, want %d to %d", first, min, units)
			}
			for k, n := range per {
				if tc.frontends > 1 && tc.limit > 1 && n == 0 {
					t.Errorf("frontend %d admitted nothing, want a share", k)
				}
			}
		})
	}
}

// TestTokensReservedAndGivenBack: a request reserves its tokens, a second
// one that does not fit is refused, the first one's unused tokens come
// back when it ends, and one larger than the burst is refused at once.
func TestTokensReservedAndGivenBack(t *testing.T) {
	_, kv := budgetsKV(t)
	c := &clock{now: time.Unix(1_800_000_000, 0)}
	l := newLimiter(t, kv, "fe-a", Budgets{Tenants: map[string]Budget{"alice": {TPM: 1000}}}, c, time.Minute)
	ctx := context.Background()
	g, st, err := l.Acquire(ctx, "alice", 80) // burst 100
	if err != nil {
		t.Fatalf("first: %v", err)
	}
	if st.Tokens.Limit != 1000 || st.Tokens.Remaining != 20 || st.Requests.Limit != 0 {
		t.Errorf("status after the first: got %+v, want tokens limit 1000 remaining 20 and no request budget", st)
	}
	var over *OverError
	if _, _, err := l.Acquire(ctx, "alice", 30); !errors.As(err, &over) || over.Resource != "tokens" {
		t.Fatalf("second: got %v, want over the tokens budget", err)
	}
	g.Release(10) // used 10 of 80
	if _, _, err := l.Acquire(ctx, "alice", 30); err != nil {
		t.Fatalf("after the give-back: %v", err)
	}
	if _, _, err := l.Acquire(ctx, "alice", 101); !errors.As(err, &over) || !over.TooLarge {
		t.Fatalf("larger than the burst: got %v, want too large", err)
	}
}

// TestDeadHolderLeaseEnds: a frontend that dies holding a slice of the
// budget holds it only until its lease ends; one that shuts down returns
// it at once, and nothing is counted twice.
func TestDeadHolderLeaseEnds(t *testing.T) {
	_, kv := budgetsKV(t)
	ctx := context.Background()
	const lease = 2 * time.Second
	b := Budgets{Default: Budget{RPM: 400}} // burst 40, slices of 10
	drain := func(l *Limiter, tenant string) int {
		n := 0
		for ; n < 100; n++ {
			if _, _, err := l.Acquire(ctx, tenant, 0); err != nil {
				return n
			}
		}
		return n
	}
	for _, tc := range []struct {
		name  string
		after time.Duration
		close bool
		want  int
	}{
		{"within its lease", lease / 2, false, 30 + 0}, // 40 less the dead one's slice of 10; refilled up to that cap
		{"after its lease", lease, false, 40},          // the slice is forgotten: the bucket refilled to its burst
		{"returned at shutdown", 0, true, 39},          // its slice less the one request it admitted
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &clock{now: time.Unix(1_800_000_000, 0)}
			tenant := "t" + string(rune('a'+len(tc.name)))
			a := newLimiter(t, kv, "fe-a", b, c, lease)
			if _, _, err := a.Acquire(ctx, tenant, 0); err != nil {
				t.Fatal(err)
			}
			if tc.close {
				if err := a.giveBack(ctx, tenant); err != nil {
					t.Fatal(err)
				}
			}
			c.advance(tc.after)
			bl := newLimiter(t, kv, "fe-b", b, c, lease)
			if got := drain(bl, tenant); got != tc.want {
				t.Errorf("got %d admitted through the other frontend, want %d", got, tc.want)
			}
		})
	}
}

// TestNoBudgetNoTraffic: a tenant without a per-minute budget is admitted
// without a key written.
func TestNoBudgetNoTraffic(t *testing.T) {
	_, kv := budgetsKV(t)
	c := &clock{now: time.Now()}
	l := newLimiter(t, kv, "fe-a", rpm("alice", 10), c, time.Minute)
	for range 100 {
		if _, st, err := l.Acquire(context.Background(), "bob", 1000); err != nil || st != (Status{}) {
			t.Fatalf("got %+v, %v, want admitted with no status", st, err)
		}
	}
	if _, err := kv.Get(context.Background(), tenantKey("bob")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("got %v for bob's key, want none written", err)
	}
}

// TestUnreachableFailsClosed: without the bucket a check fails (the edge
// answers 503), within the timeout, and is not taken for over budget.
func TestUnreachableFailsClosed(t *testing.T) {
	s, kv := budgetsKV(t)
	// The limiter's clock stands still: the second check below comes
	// within half the timeout of the first failure however loaded the
	// machine is.
	c := &clock{now: time.Unix(1_800_000_000, 0)}
	l, err := New(kv, nil, rpm("alice", 10), Config{Frontend: "fe-a", Timeout: 300 * time.Millisecond, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	s.Shutdown()
	s.WaitForShutdown()
	start := time.Now()
	_, _, first := l.Acquire(context.Background(), "alice", 0)
	var over *OverError
	if first == nil || errors.As(first, &over) {
		t.Fatalf("got %v, want an error reaching the bucket", first)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("took %v, want about the timeout", el)
	}
	// The next check right after fails at once, with the first's error:
	// requests queued behind a take that timed out do not each wait for
	// their own (a take of its own would fail with an error of its own).
	if _, _, err := l.Acquire(context.Background(), "alice", 0); err != first {
		t.Fatalf("second: got %v, want the first check's error %v at once", err, first)
	}
	// Past half the timeout, a check tries the bucket again.
	c.advance(200 * time.Millisecond)
	if _, _, err := l.Acquire(context.Background(), "alice", 0); err == nil || err == first || errors.As(err, &over) {
		t.Fatalf("third, past half the timeout: got %v, want an error of its own reaching the bucket", err)
	}
}

// TestConcurrentChecks: sixteen goroutines on two frontends checking at
// once, the clock still, admit no more than the burst between them.
func TestConcurrentChecks(t *testing.T) {
	_, kv := budgetsKV(t)
	c := &clock{now: time.Unix(1_800_000_000, 0)}
	b := rpm("alice", 400) // burst 40
	ls := []*Limiter{newLimiter(t, kv, "fe-a", b, c, time.Minute), newLimiter(t, kv, "fe-b", b, c, time.Minute)}
	var mu sync.Mutex
	admitted := 0
	var wg sync.WaitGroup
	for i := range 16 {
		l := ls[i%2]
		wg.Go(func() {
			for range 20 {
				_, _, err := l.Acquire(context.Background(), "alice", 0)
				var over *OverError
				switch {
				case err == nil:
					mu.Lock()
					admitted++
					mu.Unlock()
				case !errors.As(err, &over):
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if admitted < 30 || admitted > 40 {
		t.Errorf("got %d admitted, want 30 to the burst of 40 (a frontend may keep the rest of its slice)", admitted)
	}
}

// TestDifferingBudgetsAreNamed: a frontend whose budgets differ from
// another's names it, and stops once they agree.
func TestDifferingBudgetsAreNamed(t *testing.T) {
	_, kv := budgetsKV(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	a, _ := New(kv, nil, rpm("alice", 10), Config{Frontend: "fe-a"})
	b, _ := New(kv, nil, rpm("alice", 20), Config{Frontend: "fe-b"})
	for _, l := range []*Limiter{a, b} {
		wg.Go(func() { _ = l.Run(ctx) })
	}
	waitfor.Poll(t, "fe-a to name fe-b", func() bool { d := a.Differ(); return len(d) == 1 && d[0] == "fe-b" })
	b.SetBudgets(rpm("alice", 10))
	waitfor.Poll(t, "fe-a to agree", func() bool { return len(a.Differ()) == 0 && len(b.Differ()) == 0 })
}

// TestUsageSeesOtherFrontends: the usage read shows what another frontend
// took of the shared budget.
func TestUsageSeesOtherFrontends(t *testing.T) {
	_, kv := budgetsKV(t)
	c := &clock{now: time.Unix(1_800_000_000, 0)}
	b := Budgets{Default: Budget{RPM: 400, TPM: 10000}} // bursts 40 and 1000
	a := newLimiter(t, kv, "fe-a", b, c, time.Minute)
	o := newLimiter(t, kv, "fe-b", b, c, time.Minute)
	if _, _, err := a.Acquire(context.Background(), "alice", 100); err != nil {
		t.Fatal(err)
	}
	got, err := o.Usage(context.Background(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	// fe-a holds slices of 10 requests and 250 tokens.
	want := Status{Requests: Window{Limit: 400, Remaining: 30}, Tokens: Window{Limit: 10000, Remaining: 750}}
	if got.Requests.Limit != want.Requests.Limit || got.Requests.Remaining != want.Requests.Remaining ||
		got.Tokens.Limit != want.Tokens.Limit || got.Tokens.Remaining != want.Tokens.Remaining || got.Requests.Reset <= 0 {
		t.Errorf("got %+v, want %+v with a positive reset", got, want)
	}
}
