package projections

import (
	"slices"
	"strings"
	"time"

	"github.com/baton-dev/baton/events"
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
	// QuarantineMS, on the worker's events subject and on its quarantine
	// subject, streams.WorkerQuarantine, which the worker cannot write):
	// listed, not routable, until the quarantine ends, whatever lease it
	// registers meanwhile, and whatever it writes on its events subject
	// (a view started afterwards reads the last message of each subject).
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
	// WritesBatched: the worker has an output stream of its own
	// (events.Lease.WritesBatched).
	WritesBatched bool `json:"-"`
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
		HoldsUntilRouted:  l.HoldsUntilRouted, Priority: l.Priority, WritesBatched: l.WritesBatched,
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
