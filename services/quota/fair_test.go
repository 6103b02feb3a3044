package quota

import (
	"math"
	"testing"
	"testing/synctest"
	"time"
)

var t0 = time.Unix(1_800_000_000, 0)

// TestFairPicksLowestCounter: among the tenants queued here, the one with
// the lowest counter is chosen; ties go to the shorter queue, then the
// name.
func TestFairPicksLowestCounter(t *testing.T) {
	for _, tc := range []struct {
		name    string
		charges map[string]float64
		cands   []Candidate
		want    string
	}{
		{"lowest counter", map[string]float64{"a": 10, "b": 5}, []Candidate{{Tenant: "a", Queued: 1}, {Tenant: "b", Queued: 9}}, "b"},
		{"tie: the shorter queue", map[string]float64{"a": 5, "b": 5}, []Candidate{{Tenant: "a", Queued: 3}, {Tenant: "b", Queued: 1}}, "b"},
		{"tie: the name", map[string]float64{"a": 5, "b": 5}, []Candidate{{Tenant: "b", Queued: 2}, {Tenant: "a", Queued: 2}}, "a"},
		{"never served", map[string]float64{"a": 1}, []Candidate{{Tenant: "a", Queued: 1}, {Tenant: "c", Queued: 1}}, "c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFair("fe-1", time.Second)
			for tenant, u := range tc.charges {
				f.Charge(tenant, u)
			}
			got, hold := f.Pick(t0, tc.cands)
			if got.Tenant != tc.want || hold {
				t.Errorf("got %s (hold back %v), want %s and no hold-back", got.Tenant, hold, tc.want)
			}
		})
	}
}

// TestFairLiftsReturningTenant: a tenant that joins a queue while queued
// nowhere has its counter lifted to the lowest counter of the tenants
// queued, so that idle time earns no credit, and is not lowered when
// already above it; with nobody queued it is lifted to the highest known.
func TestFairLiftsReturningTenant(t *testing.T) {
	f := NewFair("fe-1", time.Second)
	f.Charge("a", 100)
	f.Charge("b", 40)
	f.Join(t0, "a", "m")
	f.Join(t0, "b", "m")
	if got := f.Counter("b"); got != 100 {
		t.Errorf("b joining behind a: counter %v, want lifted to a's 100", got)
	}
	f.Charge("c", 500)
	f.Join(t0, "c", "m")
	if got := f.Counter("c"); got != 500 {
		t.Errorf("c joining ahead: counter %v, want its own 500", got)
	}
	f.Join(t0, "b", "m") // already queued: no lift
	f.Charge("b", 1)
	if got := f.Counter("b"); got != 101 {
		t.Errorf("b joining again while queued: counter %v, want 101", got)
	}
	// b's queue empties while a request of hers runs: joining again is
	// not a return from idle, so she keeps what she is behind.
	f.Leave("b", nil)
	f.Leave("b", nil)
	f.Start("b")
	f.Charge("a", 50) // a, queued, moves ahead to 150
	f.Join(t0, "b", "m")
	if got := f.Counter("b"); got != 101 {
		t.Errorf("b joining with a request running: counter %v, want 101 (no lift)", got)
	}
	f.Done("b")
	f.Leave("b", nil)
	f.Join(t0, "b", "m")
	if got := f.Counter("b"); got != 150 {
		t.Errorf("b joining idle: counter %v, want lifted to a's 150", got)
	}
	g := NewFair("fe-1", time.Second)
	g.Charge("a", 70)
	g.Join(t0, "d", "m")
	if got := g.Counter("d"); got != 70 {
		t.Errorf("d joining with nobody queued: counter %v, want the highest known, 70", got)
	}
}

// TestFairLeaveAndRefund: Leave counts down the queue (never below 0), a
// negative charge gives back, and the counter never goes below 0.
func TestFairLeaveAndRefund(t *testing.T) {
	f := NewFair("fe-1", time.Second)
	f.Join(t0, "a", "m")
	f.Leave("a", nil)
	f.Leave("a", nil)
	f.Charge("a", 10)
	f.Charge("a", -4)
	if got := f.Counter("a"); got != 6 {
		t.Errorf("counter %v, want 6", got)
	}
	f.Charge("a", -100)
	if got := f.Counter("a"); got != 0 {
		t.Errorf("counter %v after a refund larger than the service, want 0", got)
	}
	if _, _, queued := f.Own(); queued {
		t.Error("Own says queued after every request left")
	}
}

// TestFairSharedCounters: another frontend's key adds its service to a
// tenant's counter and the largest lift wins; a frontend holds back while
// a tenant queued elsewhere is behind its best by more than one request's
// charge, and not once that frontend's key is stale or forgotten.
func TestFairSharedCounters(t *testing.T) {
	f1, f2 := NewFair("fe-1", time.Second), NewFair("fe-2", time.Second)
	f1.Charge("a", 30)
	f2.Charge("a", 12)
	f2.Charge("b", 10)
	f2.Join(t0, "b", "m")
	data, _, queued := f2.Own()
	if !queued {
		t.Fatal("fe-2's key does not say b is queued")
	}
	f1.Apply(t0, "fe-2", data)
	if got := f1.Counter("a"); got != 42 {
		t.Errorf("a's counter on fe-1: %v, want 30 + 12", got)
	}
	if !f1.QueuedElsewhere(t0, "m") || f1.QueuedElsewhere(t0, "other-model") {
		t.Error("QueuedElsewhere: want b's queue for model m only")
	}
	a := Candidate{Tenant: "a", Model: "m", Units: 5, Queued: 1}
	if _, hold := f1.Pick(t0, []Candidate{a}); !hold {
		t.Error("a at 42 with b queued at fe-2 at 12: want fe-1 to hold back")
	}
	if _, hold := f1.Pick(t0, []Candidate{{Tenant: "a", Model: "other-model", Units: 5}}); hold {
		t.Error("b queued for another model: want no hold-back")
	}
	if _, hold := f1.Pick(t0, []Candidate{{Tenant: "a", Model: "m", Units: 40}}); hold {
		t.Error("a's request charges 40, b is 30 behind: want no hold-back (the slack of one request)")
	}
	if _, hold := f1.Pick(t0.Add(2*time.Second), []Candidate{a}); hold {
		t.Error("fe-2's key is 2 s old (stale after 1 s): want no hold-back")
	}
	f1.Forget("fe-2")
	if got := f1.Counter("a"); got != 30 {
		t.Errorf("a's counter after fe-2 was forgotten: %v, want 30", got)
	}
	// A lift on one frontend counts on the other: b joins fe-1, which
	// knows no queue now, and is lifted to the highest counter it knows
	// (a's 30); on fe-2 b's counter is that lift plus the 10 served there.
	f1.Join(t0, "b", "m")
	d1, _, _ := f1.Own()
	f2.Apply(t0, "fe-1", d1)
	if got, want := f2.Counter("b"), 30.0+10; got != want {
		t.Errorf("b's counter on fe-2 after fe-1 lifted it by 30: %v, want %v", got, want)
	}
}

// TestFairSeed: a restart under the same id takes its service back.
func TestFairSeed(t *testing.T) {
	f := NewFair("fe-1", time.Second)
	f.Charge("a", 7)
	data, _, _ := f.Own()
	g := NewFair("fe-1", time.Second)
	g.Seed(data)
	g.Seed([]byte("not json"))
	if got := g.Counter("a"); got != 7 {
		t.Errorf("counter after Seed: %v, want 7", got)
	}
}

// simFrontend is one frontend of the simulation: its tenant and the
// requests it has queued (always some: the tenant sends more than it gets).
type simFrontend struct {
	fair   *Fair
	tenant string
	weight float64
	served float64 // tokens admitted
}

// TestFairTwoFrontendsWeighted simulates the case: tenant a
// (weight 4) only through frontend 1, b (weight 1) only through frontend
// 2, both always queued, a pool of two slots whose requests take 100 ms,
// and each frontend's key reaching the other every 100 ms (FairInterval)
// plus 20 ms on the way. Each frontend holds back as Pick says, for at
// most holdBack, and the tokens admitted come out 4:1 within 3% over a
// minute of virtual time; no slot stays free longer than the hold-back.
func TestFairTwoFrontendsWeighted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const tokens, slots = 40.0, 2
		const holdBack = 250 * time.Millisecond
		fs := []*simFrontend{
			{fair: NewFair("fe-1", FairStale), tenant: "a", weight: 4},
			{fair: NewFair("fe-2", FairStale), tenant: "b", weight: 1},
		}
		for _, s := range fs {
			s.fair.Join(time.Now(), s.tenant, "m")
		}
		start := time.Now()
		busyUntil := make([]time.Time, slots)
		heldSince := make([]time.Time, len(fs))
		var longestIdle time.Duration
		idleSince := make([]time.Time, slots)
		nextPublish := start
		type inFlight struct {
			at       time.Time
			from, to int
			data     []byte
		}
		var wire []inFlight
		for now := start; now.Sub(start) < time.Minute; now = now.Add(5 * time.Millisecond) {
			time.Sleep(now.Sub(time.Now())) // synctest: virtual time moves to now
			if !now.Before(nextPublish) {
				for i, s := range fs {
					data, _, _ := s.fair.Own()
					wire = append(wire, inFlight{at: now.Add(20 * time.Millisecond), from: i, to: 1 - i, data: data})
				}
				nextPublish = now.Add(FairInterval)
			}
			kept := wire[:0]
			for _, m := range wire {
				if now.Before(m.at) {
					kept = append(kept, m)
					continue
				}
				fs[m.to].fair.Apply(now, fs[m.from].fair.self, m.data)
			}
			wire = kept
			for k := range busyUntil {
				if now.Before(busyUntil[k]) {
					continue
				}
				if idleSince[k].IsZero() {
					idleSince[k] = now
				}
				// The free slot: every frontend sees it; the first
				// (in turn, as events race) that does not hold back takes it.
				for j := range fs {
					i := (j + int(now.UnixMilli()/5)) % len(fs)
					s := fs[i]
					units := tokens / s.weight
					_, hold := s.fair.Pick(now, []Candidate{{Tenant: s.tenant, Model: "m", Units: units, Queued: 5}})
					if hold {
						if heldSince[i].IsZero() {
							heldSince[i] = now
						}
						if now.Sub(heldSince[i]) < holdBack {
							continue
						}
					}
					heldSince[i] = time.Time{}
					s.fair.Charge(s.tenant, units)
					s.served += tokens
					busyUntil[k] = now.Add(100 * time.Millisecond)
					longestIdle = max(longestIdle, now.Sub(idleSince[k]))
					idleSince[k] = time.Time{}
					break
				}
			}
		}
		ratio := fs[0].served / fs[1].served
		t.Logf("a %v tokens, b %v tokens: %.3f:1; a slot stayed free at most %v", fs[0].served, fs[1].served, ratio, longestIdle)
		if math.Abs(ratio-4)/4 > 0.03 {
			t.Errorf("got %.3f:1, want 4:1 within 3%%", ratio)
		}
		if longestIdle > holdBack+5*time.Millisecond {
			t.Errorf("a slot stayed free %v, want at most the hold-back %v", longestIdle, holdBack)
		}
	})
}
