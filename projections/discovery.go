package projections

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
)

// Worker states in the discovery view.
const (
	WorkerReady    = "ready"
	WorkerDraining = "draining"
	// WorkerNotReady is a live worker whose health checks fail
	// (events.Lease.NotReady): listed, but not routable until it is ready.
	WorkerNotReady = "not_ready"
	// WorkerQuarantined is a worker a frontend took out of service for
	// writing to the request log outside its attempts (a WorkerLost with
	// QuarantineMS): listed, not routable, until the quarantine ends,
	// whatever lease it registers meanwhile.
	WorkerQuarantined = "quarantined"
	// WorkerLost is a worker whose lease ended without it leaving in order:
	// its key expired, or a frontend revoked it (and recorded it lost).
	// Lost lists it for a while; Workers never does.
	WorkerLost = "lost"
	// workerLeft is a worker whose lease ended in order (it drained, then
	// revoked its own key): remembered in case a lost event follows, never
	// listed.
	workerLeft = "left"
)

// Worker is one live worker as discovery sees it.
type Worker struct {
	ID            string      `json:"id"`
	LeaseID       string      `json:"lease_id"`
	Model         string      `json:"model"`
	State         string      `json:"state"`
	PID           int         `json:"pid"`
	Host          string      `json:"host"`
	LeaseTTL      string      `json:"lease_ttl"`
	LeaseRevision uint64      `json:"lease_revision"`
	ClientID      uint64      `json:"client_id,omitempty"`
	Server        string      `json:"server,omitempty"`
	Load          events.Load `json:"load"`
	// Reason says why a not_ready worker is not ready: the upstream's words
	// when it refused the worker, else stalled or canary_failed. For a lost
	// worker it says why it was lost: the lost event's reason, else lease
	// expired or lease revoked.
	Reason string `json:"reason,omitempty"`
	// LeaseRenewed is when the lease key was last written; zero if unknown.
	LeaseRenewed time.Time `json:"lease_renewed,omitzero"`
	// Capabilities are what the worker's engine can do; nil: everything.
	Capabilities *events.Capabilities `json:"capabilities,omitempty"`
	// FirstTokenTimeout is the first-token deadline the worker keeps itself
	// (events.Lease.FirstTokenTimeoutMS); 0: none.
	FirstTokenTimeout time.Duration `json:"first_token_timeout,omitempty"`
	// HoldsUntilRouted: the worker holds an attempt's output until its
	// routed decision is stored (events.Lease.HoldsUntilRouted).
	HoldsUntilRouted bool `json:"-"`
	// Priority is the worker's routing tier (events.Lease.Priority);
	// higher first, 0 by default.
	Priority int `json:"priority"`
	// Departed is when a lost worker's lease ended (the time of the key's
	// deletion or expiry); zero for a live worker.
	Departed time.Time `json:"departed,omitzero"`
}

// CanServe reports whether the worker's engine serves endpoint
// (events.EndpointChat or events.EndpointCompletions).
func (w Worker) CanServe(endpoint string) bool {
	c := w.Capabilities
	return c == nil || (endpoint == events.EndpointChat && c.Chat) || (endpoint != events.EndpointChat && c.Completions)
}

// CanContinue reports whether the worker's engine can continue a migrated
// request of endpoint: token-exactly when tokenIDs (every id is known) and
// it takes token ids, else by prefill (assistant prefill on chat; the
// prompt plus the text so far on completions).
func (w Worker) CanContinue(endpoint string, tokenIDs bool) bool {
	c := w.Capabilities
	switch {
	case c == nil:
		return true
	case tokenIDs && c.TokenIDs && c.Completions:
		return true
	case endpoint == events.EndpointChat:
		return c.Chat && c.Prefill
	}
	return c.Completions && !c.CompletionsNotContinuable
}

// Routable reports whether the worker may receive new requests: leased, not
// draining and not failing its health checks. (Local inhibition is the
// router's, not discovery's.)
func (w Worker) Routable() bool { return w.State == WorkerReady }

// LeaseUpdate is a change of a key in the leases bucket: a put (Lease set) or
// a delete, purge or TTL expiry (Lease nil).
type LeaseUpdate struct {
	Key      string
	Revision uint64
	Lease    *events.Lease
	Time     time.Time // when the key was written (a registration or renewal) or deleted
	// Expired marks a deletion by the key's TTL (the server's expiry
	// marker), not by a client.
	Expired bool
}

// LoadUpdate is a change of a key in the load bucket (Load nil: deleted).
type LoadUpdate struct {
	Key      string
	Revision uint64
	Load     *events.Load
}

// Discovery is the view of live workers, folded from the leases bucket (the
// authority on liveness: a worker exists while its key does), the load
// bucket, and worker lifecycle events (draining, lost, deregistered for the
// same lease end it early). It also remembers the workers whose lease ended
// without their leaving in order (Lost), the most recent workersGoneLimit.
//
// A Discovery is not safe for concurrent use; the frontend guards it.
type Discovery struct {
	lastSeq      uint64 // workers stream
	lastLeaseRev uint64
	workers      map[string]*Worker
	loads        map[string]events.Load
	ended        map[string]ending     // leases ended by an event, by worker id, until their key goes
	gone         map[string]*departure // departed workers, by id, until a new lease
	quarantined  map[string]quarantine
}

// quarantine is a worker id's time out of routing (events.WorkerLost.QuarantineMS).
type quarantine struct {
	until  time.Time
	reason string
}

// departure is a worker whose key went: w.State is WorkerLost or
// workerLeft. settled: a lost event or the key's expiry said so, and no
// deregistered event changes it.
type departure struct {
	w       Worker
	settled bool
}

// ending is the lease a lifecycle event ended, and whether a lost event
// (with its reason) was among those events.
type ending struct {
	lease  string
	lost   bool
	reason string
}

// workersGoneLimit bounds how many departed workers a Discovery remembers;
// past it, the one that departed first is forgotten.
const workersGoneLimit = 64

// NewDiscovery returns an empty view.
func NewDiscovery() *Discovery {
	return &Discovery{workers: map[string]*Worker{}, loads: map[string]events.Load{}, ended: map[string]ending{}, gone: map[string]*departure{},
		quarantined: map[string]quarantine{}}
}

// ApplyLease folds a lease change. Revisions not newer than the last applied
// one are skipped.
func (d *Discovery) ApplyLease(u LeaseUpdate) (changed bool) {
	if u.Revision != 0 {
		if u.Revision <= d.lastLeaseRev {
			return false
		}
		d.lastLeaseRev = u.Revision
	}
	if u.Lease == nil {
		w, had := d.workers[u.Key]
		if had {
			d.depart(w, u)
		}
		delete(d.workers, u.Key)
		delete(d.ended, u.Key)
		return had
	}
	delete(d.gone, u.Key) // back, under a new lease or the same one
	l := u.Lease
	w := &Worker{
		ID: u.Key, LeaseID: l.LeaseID, Model: l.Model, State: WorkerReady,
		PID: l.PID, Host: l.Host, LeaseTTL: (time.Duration(l.TTLMS) * time.Millisecond).String(),
		LeaseRevision: u.Revision, ClientID: l.ClientID, Server: l.Server,
		Load: d.loads[u.Key], LeaseRenewed: u.Time, Capabilities: l.Capabilities,
		FirstTokenTimeout: time.Duration(l.FirstTokenTimeoutMS) * time.Millisecond,
		HoldsUntilRouted:  l.HoldsUntilRouted, Priority: l.Priority,
	}
	switch {
	case l.Draining || d.ended[u.Key].lease == l.LeaseID:
		w.State = WorkerDraining
	case l.NotReady:
		w.State, w.Reason = WorkerNotReady, l.NotReadyReason
	}
	d.applyQuarantine(w, u.Time)
	d.workers[u.Key] = w
	return true
}

// applyQuarantine marks w quarantined if its id is, at time at (a lease
// write's: the view keeps no clock of its own, and a renewal after the end
// lifts the quarantine). A zero at is taken to be within it.
func (d *Discovery) applyQuarantine(w *Worker, at time.Time) {
	q, ok := d.quarantined[w.ID]
	if !ok {
		return
	}
	if !at.IsZero() && !at.Before(q.until) {
		delete(d.quarantined, w.ID)
		return
	}
	w.State, w.Reason = WorkerQuarantined, q.reason
}

// Quarantined returns the ids of the workers quarantined at now (listed or
// not), sorted.
func (d *Discovery) Quarantined(now time.Time) []string {
	var ids []string
	for id, q := range d.quarantined {
		if now.Before(q.until) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// depart remembers w, whose key u deleted: lost, unless it was draining
// and a client deleted the key (its own revocation after a drain, most
// likely; a lost event recorded afterwards still makes it lost).
func (d *Discovery) depart(w *Worker, u LeaseUpdate) {
	g := &departure{w: *w, settled: true}
	g.w.Departed, g.w.State, g.w.Reason = u.Time, WorkerLost, ""
	switch e := d.ended[w.ID]; {
	case e.lease == w.LeaseID && e.lost:
		g.w.Reason = e.reason
	case u.Expired:
		g.w.Reason = "lease expired"
	case w.State == WorkerDraining:
		g.w.State, g.settled = workerLeft, false
	default:
		g.w.Reason, g.settled = "lease revoked", false
	}
	if _, ok := d.gone[w.ID]; !ok && len(d.gone) >= workersGoneLimit {
		first := ""
		for id, o := range d.gone {
			if first == "" || o.w.Departed.Before(d.gone[first].w.Departed) {
				first = id
			}
		}
		delete(d.gone, first)
	}
	d.gone[w.ID] = g
}

// ApplyLoad folds a load report.
func (d *Discovery) ApplyLoad(u LoadUpdate) (changed bool) {
	if u.Load == nil {
		delete(d.loads, u.Key)
		return false
	}
	d.loads[u.Key] = *u.Load
	if w, ok := d.workers[u.Key]; ok {
		w.Load = *u.Load
		return true
	}
	return false
}

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
	if s, ok := streams.WorkerOfSubject(e.Stored); !ok || s != id {
		return IgnoredNotWorkersSubject
	}
	return ""
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
	if why := MisplacedWorkerEvent(e); why != "" {
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

// Get returns a copy of worker id.
func (d *Discovery) Get(id string) (Worker, bool) {
	w, ok := d.workers[id]
	if !ok {
		return Worker{}, false
	}
	return *w, true
}

// Workers returns copies of all workers, sorted by id.
func (d *Discovery) Workers() []Worker {
	out := make([]Worker, 0, len(d.workers))
	for _, w := range d.workers {
		out = append(out, *w)
	}
	slices.SortFunc(out, func(a, b Worker) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Lost returns copies of the departed workers that did not leave in order
// (State WorkerLost, Departed set, Reason saying why when known), sorted by
// id: the most recent workersGoneLimit, each until it registers again. How
// long to show them is the reader's choice.
func (d *Discovery) Lost() []Worker {
	var out []Worker
	for _, g := range d.gone {
		if g.w.State == WorkerLost {
			out = append(out, g.w)
		}
	}
	slices.SortFunc(out, func(a, b Worker) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Routable returns copies of the routable workers serving model, sorted by id.
func (d *Discovery) Routable(model string) []Worker {
	var out []Worker
	for _, w := range d.Workers() {
		if w.Model == model && w.Routable() {
			out = append(out, w)
		}
	}
	return out
}

// Models returns the models served by at least one worker, sorted.
func (d *Discovery) Models() []string {
	var out []string
	for _, w := range d.workers {
		if !slices.Contains(out, w.Model) {
			out = append(out, w.Model)
		}
	}
	slices.Sort(out)
	return out
}
