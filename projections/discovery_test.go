package projections_test

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

func lease(worker, leaseID, model string) *events.Lease {
	return &events.Lease{WorkerID: worker, LeaseID: leaseID, Model: model, PID: 7, Host: "h", TTLMS: 3000}
}

func notReady(l *events.Lease) *events.Lease { l.NotReady = true; return l }

// step is one input to a Discovery: exactly one field is set.
type step struct {
	lease *projections.LeaseUpdate
	load  *projections.LoadUpdate
	event events.Event
}

func put(rev uint64, l *events.Lease) step {
	return step{lease: &projections.LeaseUpdate{Key: l.WorkerID, Revision: rev, Lease: l}}
}

func del(rev uint64, key string) step {
	return step{lease: &projections.LeaseUpdate{Key: key, Revision: rev}}
}

func load(key string, active int) step {
	return step{load: &projections.LoadUpdate{Key: key, Load: &events.Load{WorkerID: key, ActiveRequests: active}}}
}

func ev(e events.Event) step { return step{event: e} }

func discover(steps ...step) *projections.Discovery {
	d := projections.NewDiscovery()
	var seq uint64
	for _, s := range steps {
		switch {
		case s.lease != nil:
			d.ApplyLease(*s.lease)
		case s.load != nil:
			d.ApplyLoad(*s.load)
		default:
			seq++
			d.Apply(events.Envelope{ID: events.ID("w", seq), Source: "test", Event: s.event, Seq: seq})
		}
	}
	return d
}

func TestDiscovery(t *testing.T) {
	tests := []struct {
		name         string
		steps        []step
		wantListed   []string // worker ids, sorted
		wantRoutable []string // routable for model "m"
	}{
		{"lease put is routable", []step{put(1, lease("w1", "l1", "m"))}, []string{"w1"}, []string{"w1"}},
		{"lease delete removes", []step{put(1, lease("w1", "l1", "m")), del(2, "w1")}, nil, nil},
		{"delete of an unknown key", []step{del(1, "w9")}, nil, nil},
		{"draining lease listed not routable", []step{put(1, func() *events.Lease { l := lease("w1", "l1", "m"); l.Draining = true; return l }())}, []string{"w1"}, nil},
		{"draining event listed not routable", []step{put(1, lease("w1", "l1", "m")), ev(events.WorkerDraining{WorkerID: "w1", LeaseID: "l1"})}, []string{"w1"}, nil},
		{"lost event listed not routable", []step{put(1, lease("w1", "l1", "m")), ev(events.WorkerLost{WorkerID: "w1", LeaseID: "l1"})}, []string{"w1"}, nil},
		{"deregistered event listed not routable", []step{put(1, lease("w1", "l1", "m")), ev(events.WorkerDeregistered{WorkerID: "w1", LeaseID: "l1"})}, []string{"w1"}, nil},
		{"event before lease put still ends it", []step{ev(events.WorkerLost{WorkerID: "w1", LeaseID: "l1"}), put(1, lease("w1", "l1", "m"))}, []string{"w1"}, nil},
		{"lease renewal keeps an ended lease out", []step{put(1, lease("w1", "l1", "m")), ev(events.WorkerDraining{WorkerID: "w1", LeaseID: "l1"}), put(2, lease("w1", "l1", "m"))}, []string{"w1"}, nil},
		{"event for an older lease ignored", []step{put(1, lease("w1", "l2", "m")), ev(events.WorkerLost{WorkerID: "w1", LeaseID: "l1"})}, []string{"w1"}, []string{"w1"}},
		{"new lease after loss is routable", []step{put(1, lease("w1", "l1", "m")), ev(events.WorkerLost{WorkerID: "w1", LeaseID: "l1"}), put(2, lease("w1", "l2", "m"))}, []string{"w1"}, []string{"w1"}},
		{"new lease after delete is routable", []step{put(1, lease("w1", "l1", "m")), ev(events.WorkerLost{WorkerID: "w1", LeaseID: "l1"}), del(2, "w1"), put(3, lease("w1", "l2", "m"))}, []string{"w1"}, []string{"w1"}},
		{"stale lease revision ignored", []step{put(1, lease("w1", "l1", "m")), del(3, "w1"), put(2, lease("w1", "l1", "m"))}, nil, nil},
		{"other models not routable for m", []step{put(1, lease("w2", "l2", "other")), put(2, lease("w1", "l1", "m"))}, []string{"w1", "w2"}, []string{"w1"}},
		{"not-ready lease listed not routable", []step{put(1, notReady(lease("w1", "l1", "m")))}, []string{"w1"}, nil},
		{"lease becoming not ready leaves routing", []step{put(1, lease("w1", "l1", "m")), put(2, notReady(lease("w1", "l1", "m")))}, []string{"w1"}, nil},
		{"lease ready again is routable", []step{put(1, lease("w1", "l1", "m")), put(2, notReady(lease("w1", "l1", "m"))), put(3, lease("w1", "l1", "m"))}, []string{"w1"}, []string{"w1"}},
		{"ready again after draining stays out", []step{put(1, notReady(lease("w1", "l1", "m"))), ev(events.WorkerDraining{WorkerID: "w1", LeaseID: "l1"}), put(2, lease("w1", "l1", "m"))}, []string{"w1"}, nil},
		{"non-lifecycle event ignored", []step{put(1, lease("w1", "l1", "m")), ev(events.WorkerRegistered{WorkerID: "w1", LeaseID: "l1"})}, []string{"w1"}, []string{"w1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := discover(tt.steps...)
			if got := ids(d.Workers()); !slices.Equal(got, tt.wantListed) {
				t.Errorf("got workers %v, want %v", got, tt.wantListed)
			}
			if got := ids(d.Routable("m")); !slices.Equal(got, tt.wantRoutable) {
				t.Errorf("got routable %v, want %v", got, tt.wantRoutable)
			}
			for _, w := range d.Workers() {
				if want := slices.Contains(tt.wantRoutable, w.ID); w.Model == "m" && w.Routable() != want {
					t.Errorf("worker %s: got Routable() %v (state %s), want %v", w.ID, w.Routable(), w.State, want)
				}
			}
		})
	}
}

func ids(ws []projections.Worker) []string {
	var out []string
	for _, w := range ws {
		out = append(out, w.ID)
	}
	return out
}

func TestDiscoveryNotReadyState(t *testing.T) {
	d := discover(put(1, notReady(lease("w1", "l1", "m"))))
	if w, _ := d.Get("w1"); w.State != projections.WorkerNotReady {
		t.Errorf("got state %q, want %q", w.State, projections.WorkerNotReady)
	}
	l := notReady(lease("w1", "l1", "m"))
	l.NotReadyReason = "canary_failed"
	d = discover(put(1, l))
	if w, _ := d.Get("w1"); w.Reason != "canary_failed" {
		t.Errorf("got reason %q, want canary_failed", w.Reason)
	}
	d = discover(put(1, notReady(lease("w1", "l1", "m"))), put(2, lease("w1", "l1", "m")))
	if w, _ := d.Get("w1"); w.State != projections.WorkerReady || w.Reason != "" {
		t.Errorf("ready again: got state %q reason %q, want ready and no reason", w.State, w.Reason)
	}
	l = notReady(lease("w1", "l1", "m"))
	l.Draining = true
	d = discover(put(1, l))
	if w, _ := d.Get("w1"); w.State != projections.WorkerDraining {
		t.Errorf("draining and not ready: got state %q, want %q (draining wins)", w.State, projections.WorkerDraining)
	}
}

func TestDiscoveryLoad(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
		want  int // active requests on w1
	}{
		{"load after lease", []step{put(1, lease("w1", "l1", "m")), load("w1", 3)}, 3},
		{"load before lease", []step{load("w1", 2), put(1, lease("w1", "l1", "m"))}, 2},
		{"latest load wins", []step{put(1, lease("w1", "l1", "m")), load("w1", 3), load("w1", 5)}, 5},
		{"load survives lease renewal", []step{put(1, lease("w1", "l1", "m")), load("w1", 4), put(2, lease("w1", "l1", "m"))}, 4},
		{"other worker's load", []step{put(1, lease("w1", "l1", "m")), load("w2", 9)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, ok := discover(tt.steps...).Get("w1")
			if !ok {
				t.Fatal("w1 not found")
			}
			if got := w.Load.ActiveRequests; got != tt.want {
				t.Errorf("got active requests %d, want %d", got, tt.want)
			}
		})
	}
}

func TestDiscoveryWorkerFields(t *testing.T) {
	l := lease("w1", "l1", "m")
	l.ClientID, l.Server, l.Priority = 12, "srv", 2
	d := discover(put(7, l), load("w1", 1))
	got, ok := d.Get("w1")
	want := projections.Worker{ID: "w1", LeaseID: "l1", Model: "m", State: projections.WorkerReady, PID: 7, Host: "h",
		LeaseTTL: "3s", LeaseRevision: 7, ClientID: 12, Server: "srv", Load: events.Load{WorkerID: "w1", ActiveRequests: 1}, Priority: 2}
	if !ok || !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v %v, want %+v", got, ok, want)
	}
	got.State = projections.WorkerDraining
	if w, _ := d.Get("w1"); !w.Routable() {
		t.Error("Get returned an alias: editing the copy changed the view")
	}
	if _, ok := d.Get("w9"); ok {
		t.Error("got unknown worker w9, want none")
	}
}

func TestDiscoveryModels(t *testing.T) {
	draining := lease("w3", "l3", "c")
	draining.Draining = true
	d := discover(put(1, lease("w2", "l2", "b")), put(2, lease("w1", "l1", "a")), put(3, lease("w4", "l4", "a")), put(4, draining))
	if got, want := d.Models(), []string{"a", "b", "c"}; !slices.Equal(got, want) {
		t.Errorf("got models %v, want %v", got, want)
	}
	if got, want := ids(d.Routable("a")), []string{"w1", "w4"}; !slices.Equal(got, want) {
		t.Errorf("got routable a %v, want %v", got, want)
	}
	if got := d.Routable("c"); len(got) != 0 {
		t.Errorf("got routable c %v, want none (draining)", ids(got))
	}
	if got := d.Routable("z"); len(got) != 0 {
		t.Errorf("got routable z %v, want none", ids(got))
	}
	if got := projections.NewDiscovery().Models(); len(got) != 0 {
		t.Errorf("empty view: got models %v, want none", got)
	}
}

func TestDiscoveryApplyIdempotent(t *testing.T) {
	d := discover(put(1, lease("w1", "l1", "m")))
	lost := events.Envelope{ID: "x", Source: "test", Seq: 5, Event: events.WorkerLost{WorkerID: "w1", LeaseID: "l1"}}
	if !d.Apply(lost) {
		t.Fatal("first apply: got unchanged, want changed")
	}
	// A new lease, then a replay of the old event: the replay is skipped.
	d.ApplyLease(projections.LeaseUpdate{Key: "w1", Revision: 2, Lease: lease("w1", "l1", "m")})
	d.ApplyLease(projections.LeaseUpdate{Key: "w1", Revision: 3, Lease: lease("w1", "l2", "m")})
	if d.Apply(lost) {
		t.Error("replayed event: got changed, want unchanged")
	}
	older := lost
	older.Seq = 4
	older.Event = events.WorkerDraining{WorkerID: "w1", LeaseID: "l2"}
	if d.Apply(older) {
		t.Error("older event: got changed, want unchanged")
	}
	if w, _ := d.Get("w1"); !w.Routable() {
		t.Errorf("got state %s, want ready", w.State)
	}
	if d.ApplyLease(projections.LeaseUpdate{Key: "w1", Revision: 3, Lease: lease("w1", "l3", "m")}) {
		t.Error("replayed lease revision: got changed, want unchanged")
	}
}

// TestDiscoveryQuarantine: a WorkerLost with QuarantineMS keeps the worker
// id out of routing, whatever lease it registers, until a lease write
// after the quarantine's end; it must be on the worker's own subject.
func TestDiscoveryQuarantine(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(rev uint64, l *events.Lease, when time.Time) projections.LeaseUpdate {
		return projections.LeaseUpdate{Key: l.WorkerID, Revision: rev, Lease: l, Time: when}
	}
	quarantine := func(d *projections.Discovery, seq uint64, subject, worker string) (bool, string) {
		return d.Fold(events.Envelope{ID: events.ID("q", seq), Source: "test", Time: t0, Seq: seq, Stored: subject,
			Event: events.WorkerLost{WorkerID: worker, LeaseID: "l1", Reason: "junk", QuarantineMS: 60_000}})
	}
	d := projections.NewDiscovery()
	d.ApplyLease(at(1, lease("w1", "l1", "m"), t0))
	d.ApplyLease(at(2, lease("w2", "l2", "m"), t0))

	if changed, why := quarantine(d, 1, "baton.workers.w2.events", "w1"); changed || why != projections.IgnoredNotWorkersSubject {
		t.Fatalf("w2 quarantining w1: changed %v, why %q; want ignored", changed, why)
	}
	if changed, why := quarantine(d, 2, "baton.workers.w1.events", "w1"); !changed || why != "" {
		t.Fatalf("a frontend quarantining w1: changed %v, why %q", changed, why)
	}
	w, _ := d.Get("w1")
	if w.State != projections.WorkerQuarantined || w.Reason == "" || w.Routable() {
		t.Errorf("w1 after its quarantine: %+v, want quarantined with a reason", w)
	}
	// Its lease revoked, a new one registered within the quarantine.
	d.ApplyLease(projections.LeaseUpdate{Key: "w1", Revision: 3})
	d.ApplyLease(at(4, lease("w1", "l9", "m"), t0.Add(30*time.Second)))
	if got := ids(d.Routable("m")); !slices.Equal(got, []string{"w2"}) {
		t.Errorf("routable within the quarantine: %v, want [w2]", got)
	}
	if got := d.Quarantined(t0.Add(59 * time.Second)); !slices.Equal(got, []string{"w1"}) {
		t.Errorf("Quarantined within it: %v", got)
	}
	if got := d.Quarantined(t0.Add(61 * time.Second)); len(got) != 0 {
		t.Errorf("Quarantined after it: %v", got)
	}
	// A renewal after the end lifts it.
	d.ApplyLease(at(5, lease("w1", "l9", "m"), t0.Add(61*time.Second)))
	if got := ids(d.Routable("m")); !slices.Equal(got, []string{"w1", "w2"}) {
		t.Errorf("routable after the quarantine: %v, want [w1 w2]", got)
	}
}

// TestDiscoveryQuarantineRecord: a view started after the quarantined
// worker registered again sees the last message of each workers subject:
// its own registered event on baton.workers.w1.events (which buried the
// quarantine there) and the frontend's record on baton.workers.w1.quarantine,
// which keeps it out of routing. A record on another worker's quarantine
// subject, or of another event type, is ignored.
func TestDiscoveryQuarantineRecord(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	record := func(seq uint64, subject, worker string, ms int64) events.Envelope {
		return events.Envelope{ID: events.ID("q", seq), Source: "test", Time: t0, Seq: seq, Stored: subject,
			Event: events.WorkerLost{WorkerID: worker, LeaseID: "l1", Reason: "junk", QuarantineMS: ms}}
	}
	d := projections.NewDiscovery()
	d.ApplyLease(projections.LeaseUpdate{Key: "w1", Revision: 1, Lease: lease("w1", "l2", "m"), Time: t0.Add(time.Second)})
	d.ApplyLease(projections.LeaseUpdate{Key: "w2", Revision: 2, Lease: lease("w2", "l3", "m"), Time: t0.Add(time.Second)})
	if changed, why := d.Fold(record(1, streams.WorkerQuarantine("w2"), "w1", 60_000)); changed || why != projections.IgnoredNotWorkersSubject {
		t.Errorf("w1's record on w2's quarantine subject: changed %v, why %q; want ignored", changed, why)
	}
	if changed, why := d.Fold(record(2, streams.WorkerQuarantine("w1"), "w1", 0)); changed || why != projections.IgnoredNotWorkersSubject {
		t.Errorf("a lost event without a quarantine on the quarantine subject: changed %v, why %q; want ignored", changed, why)
	}
	d.Fold(events.Envelope{ID: "reg", Source: "test", Time: t0.Add(time.Second), Seq: 3, Stored: streams.WorkerEvents("w1"),
		Event: events.WorkerRegistered{WorkerID: "w1", LeaseID: "l2"}})
	if changed, why := d.Fold(record(4, streams.WorkerQuarantine("w1"), "w1", 60_000)); !changed || why != "" {
		t.Fatalf("w1's quarantine record: changed %v, why %q", changed, why)
	}
	if got := ids(d.Routable("m")); !slices.Equal(got, []string{"w2"}) {
		t.Errorf("routable: %v, want [w2]", got)
	}
	if w, _ := d.Get("w1"); w.State != projections.WorkerQuarantined || w.LeaseID != "l2" {
		t.Errorf("w1: %+v, want quarantined under its new lease (the record ends no lease)", w)
	}
	var l projections.WorkerLog
	if why := l.Check(record(4, streams.WorkerQuarantine("w1"), "w1", 60_000)); why != "" {
		t.Errorf("WorkerLog.Check of the record: %q", why)
	}
}

// TestDiscoveryLost: a worker whose key goes without its leaving in order
// is listed by Lost (never by Workers), with when and why; one that drained
// and deregistered is not.
func TestDiscoveryLost(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	gone := func(rev uint64, key string, expired bool) step {
		return step{lease: &projections.LeaseUpdate{Key: key, Revision: rev, Time: at, Expired: expired}}
	}
	draining := func() *events.Lease { l := lease("w1", "l1", "m"); l.Draining = true; return l }
	lost := func(reason string) step { return ev(events.WorkerLost{WorkerID: "w1", LeaseID: "l1", Reason: reason}) }
	deregistered := ev(events.WorkerDeregistered{WorkerID: "w1", LeaseID: "l1"})
	tests := []struct {
		name       string
		steps      []step
		wantReason string // "": not lost
		wantListed []string
	}{
		{"revoked, then recorded lost", []step{put(1, lease("w1", "l1", "m")), gone(2, "w1", false), lost("disconnected: Client Closed")}, "disconnected: Client Closed", nil},
		{"revoked, no event yet", []step{put(1, lease("w1", "l1", "m")), gone(2, "w1", false)}, "lease revoked", nil},
		{"expired", []step{put(1, lease("w1", "l1", "m")), gone(2, "w1", true)}, "lease expired", nil},
		{"recorded lost before its key went", []step{put(1, lease("w1", "l1", "m")), lost("disconnected: x"), gone(2, "w1", false)}, "disconnected: x", nil},
		{"drained, revoked its key, deregistered", []step{put(1, lease("w1", "l1", "m")), put(2, draining()), gone(3, "w1", false), deregistered}, "", nil},
		{"drained, revoked its key, no event yet", []step{put(1, lease("w1", "l1", "m")), put(2, draining()), gone(3, "w1", false)}, "", nil},
		{"deregistered before its key went", []step{put(1, lease("w1", "l1", "m")), deregistered, gone(2, "w1", false)}, "", nil},
		{"killed while draining, recorded lost", []step{put(1, draining()), gone(2, "w1", false), lost("disconnected: EOF")}, "disconnected: EOF", nil},
		{"expired while draining", []step{put(1, draining()), gone(2, "w1", true)}, "lease expired", nil},
		{"revoked without draining, then deregistered", []step{put(1, lease("w1", "l1", "m")), gone(2, "w1", false), deregistered}, "", nil},
		{"expired, then deregistered: still lost", []step{put(1, lease("w1", "l1", "m")), gone(2, "w1", true), deregistered}, "lease expired", nil},
		{"recorded lost, then deregistered: still lost", []step{put(1, lease("w1", "l1", "m")), gone(2, "w1", false), lost("r"), deregistered}, "r", nil},
		{"a lost event of an older lease changes nothing", []step{put(1, lease("w1", "l2", "m")), gone(2, "w1", false), lost("old")}, "lease revoked", nil},
		{"registered again", []step{put(1, lease("w1", "l1", "m")), gone(2, "w1", true), put(3, lease("w1", "l2", "m"))}, "", []string{"w1"}},
		{"an unknown key's deletion", []step{gone(1, "w1", true)}, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := discover(tt.steps...)
			if got := ids(d.Workers()); !slices.Equal(got, tt.wantListed) {
				t.Errorf("got workers %v, want %v", got, tt.wantListed)
			}
			got := d.Lost()
			if tt.wantReason == "" {
				if len(got) != 0 {
					t.Fatalf("got lost %+v, want none", got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("got lost %+v, want w1", got)
			}
			if w := got[0]; w.ID != "w1" || w.State != projections.WorkerLost || w.Reason != tt.wantReason || !w.Departed.Equal(at) || w.Model != "m" || w.Routable() {
				t.Errorf("got %+v, want w1 of model m lost at %v: %s", w, at, tt.wantReason)
			}
		})
	}
}

// TestDiscoveryLostChanges: the lost event that follows a key's revocation
// is a change (the console shows the reason); its replay is not.
func TestDiscoveryLostChanges(t *testing.T) {
	d := discover(put(1, lease("w1", "l1", "m")))
	d.ApplyLease(projections.LeaseUpdate{Key: "w1", Revision: 2})
	e := events.Envelope{ID: "x", Source: "test", Seq: 1, Event: events.WorkerLost{WorkerID: "w1", LeaseID: "l1", Reason: "disconnected"}}
	if changed, why := d.Fold(e); !changed {
		t.Errorf("lost after the revocation: got unchanged (%s), want changed", why)
	}
	e.ID, e.Seq = "y", 2
	if changed, why := d.Fold(e); changed || why != projections.NoEffect {
		t.Errorf("the same loss again: got changed %v (%q), want %q", changed, why, projections.NoEffect)
	}
}

// TestDiscoveryLostBound: a view remembers the 64 most recent departures.
func TestDiscoveryLostBound(t *testing.T) {
	d := projections.NewDiscovery()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var rev uint64
	for i := range 70 {
		id := fmt.Sprintf("w%02d", i)
		rev++
		d.ApplyLease(projections.LeaseUpdate{Key: id, Revision: rev, Lease: lease(id, "l", "m")})
		rev++
		d.ApplyLease(projections.LeaseUpdate{Key: id, Revision: rev, Time: at.Add(time.Duration(i) * time.Second), Expired: true})
	}
	got := ids(d.Lost())
	if len(got) != 64 || got[0] != "w06" || got[63] != "w69" {
		t.Errorf("got %d lost, %v…%v; want the 64 most recent, w06…w69", len(got), got[0], got[len(got)-1])
	}
}
