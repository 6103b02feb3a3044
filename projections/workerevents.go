package projections

import (
	"fmt"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
)

// Why a worker lifecycle event changed nothing, as Discovery.Fold and
// WorkerLog.Check report it.
const (
	// IgnoredNotWorkersSubject: the event names a worker other than the one
	// whose subject (baton.workers.<id>.events) it is stored on. NATS
	// permissions let a worker write only its own subject, so this is one
	// worker speaking for another (a forged draining, lost or deregistered).
	IgnoredNotWorkersSubject = "ignored (not the named worker's subject)"
	// IgnoredNotCurrentLease: the event ends a lease the worker no longer
	// (or never) holds.
	IgnoredNotCurrentLease = "ignored (not the worker's current lease)"
	// NoEffectNoLease: the worker holds no lease this view has seen yet;
	// the event ends that lease if its key comes later.
	NoEffectNoLease = "no effect (no lease seen yet)"
	// NoEffectDraining: the worker is already out of routing.
	NoEffectDraining = "no effect (already draining)"
)

// MisplacedWorkerEvent says why a worker event may not be folded from the
// subject it is stored on, or "" if it may: a worker event counts only from
// the events subject of the worker its body names, the rule
// Request.Fold applies to an attempt's output. Who may write a subject is
// what NATS permissions enforce (a worker writes only its own; a frontend
// every worker's, for lost), so this confines a worker to itself. An
// envelope with no stored subject was built in this process and is trusted.
func MisplacedWorkerEvent(e events.Envelope) string {
	id, _, ok := workerEvent(e.Event)
	if !ok || e.Stored == "" {
		return ""
	}
	if s, ok := streams.WorkerOfQuarantine(e.Stored); ok {
		if lost, isLost := e.Event.(events.WorkerLost); isLost && lost.QuarantineMS > 0 && s == id {
			return "" // a frontend's quarantine record: only frontends write there
		}
		return IgnoredNotWorkersSubject
	}
	if s, ok := streams.WorkerOfSubject(e.Stored); !ok || s != id {
		return IgnoredNotWorkersSubject
	}
	return ""
}

// quarantineRecord reports whether e is stored on a quarantine subject
// (streams.WorkerQuarantine): it quarantines its worker id, and ends no
// lease (the same quarantine on the worker's events subject does that).
func quarantineRecord(e events.Envelope) bool {
	_, ok := streams.WorkerOfQuarantine(e.Stored)
	return ok
}

// workerEvent returns the worker and lease a worker event names.
func workerEvent(ev events.Event) (id, lease string, ok bool) {
	switch ev := ev.(type) {
	case events.WorkerRegistered:
		return ev.WorkerID, ev.LeaseID, true
	case events.WorkerDraining:
		return ev.WorkerID, ev.LeaseID, true
	case events.WorkerDeregistered:
		return ev.WorkerID, ev.LeaseID, true
	case events.WorkerLost:
		return ev.WorkerID, ev.LeaseID, true
	}
	return "", "", false
}

// Apply folds a worker lifecycle event: draining, deregistered and lost take
// the worker with that lease out of routing at once, before its key goes.
func (d *Discovery) Apply(e events.Envelope) (changed bool) {
	changed, _ = d.Fold(e)
	return changed
}

// Fold is Apply that also says why an event changed nothing (empty when it
// changed something): an event on another worker's subject
// (MisplacedWorkerEvent) or for a lease other than the worker's current one
// changes nothing. An event for a lease not seen yet is kept, so that the
// lease is out of routing when its key arrives (the stream and the bucket
// are read independently). An event for the lease of a worker whose key
// went settles what Lost says of it.
func (d *Discovery) Fold(e events.Envelope) (changed bool, why string) {
	if e.Seq != 0 {
		if e.Seq <= d.lastSeq {
			return false, IgnoredReplayed
		}
		d.lastSeq = e.Seq
	}
	id, lease, ok := workerEvent(e.Event)
	if _, registered := e.Event.(events.WorkerRegistered); !ok || registered {
		return false, NoEffect
	}
	if why := MisplacedWorkerEvent(e); why != "" {
		return false, why
	}
	if quarantineRecord(e) {
		if d.quarantine(id, e.Time, e.Event.(events.WorkerLost)) {
			return true, ""
		}
		return false, NoEffect
	}
	changed, why = d.foldEnd(e.Event, id, lease)
	if lost, ok := e.Event.(events.WorkerLost); ok && lost.QuarantineMS > 0 && d.quarantine(id, e.Time, lost) {
		return true, ""
	}
	return changed, why
}

// foldEnd folds a lifecycle event that ends worker id's lease lease.
func (d *Discovery) foldEnd(ev events.Event, id, lease string) (changed bool, why string) {
	lost, isLost := ev.(events.WorkerLost)
	end := ending{lease: lease, lost: isLost, reason: lost.Reason}
	if prev := d.ended[id]; prev.lease == lease && prev.lost && !isLost {
		end = prev // a lost event's mark stays
	}
	w, known := d.workers[id]
	switch {
	case !known:
		d.ended[id] = end
		if g := d.gone[id]; g != nil && g.w.LeaseID == lease {
			if settle(g, ev) {
				return true, "" // the departed worker's state or reason
			}
			return false, NoEffect
		}
		return false, NoEffectNoLease
	case w.LeaseID != lease:
		if d.ended[id].lease != w.LeaseID {
			d.ended[id] = end // perhaps the next registration's, its key not seen yet
		}
		return false, IgnoredNotCurrentLease
	}
	d.ended[id] = end
	if w.State == WorkerDraining {
		return false, NoEffectDraining
	}
	w.State = WorkerDraining
	return true, ""
}

// settle folds a lifecycle event of departed g's lease: a lost event makes
// it lost with the event's reason; a deregistered event makes one that a
// client's deletion made lost (lease revoked) one that left in order.
func settle(g *departure, ev events.Event) (changed bool) {
	switch ev := ev.(type) {
	case events.WorkerLost:
		if g.settled && g.w.State == WorkerLost && g.w.Reason == ev.Reason {
			return false
		}
		g.w.State, g.w.Reason, g.settled = WorkerLost, ev.Reason, true
		return true
	case events.WorkerDeregistered:
		if g.settled || g.w.State != WorkerLost {
			return false
		}
		g.w.State, g.w.Reason = workerLeft, ""
		return true
	}
	return false
}

// WorkerLog checks the events of the workers stream, read in order, as a
// Discovery folds them, for tools that have no leases bucket to hand
// (`baton events`): the current lease of a worker is the one of its last
// registered event.
type WorkerLog struct {
	leases map[string]string
}

// Check returns why a Discovery ignores e ("" if it does not, or cannot
// tell), and learns the lease of a registered event.
func (l *WorkerLog) Check(e events.Envelope) string {
	id, lease, ok := workerEvent(e.Event)
	if !ok {
		return ""
	}
	if why := MisplacedWorkerEvent(e); why != "" || quarantineRecord(e) {
		return why
	}
	if _, registered := e.Event.(events.WorkerRegistered); registered {
		if l.leases == nil {
			l.leases = map[string]string{}
		}
		l.leases[id] = lease
		return ""
	}
	if cur, ok := l.leases[id]; ok && cur != lease {
		return IgnoredNotCurrentLease
	}
	return ""
}

// quarantine folds a WorkerLost that quarantines worker id from at: the id,
// whatever its lease, is out of routing until the quarantine ends.
func (d *Discovery) quarantine(id string, at time.Time, lost events.WorkerLost) bool {
	until := at.Add(time.Duration(lost.QuarantineMS) * time.Millisecond)
	q := quarantine{until: until, reason: fmt.Sprintf("quarantined until %s: %s", until.UTC().Format(time.RFC3339), lost.Reason)}
	if old, ok := d.quarantined[id]; ok && !old.until.Before(until) {
		return false
	}
	d.quarantined[id] = q
	if w, ok := d.workers[id]; ok {
		w.State, w.Reason = WorkerQuarantined, q.reason
	}
	return true
}
