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
	// when it refused the worker, else stalled or canary_failed.
	Reason string `json:"reason,omitempty"`
	// LeaseRenewed is when the lease key was last written; zero if unknown.
	LeaseRenewed time.Time `json:"lease_renewed,omitzero"`
	// Capabilities are what the worker's engine can do; nil: everything.
	Capabilities *events.Capabilities `json:"capabilities,omitempty"`
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
	return c.Completions
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
	Time     time.Time // when the key was written (a registration or renewal)
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
// same lease end it early).
//
// A Discovery is not safe for concurrent use; the frontend guards it.
type Discovery struct {
	lastSeq      uint64 // workers stream
	lastLeaseRev uint64
	workers      map[string]*Worker
	loads        map[string]events.Load
	ended        map[string]string // lease ids ended by an event, until their key goes
}

// NewDiscovery returns an empty view.
func NewDiscovery() *Discovery {
	return &Discovery{workers: map[string]*Worker{}, loads: map[string]events.Load{}, ended: map[string]string{}}
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
		_, had := d.workers[u.Key]
		delete(d.workers, u.Key)
		delete(d.ended, u.Key)
		return had
	}
	l := u.Lease
	w := &Worker{
		ID: u.Key, LeaseID: l.LeaseID, Model: l.Model, State: WorkerReady,
		PID: l.PID, Host: l.Host, LeaseTTL: (time.Duration(l.TTLMS) * time.Millisecond).String(),
		LeaseRevision: u.Revision, ClientID: l.ClientID, Server: l.Server,
		Load: d.loads[u.Key], LeaseRenewed: u.Time, Capabilities: l.Capabilities,
	}
	switch {
	case l.Draining || d.ended[u.Key] == l.LeaseID:
		w.State = WorkerDraining
	case l.NotReady:
		w.State, w.Reason = WorkerNotReady, l.NotReadyReason
	}
	d.workers[u.Key] = w
	return true
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

// Apply folds a worker lifecycle event: draining, deregistered and lost take
// the worker with that lease out of routing at once, before its key goes.
func (d *Discovery) Apply(e events.Envelope) (changed bool) {
	if e.Seq != 0 {
		if e.Seq <= d.lastSeq {
			return false
		}
		d.lastSeq = e.Seq
	}
	var id, lease string
	switch ev := e.Event.(type) {
	case events.WorkerDraining:
		id, lease = ev.WorkerID, ev.LeaseID
	case events.WorkerDeregistered:
		id, lease = ev.WorkerID, ev.LeaseID
	case events.WorkerLost:
		id, lease = ev.WorkerID, ev.LeaseID
	default:
		return false
	}
	d.ended[id] = lease
	if w, ok := d.workers[id]; ok && w.LeaseID == lease && w.State != WorkerDraining {
		w.State = WorkerDraining
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
