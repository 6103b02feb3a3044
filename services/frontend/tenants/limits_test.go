package tenants

import (
	"testing"
	"testing/synctest"
	"time"
)

func TestTenantRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimits(0, 2) // 2/s, burst 2
		now := func() time.Time { return time.Now() }
		for i := range 2 {
			if _, ok := l.allow("alice", now()); !ok {
				t.Fatalf("request %d of the burst refused", i)
			}
		}
		wait, ok := l.allow("alice", now())
		if ok || wait != 500*time.Millisecond {
			t.Fatalf("third request: got ok=%v wait %v, want refused with 500ms", ok, wait)
		}
		if RetryAfter(wait) != "1" {
			t.Errorf("Retry-After = %s, want 1", RetryAfter(wait))
		}
		if _, ok := l.allow("bob", now()); !ok {
			t.Error("bob is limited by alice's rate")
		}
		time.Sleep(499 * time.Millisecond)
		if _, ok := l.allow("alice", now()); ok {
			t.Error("a token came back before 500ms")
		}
		time.Sleep(time.Millisecond)
		if _, ok := l.allow("alice", now()); !ok {
			t.Error("no token after 500ms")
		}
		time.Sleep(time.Hour)
		n := 0
		for ; n < 10; n++ {
			if _, ok := l.allow("alice", now()); !ok {
				break
			}
		}
		if n != 2 {
			t.Errorf("after an idle hour %d requests passed, want the burst of 2", n)
		}
	})
}

func TestTenantRateSlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimits(0, 0.25) // one per 4s, burst 1
		l.allow("alice", time.Now())
		wait, ok := l.allow("alice", time.Now())
		if ok || RetryAfter(wait) != "4" {
			t.Errorf("got ok=%v Retry-After %s, want refused with 4", ok, RetryAfter(wait))
		}
	})
}

func TestTenantConcurrency(t *testing.T) {
	l := newLimits(2, 0)
	if !l.acquire("alice") || !l.acquire("alice") {
		t.Fatal("alice's two slots refused")
	}
	if l.acquire("alice") {
		t.Fatal("a third slot granted")
	}
	if !l.acquire("bob") {
		t.Fatal("bob refused for alice's use")
	}
	l.release("alice")
	if !l.acquire("alice") {
		t.Fatal("a released slot was not given back")
	}
	unlimited := newLimits(0, 0)
	for range 100 {
		if !unlimited.acquire("x") {
			t.Fatal("unlimited refused")
		}
	}
}

// TestTenantConcurrencyPerTenant: a budgets file's concurrent=N caps its
// tenant in place of --tenant-max-concurrent, and a reload changes it.
func TestTenantConcurrencyPerTenant(t *testing.T) {
	for _, tc := range []struct {
		name    string
		global  int
		caps    map[string]int
		tenant  string
		wantMax int // -1: unlimited (100 granted)
	}{
		{"a line without a global cap", 0, map[string]int{"alice": 1}, "alice", 1},
		{"no line, no global cap", 0, map[string]int{"alice": 1}, "bob", -1},
		{"a line above the global cap", 2, map[string]int{"alice": 5}, "alice", 5},
		{"no line under a global cap", 2, map[string]int{"alice": 5}, "bob", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLimits(tc.global, 0)
			l.setPerTenant(tc.caps)
			got := 0
			for got < 100 && l.acquire(tc.tenant) {
				got++
			}
			want := tc.wantMax
			if want < 0 {
				want = 100
			}
			if got != want {
				t.Fatalf("got %d slots, want %d", got, want)
			}
			l.release(tc.tenant)
			if !l.acquire(tc.tenant) {
				t.Error("a released slot was not given back")
			}
		})
	}
	l := newLimits(0, 0)
	l.setPerTenant(map[string]int{"alice": 1})
	if !l.acquire("alice") || l.acquire("alice") {
		t.Fatal("alice's one slot: want one granted, the second refused")
	}
	l.setPerTenant(map[string]int{"alice": 2}) // a reload: the slot held stays counted
	if !l.acquire("alice") || l.acquire("alice") {
		t.Fatal("after the reload to 2: want one more granted, then refused")
	}
}
