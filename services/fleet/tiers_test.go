package fleet

import (
	"errors"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/promtext"
	"github.com/baton-dev/baton/projections"
	"github.com/prometheus/client_golang/prometheus"
)

// tieredFleet is a fleet view holding the given leases (no NATS: Pick and
// Admit read only the view and the router), its metrics on their own
// registry.
func tieredFleet(t *testing.T, cfg Config, leases ...*events.Lease) (*Fleet, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	f := &Fleet{cfg: cfg.withDefaults(), disc: newDiscovery(nil), m: m}
	f.router = newRouter(f.cfg, time.Now)
	for i, l := range leases {
		f.disc.update(func(v *projections.Discovery) bool {
			return v.ApplyLease(projections.LeaseUpdate{Key: l.WorkerID, Revision: uint64(i + 1), Lease: l, Time: time.Now()})
		})
	}
	return f, reg
}

func tieredLease(id string, priority int) *events.Lease {
	return &events.Lease{WorkerID: id, LeaseID: "lease-" + id, Model: "mock", TTLMS: 10000, Priority: priority}
}

// fallbacks reads baton_frontend_fallback_dispatches_total{model="mock"}.
func fallbacks(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	v, err := promtext.Gathered(reg, "baton_frontend_fallback_dispatches_total", "model", "mock")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestPickTiers: Fleet.Pick routes by tier, counts a dispatch that went to
// a lower tier than the highest routable one (and none other), and a
// pinned dispatch ignores tiers.
func TestPickTiers(t *testing.T) {
	d := events.Dispatch{RequestID: "r", Model: "mock", Endpoint: events.EndpointCompletions}
	pick := func(t *testing.T, f *Fleet, d events.Dispatch, pinned string, exclude ...string) string {
		t.Helper()
		w, done, err := f.Pick(d, pinned, exclude)
		if err != nil {
			t.Fatalf("pick: %v", err)
		}
		done()
		return w.ID
	}

	t.Run("the primary, then the fallback while it cannot, counted", func(t *testing.T) {
		f, reg := tieredFleet(t, Config{}, tieredLease("p", 1), tieredLease("f", 0))
		if got := pick(t, f, d, ""); got != "p" {
			t.Fatalf("picked %s, want the primary p", got)
		}
		if n := fallbacks(t, reg); n != 0 {
			t.Fatalf("fallback dispatches %v after a pick of the top tier, want 0", n)
		}
		p, _ := f.Worker("p")
		f.Inhibit(p, 0)
		if got := pick(t, f, d, ""); got != "f" {
			t.Fatalf("picked %s with the primary inhibited, want the fallback f", got)
		}
		migration := d
		migration.Attempt, migration.StartOffset = 1, 3
		if got := pick(t, f, migration, "", "p"); got != "f" {
			t.Fatalf("a migration away from the primary picked %s, want f", got)
		}
		if n := fallbacks(t, reg); n != 2 {
			t.Fatalf("fallback dispatches %v, want 2", n)
		}
	})

	for _, tc := range []struct {
		name          string
		top           func(*events.Lease) // what keeps the primary p from the request
		wantFallbacks float64
	}{
		{"a top tier out of routing is not a fallback (f is the highest routable tier)", func(l *events.Lease) { l.NotReady = true }, 0},
		{"a top tier that cannot run the request is passed over, counted", func(l *events.Lease) { l.Capabilities = &events.Capabilities{Chat: true} }, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			top := tieredLease("p", 1)
			tc.top(top)
			f, reg := tieredFleet(t, Config{}, top, tieredLease("f", 0))
			if got := pick(t, f, d, ""); got != "f" {
				t.Fatalf("a completion picked %s, want f", got)
			}
			if n := fallbacks(t, reg); n != tc.wantFallbacks {
				t.Fatalf("fallback dispatches %v, want %v", n, tc.wantFallbacks)
			}
		})
	}

	t.Run("pinned ignores tiers", func(t *testing.T) {
		f, reg := tieredFleet(t, Config{}, tieredLease("p", 1), tieredLease("f", 0))
		for range 10 {
			if got := pick(t, f, d, "f"); got != "f" {
				t.Fatalf("pinned to f, picked %s", got)
			}
		}
		if n := fallbacks(t, reg); n != 0 {
			t.Fatalf("fallback dispatches %v after pinned dispatches, want 0", n)
		}
		if err := f.Admit("mock", "f"); err != nil {
			t.Fatalf("admit pinned to the fallback: %v", err)
		}
	})

	t.Run("admit: busy only when every tier is", func(t *testing.T) {
		half := 0.5
		full := events.Load{WorkerID: "p", KVBlocksUsed: 9, KVBlocksTotal: 10}
		f, _ := tieredFleet(t, Config{ActiveDecodeBlocksThreshold: &half}, tieredLease("p", 1), tieredLease("f", 0))
		f.disc.updateLoad(func(v *projections.Discovery) bool { return v.ApplyLoad(projections.LoadUpdate{Key: "p", Load: &full}) })
		if err := f.Admit("mock", ""); err != nil {
			t.Fatalf("admit with the top tier busy and the fallback free: %v, want admitted", err)
		}
		if got := pick(t, f, d, ""); got != "f" {
			t.Fatalf("picked %s with the primary busy, want f", got)
		}
		fullF := full
		fullF.WorkerID = "f"
		f.disc.updateLoad(func(v *projections.Discovery) bool {
			return v.ApplyLoad(projections.LoadUpdate{Key: "f", Load: &fullF})
		})
		if err := f.Admit("mock", ""); !errors.Is(err, ErrAllBusy) {
			t.Fatalf("admit with every tier busy: %v, want ErrAllBusy", err)
		}
	})
}
