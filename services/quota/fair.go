package quota

import (
	"encoding/json"
	"math"
	"slices"
	"sort"
	"sync"
	"time"
)

// Share is what one frontend says of one tenant in its fair-admission key
// (vtc.<frontend> in the budgets bucket): the service it admitted for the
// tenant, divided by the tenant's weight (S), the lift it gave the tenant's
// counter (L), and how many of the tenant's requests wait in its queue (Q)
// and for which models (M).
type Share struct {
	S float64  `json:"s"`
	L float64  `json:"l,omitempty"`
	Q int      `json:"q,omitempty"`
	M []string `json:"m,omitempty"`

	running int // admitted here and not ended: not published
}

// fairKey is the value of a frontend's fair-admission key.
type fairKey struct {
	Tenants map[string]Share `json:"tenants"`
}

// Fair is the virtual token counter (VTC, Sheng et al., OSDI '24) of every
// tenant, as one frontend sees it: its own shares, and the last ones each
// other frontend published. A tenant's counter is the largest lift any
// frontend gave it plus the service every frontend admitted for it, over
// its weight: a sum of per-frontend counts and a maximum of per-frontend
// lifts, so that frontends that see each other's keys in any order agree.
// Fair does no I/O: FairShare carries its keys through the bucket. It is
// safe for concurrent use.
type Fair struct {
	self string
	// stale is how old another frontend's key may be before its queues are
	// taken for gone (its service still counts).
	stale time.Duration

	mu      sync.Mutex
	own     map[string]*Share // this frontend's, by tenant
	peers   map[string]peerShares
	version uint64 // bumped by every change of own
	changed chan struct{}
}

type peerShares struct {
	at      time.Time // when this frontend received it
	tenants map[string]Share
}

// NewFair returns the counters of frontend self; a peer's queues count for
// stale after its key was last received.
func NewFair(self string, stale time.Duration) *Fair {
	return &Fair{self: self, stale: stale, own: map[string]*Share{}, peers: map[string]peerShares{},
		changed: make(chan struct{}, 1)}
}

// Changed receives (coalesced, capacity 1) after another frontend's key
// was applied: a frontend that held back may admit now.
func (f *Fair) Changed() <-chan struct{} { return f.changed }

func (f *Fair) share(tenant string) *Share { return entry(f.own, tenant) }

// counterLocked is tenant's counter: the largest lift plus every
// frontend's service.
func (f *Fair) counterLocked(tenant string) float64 {
	var lift, sum float64
	if s, ok := f.own[tenant]; ok {
		lift, sum = s.L, s.S
	}
	for _, p := range f.peers {
		if s, ok := p.tenants[tenant]; ok {
			lift = math.Max(lift, s.L)
			sum += s.S
		}
	}
	return lift + sum
}

// Counter is tenant's virtual token counter.
func (f *Fair) Counter(tenant string) float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counterLocked(tenant)
}

// remoteQueued calls fn for each tenant queued at a live other frontend
// for one of models (any model when models is nil).
func (f *Fair) remoteQueued(now time.Time, models map[string]bool, fn func(tenant string)) {
	for id, p := range f.peers {
		if id == f.self || now.Sub(p.at) > f.stale {
			continue
		}
		for t, s := range p.tenants {
			if s.Q <= 0 {
				continue
			}
			if models == nil || len(s.M) == 0 || slices.ContainsFunc(s.M, func(m string) bool { return models[m] }) {
				fn(t)
			}
		}
	}
}

// QueuedElsewhere reports whether another live frontend holds a queued
// request for model: then a request here queues too, rather than take a
// free slot ahead of it.
func (f *Fair) QueuedElsewhere(now time.Time, model string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	found := false
	f.remoteQueued(now, map[string]bool{model: true}, func(string) { found = true })
	return found
}

// Join counts one more request of tenant queued here for model. A tenant
// returning from idle (nothing queued or running here, nothing queued
// elsewhere) has its counter lifted to the lowest counter of the tenants
// queued (here or elsewhere), or, when none is, to the highest counter
// known: idle time earns no credit. A tenant with requests running is
// not idle: its queue emptying for a moment loses it nothing.
func (f *Fair) Join(now time.Time, tenant, model string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.share(tenant)
	if s.Q == 0 && s.running == 0 && !f.queuedLocked(now, tenant) {
		target, any := math.Inf(1), false
		f.eachQueuedLocked(now, func(t string) {
			if t != tenant {
				target, any = math.Min(target, f.counterLocked(t)), true
			}
		})
		if !any {
			target = 0
			for _, t := range f.tenantsLocked() {
				if t != tenant {
					target = math.Max(target, f.counterLocked(t))
				}
			}
		}
		if c := f.counterLocked(tenant); target > c {
			s.L += target - c
		}
	}
	s.Q++
	if !slices.Contains(s.M, model) {
		s.M = append(s.M, model)
	}
	f.version++
}

// queuedLocked reports whether tenant is queued at another live frontend.
func (f *Fair) queuedLocked(now time.Time, tenant string) bool {
	found := false
	f.remoteQueued(now, nil, func(t string) { found = found || t == tenant })
	return found
}

// eachQueuedLocked calls fn for every tenant queued here or at a live
// other frontend (a tenant may come more than once).
func (f *Fair) eachQueuedLocked(now time.Time, fn func(tenant string)) {
	for t, s := range f.own {
		if s.Q > 0 {
			fn(t)
		}
	}
	f.remoteQueued(now, nil, fn)
}

func (f *Fair) tenantsLocked() []string {
	seen := map[string]bool{}
	for t := range f.own {
		seen[t] = true
	}
	for _, p := range f.peers {
		for t := range p.tenants {
			seen[t] = true
		}
	}
	out := make([]string, 0, len(seen))
	for t := range seen {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// Leave counts one request of tenant fewer queued here (admitted, or gone);
// models are the models its requests still queued here wait for.
func (f *Fair) Leave(tenant string, models []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.share(tenant)
	if s.Q > 0 {
		s.Q--
	}
	s.M = slices.Clone(models)
	if s.Q == 0 {
		s.M = nil
	}
	f.version++
}

// Start counts a request of tenant admitted here, until Done.
func (f *Fair) Start(tenant string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.share(tenant).running++
}

// Done counts down what Start counted: the request ended (or its
// handler did: a background response runs on, not counted).
func (f *Fair) Done(tenant string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.share(tenant); s.running > 0 {
		s.running--
	}
}

// Charge adds units (tokens over the tenant's weight) to the service this
// frontend admitted for tenant; a negative charge gives back what a
// request reserved and did not use.
func (f *Fair) Charge(tenant string, units float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.share(tenant)
	s.S = math.Max(0, s.S+units)
	f.version++
}

// Candidate is a tenant with a request queued here that a worker could
// take now: Model is its first queued request's model, Units the request's
// charge (tokens over weight), Queued how many of the tenant's requests
// wait here.
type Candidate struct {
	Tenant string
	Model  string
	Units  float64
	Queued int
}

// Pick chooses among cands (not empty) the tenant with the lowest counter
// (ties: the shorter queue, then the name), and reports whether this
// frontend should hold back instead: some tenant queued at another live
// frontend, for a model a candidate waits for, has a counter lower than
// the chosen one's by more than the chosen request's charge. The slack of
// one request's charge keeps two frontends that see each other's counters
// a little late from both holding back; it bounds how far apart two
// backlogged tenants' counters drift, not the long-run ratio.
func (f *Fair) Pick(now time.Time, cands []Candidate) (best Candidate, holdBack bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	bestC := math.Inf(1)
	models := map[string]bool{}
	for _, c := range cands {
		models[c.Model] = true
		v := f.counterLocked(c.Tenant)
		if v < bestC || (v == bestC && (c.Queued < best.Queued || (c.Queued == best.Queued && c.Tenant < best.Tenant))) {
			best, bestC = c, v
		}
	}
	f.remoteQueued(now, models, func(t string) {
		if v := f.counterLocked(t); v+best.Units < bestC {
			holdBack = true
		}
	})
	return best, holdBack
}

// Own is this frontend's key as JSON and its version: a publisher writes
// it when the version moved since its last write.
func (f *Fair) Own() ([]byte, uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := fairKey{Tenants: make(map[string]Share, len(f.own))}
	queued := false
	for t, s := range f.own {
		k.Tenants[t] = *s
		queued = queued || s.Q > 0
	}
	data, _ := json.Marshal(k) // a map of plain numbers and strings
	return data, f.version, queued
}

// Seed takes back this frontend's service and lifts from its key as a
// previous run of it left them (a restart under the same id), so that its
// tenants' counters do not fall.
func (f *Fair) Seed(data []byte) {
	var k fairKey
	if json.Unmarshal(data, &k) != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for t, s := range k.Tenants {
		o := f.share(t)
		o.S, o.L = math.Max(o.S, s.S), math.Max(o.L, s.L)
	}
}

// Apply records another frontend's key, received at now; a key that does
// not parse is ignored.
func (f *Fair) Apply(now time.Time, frontend string, data []byte) {
	if frontend == f.self {
		return
	}
	var k fairKey
	if json.Unmarshal(data, &k) != nil {
		return
	}
	f.mu.Lock()
	f.peers[frontend] = peerShares{at: now, tenants: k.Tenants}
	f.mu.Unlock()
	f.notify()
}

// Forget drops another frontend's key (deleted, or expired).
func (f *Fair) Forget(frontend string) {
	f.mu.Lock()
	delete(f.peers, frontend)
	f.mu.Unlock()
	f.notify()
}

func (f *Fair) notify() {
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// entry returns m[key], adding a new zero value there first if it has none:
// the per-tenant state of Limiter, Slots and Fair.
func entry[T any](m map[string]*T, key string) *T {
	v, ok := m[key]
	if !ok {
		v = new(T)
		m[key] = v
	}
	return v
}
