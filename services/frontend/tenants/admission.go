package tenants

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/baton-dev/baton/migrations"
	"github.com/baton-dev/baton/services/fleet"
	"github.com/baton-dev/baton/services/quota"
	"github.com/baton-dev/baton/streams"
)

// DefaultAdmissionWait is Config.AdmissionWait's default once the queue is on.
const DefaultAdmissionWait = 5 * time.Second

// Timings of the admission scheduler.
const (
	// holdBackFor is the longest a frontend leaves a free worker to another
	// frontend whose queued tenant is further behind: that frontend sees
	// the same free worker and takes it within milliseconds; if it has not
	// after this long, its view differs and this one admits.
	holdBackFor = 250 * time.Millisecond
	// settleFor bounds how long the scheduler waits, after it admitted a
	// request, for the request's first dispatch: until then neither the
	// router nor a load report counts it, and the worker it goes to looks
	// free (fleet.Fleet.Free).
	settleFor = time.Second
	// pollQueued is how often the scheduler looks again while requests
	// are queued, without an event: a request's end reaches the router a
	// little after the worker's report of it, and only the report wakes
	// the scheduler.
	pollQueued = 5 * time.Millisecond
)

// admission is weighted fair admission when every worker is busy
// (--admission-queue, --admission-wait): a new request that finds the
// pool full, or others queued before it, waits in its tenant's queue, of
// at most size requests, for at most wait; the scheduler admits, one at a
// time as workers free up, the queued tenant with the lowest virtual
// token counter (quota.Fair), which every frontend shares through the
// budgets bucket. Requests already running are never touched.
type admission struct {
	g    *Gate
	fair *quota.Fair
	size int
	wait time.Duration

	mu     sync.Mutex
	queues map[string][]*waiter // by tenant, oldest first; bounded by size per tenant
	kick   chan struct{}        // capacity 1: a request joined a queue

	heldSince time.Time // when the scheduler began to hold back; the scheduler's own
}

// waiter is one queued request.
type waiter struct {
	tenant, model string
	units         float64       // its charge: tokens reserved over the tenant's weight
	ready         chan struct{} // closed when admitted
	admitted      bool          // guarded by admission.mu
	settled       chan struct{} // closed by its ticket once its first dispatch settled
	once          sync.Once
}

func newAdmission(g *Gate, size int, wait time.Duration) *admission {
	return &admission{g: g, fair: quota.NewFair(g.ID, quota.FairStale), size: size, wait: wait,
		queues: map[string][]*waiter{}, kick: make(chan struct{}, 1)}
}

// Ticket is an admitted request's part in the fair queue: Settle tells it
// the first dispatch is over (the next queued request may be looked at),
// End corrects the tenant's counter with the tokens the request used.
// A nil Ticket (admission off, or a pinned request) does nothing.
type Ticket struct {
	a      *admission
	w      *waiter
	tenant string
	units  float64
	tokens int64
}

type ticketKey struct{}

// WithTicket is r carrying tk, for the edge to settle (SettleTicket).
func WithTicket(r *http.Request, tk *Ticket) *http.Request {
	if tk == nil {
		return r
	}
	return r.WithContext(context.WithValue(r.Context(), ticketKey{}, tk))
}

// SettleTicket settles r's ticket, if it has one: its first dispatch is over.
func SettleTicket(r *http.Request) {
	if tk, ok := r.Context().Value(ticketKey{}).(*Ticket); ok {
		tk.Settle()
	}
}

// Settle tells the scheduler tk's first dispatch is over.
func (tk *Ticket) Settle() {
	if tk != nil && tk.w != nil {
		tk.w.once.Do(func() { close(tk.w.settled) })
	}
}

// End settles tk and gives back to the tenant's counter the share of what
// it charged that requests ids did not use, once all of them ended (one
// that goes on, detached or in the background, keeps its charge).
func (tk *Ticket) End(ids []string) {
	if tk == nil {
		return
	}
	tk.Settle()
	defer tk.a.fair.Done(tk.tenant)
	if tk.tokens <= 0 {
		return
	}
	used, ended := tk.a.g.tokensUsed(ids, true) // an id never accepted (refused after admission) used nothing
	if !ended {
		return
	}
	if used < tk.tokens {
		tk.a.fair.Charge(tk.tenant, -tk.units*float64(tk.tokens-used)/float64(tk.tokens))
	}
}

// weight is tenant's weight from the budgets file (1 without one).
func (g *Gate) weight(tenant string) float64 { return g.budget(tenant).Weight }

// Queues reports whether the fair queue is on (--admission-queue).
func (g *Gate) Queues() bool { return g.admission != nil }

// ErrNotQueued is Admit's answer for a request the fair queue does not
// hold: the model is unknown, or no worker is ready; the edge answers it
// as without the queue.
var ErrNotQueued = errors.New("tenants: not for the fair queue")

// Admit admits a new request of tenant for model reserving tokens through
// the fair queue (the edge calls it when Queues, for requests not pinned
// to a worker): a request that finds every worker busy, or other requests
// queued for its model (here or at another frontend), waits its turn, until
// ctx is done; past the queue's length or its wait it gets the busy 503
// as without the queue. A request the queue does not hold gets
// ErrNotQueued; otherwise the error is a *Refusal.
func (g *Gate) Admit(ctx context.Context, tenant, model, endpoint string, tokens int64) (*Ticket, error) {
	a := g.admission
	err := g.Fleet.Admit(model, "")
	if err != nil && !errors.Is(err, fleet.ErrAllBusy) {
		return nil, ErrNotQueued
	}
	units := float64(tokens) / g.weight(tenant)
	tk := &Ticket{a: a, tenant: tenant, units: units, tokens: tokens}
	now := time.Now()
	a.mu.Lock()
	if err == nil && a.emptyLocked() && !a.fair.QueuedElsewhere(now, model) {
		a.mu.Unlock()
		a.fair.Start(tenant)
		a.fair.Charge(tenant, units)
		return tk, nil
	}
	if len(a.queues[tenant]) >= a.size {
		a.mu.Unlock()
		g.refusedBusy(tenant, model, endpoint)
		return nil, busyError()
	}
	w := &waiter{tenant: tenant, model: model, units: units, ready: make(chan struct{}), settled: make(chan struct{})}
	a.queues[tenant] = append(a.queues[tenant], w)
	a.fair.Join(now, tenant, model)
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
	}
	defer func() { g.series.queue(tenant, time.Since(now)) }()
	why := a.await(ctx, w, g.Draining)
	if why == nil || a.leave(w) {
		tk.w = w
		return tk, nil // admitted, maybe as it gave up: take it
	}
	if why.Code == "all_workers_busy" && ctx.Err() == nil {
		g.refusedBusy(tenant, model, endpoint)
	}
	return nil, why
}

// await waits until w is admitted (nil), its wait ends, the frontend
// drains or ctx is done.
func (a *admission) await(ctx context.Context, w *waiter, draining <-chan struct{}) *Refusal {
	timer := time.NewTimer(a.wait)
	defer timer.Stop()
	select {
	case <-w.ready:
		return nil
	case <-timer.C:
		return busyError()
	case <-draining:
		return &Refusal{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "draining",
			Message: "Service temporarily unavailable: this frontend is shutting down, please retry"}
	case <-ctx.Done():
		return busyError()
	}
}

// refusedBusy counts a create of tenant the queue refused.
func (g *Gate) refusedBusy(tenant, model, endpoint string) {
	g.Runtime.Rejected(model, endpoint)
	g.series.throttle(tenant, "queue")
}

func busyError() *Refusal {
	return &Refusal{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "all_workers_busy", Message: migrations.BusyMessage}
}

func (a *admission) emptyLocked() bool {
	for _, q := range a.queues {
		if len(q) > 0 {
			return false
		}
	}
	return true
}

// leave takes w out of its queue, unless the scheduler admitted it
// first: then it reports true.
func (a *admission) leave(w *waiter) bool {
	a.mu.Lock()
	if w.admitted {
		a.mu.Unlock()
		return true
	}
	q := a.queues[w.tenant]
	for i, x := range q {
		if x == w {
			q = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	a.setQueueLocked(w.tenant, q)
	models := modelsOf(q)
	a.mu.Unlock()
	a.fair.Leave(w.tenant, models)
	return false
}

func (a *admission) setQueueLocked(tenant string, q []*waiter) {
	if len(q) == 0 {
		delete(a.queues, tenant)
		return
	}
	a.queues[tenant] = q
}

func modelsOf(q []*waiter) []string {
	var out []string
	for _, w := range q {
		found := false
		for _, m := range out {
			found = found || m == w.model
		}
		if !found {
			out = append(out, w.model)
		}
	}
	return out
}

// run admits queued requests as workers free up, until ctx is done. It
// looks again whenever the fleet view changes (a load report: a worker
// freed up), a request joins a queue, another frontend's counters arrive,
// or a hold-back ends.
func (a *admission) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		changed := a.g.Fleet.WorkersChanged()
		w, again := a.step(time.Now())
		if w != nil {
			a.settle(ctx, w)
			continue
		}
		if again == 0 {
			again = time.Hour // only at the next event
		}
		timer.Reset(again)
		select {
		case <-ctx.Done():
			return
		case <-a.kick:
		case <-changed:
		case <-a.fair.Changed():
		case <-timer.C:
		}
	}
}

// settle waits, after w was admitted, until its first dispatch settled
// (the router counts it), within settleFor.
func (a *admission) settle(ctx context.Context, w *waiter) {
	t := time.NewTimer(settleFor)
	defer t.Stop()
	select {
	case <-w.settled:
	case <-t.C:
	case <-ctx.Done():
	}
}

// step admits the queued request the counters choose, if a worker can
// take it now and no other frontend should have it first, and returns it;
// otherwise it returns how long until it must look again without an event
// (0: only at the next one).
func (a *admission) step(now time.Time) (*waiter, time.Duration) {
	a.mu.Lock()
	var cands []quota.Candidate
	free := map[string]bool{}
	for tenant, q := range a.queues {
		h := q[0]
		ok, seen := free[h.model]
		if !seen {
			ok = a.g.Fleet.Free(h.model)
			free[h.model] = ok
		}
		if ok {
			cands = append(cands, quota.Candidate{Tenant: tenant, Model: h.model, Units: h.units, Queued: len(q)})
		}
	}
	queued := len(a.queues) > 0
	a.mu.Unlock()
	if len(cands) == 0 {
		a.heldSince = time.Time{}
		if queued {
			return nil, pollQueued
		}
		return nil, 0
	}
	best, hold := a.fair.Pick(now, cands)
	if hold {
		if a.heldSince.IsZero() {
			a.heldSince = now
		}
		if left := holdBackFor - now.Sub(a.heldSince); left > 0 {
			return nil, min(left, pollQueued)
		}
	}
	a.heldSince = time.Time{}
	a.mu.Lock()
	q := a.queues[best.Tenant]
	if len(q) == 0 { // its requests gave up meanwhile
		a.mu.Unlock()
		return nil, time.Millisecond
	}
	w := q[0]
	w.admitted = true
	a.setQueueLocked(best.Tenant, q[1:])
	models := modelsOf(q[1:])
	a.mu.Unlock()
	a.fair.Leave(best.Tenant, models)
	a.fair.Start(best.Tenant)
	a.fair.Charge(best.Tenant, w.units)
	close(w.ready)
	return w, 0
}

// startAdmission starts the fair queue when --admission-queue is set:
// Start runs the returned function (the scheduler and the counters'
// carrier through the budgets bucket) until the end of the shutdown.
func (g *Gate) startAdmission(ctx context.Context) (run func(context.Context) error, err error) {
	if g.admission == nil {
		return nil, nil
	}
	kv, err := g.bucket(ctx)
	if err != nil {
		return nil, err
	}
	share := quota.NewFairShare(kv, g.admission.fair, g.ID, g.Log)
	g.Log.Info("weighted fair admission when every worker is busy", "queue_per_tenant", g.admission.size,
		"wait", g.admission.wait.String(), "bucket", streams.BudgetsBucket)
	return func(ctx context.Context) error {
		done := make(chan struct{})
		go func() { defer close(done); g.admission.run(ctx) }()
		err := share.Run(ctx)
		<-done
		return err
	}, nil
}
