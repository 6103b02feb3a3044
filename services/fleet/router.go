package fleet

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/baton-dev/baton/projections"
)

// Routing errors.
var (
	errNoWorkers = errors.New("fleet: no worker serves this model")
	errNotPinned = errors.New("fleet: pinned worker is not in discovery")
	// errNotCapable: workers are routable, but none of their engines can
	// serve the request's endpoint or continue it after a migration.
	errNotCapable = errors.New("fleet: no routable worker's engine can run this request")
)

// router picks a worker for a dispatch: among the routable workers of the
// model that this frontend has not inhibited and that are not busy, those
// of the highest priority tier (projections.Worker.Priority), and among
// them the least loaded. A lower tier serves only while no worker of a
// higher one can take the request, and the next pick after one can is its
// again: the choice keeps no memory of tiers. Inhibition is local: after a
// request-path failure the worker leaves this frontend's routing set for
// inhibitFor, unless it re-registers (a new lease id) first.
type router struct {
	inhibitFor       time.Duration // <= 0 disables inhibition
	decodeThreshold  *float64
	prefillThreshold *int
	now              func() time.Time

	mu        sync.Mutex
	inhibited map[string]inhibition
	active    map[string]int // this frontend's in-flight dispatches per worker
}

type inhibition struct {
	leaseID string
	until   time.Time
}

func newRouter(cfg Config, now func() time.Time) *router {
	return &router{
		inhibitFor: cfg.InhibitedDuration, decodeThreshold: cfg.ActiveDecodeBlocksThreshold,
		prefillThreshold: cfg.ActivePrefillTokensThreshold, now: now,
		inhibited: map[string]inhibition{}, active: map[string]int{},
	}
}

// inhibit drops w from routing for d, or for the inhibition window when
// d is zero, and reports whether it did: nothing is inhibited while
// inhibition is disabled.
func (r *router) inhibit(w projections.Worker, d time.Duration) bool {
	if r.inhibitFor <= 0 {
		return false
	}
	if d <= 0 {
		d = r.inhibitFor
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inhibited[w.ID] = inhibition{leaseID: w.LeaseID, until: r.now().Add(d)}
	return true
}

// isInhibited reports whether w is inhibited now. A worker that re-registered
// with a new lease since it was inhibited is not.
func (r *router) isInhibited(w projections.Worker) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.isInhibitedLocked(w)
}

func (r *router) isInhibitedLocked(w projections.Worker) bool {
	in, ok := r.inhibited[w.ID]
	if !ok {
		return false
	}
	if in.leaseID != w.LeaseID || !r.now().Before(in.until) {
		delete(r.inhibited, w.ID)
		return false
	}
	return true
}

// busy reports whether w is over a configured load threshold, or says
// itself that its server is busy (events.Load.Busy).
func (r *router) busy(w projections.Worker) bool {
	l := w.Load
	if l.Busy {
		return true
	}
	if t := r.decodeThreshold; t != nil && l.KVBlocksTotal > 0 && float64(l.KVBlocksUsed)/float64(l.KVBlocksTotal) > *t {
		return true
	}
	if t := r.prefillThreshold; t != nil && l.QueuedPrefillTokens > *t {
		return true
	}
	return false
}

// pick chooses among candidates (the routable workers of a model), skipping
// excluded and inhibited ones: the least loaded of the highest tier that has
// a worker left that is not busy. It returns errNoWorkers when none is left
// and ErrAllBusy when every one left, of every tier, is busy. It reserves
// nothing: see reserve.
func (r *router) pick(candidates []projections.Worker, exclude map[string]bool) (projections.Worker, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pickLocked(candidates, exclude)
}

// reserve picks a worker as pick does and counts a dispatch to it, in one
// step under the router's lock, so that a burst of requests spreads over the
// workers instead of all choosing the one that looked least loaded before
// any of them was counted. done ends the count (call it once the dispatch is
// over, or failed); it is nil on error.
//
// With lastResort (a migration: the request is under way), a request whose
// every candidate left is inhibited goes to an inhibited one of the highest
// tier, the one inhibited longest ago (the least recently failed), rather
// than fail: inhibition is a preference, not a wall, and failing would cut
// an answer short.
func (r *router) reserve(candidates []projections.Worker, exclude map[string]bool, lastResort bool) (projections.Worker, func(), error) {
	r.mu.Lock()
	w, err := r.pickLocked(candidates, exclude)
	if errors.Is(err, errNoWorkers) && lastResort {
		w, err = r.leastRecentlyFailedLocked(candidates, exclude)
	}
	if err == nil {
		r.active[w.ID]++
	}
	r.mu.Unlock()
	if err != nil {
		return projections.Worker{}, nil, err
	}
	return w, r.untrack(w.ID), nil
}

func (r *router) pickLocked(candidates []projections.Worker, exclude map[string]bool) (projections.Worker, error) {
	var best []projections.Worker
	var tier, bestScore int
	for _, w := range candidates {
		if exclude[w.ID] || r.isInhibitedLocked(w) || r.busy(w) {
			continue
		}
		score := max(w.Load.ActiveRequests, r.active[w.ID])
		switch {
		case len(best) == 0 || w.Priority > tier || (w.Priority == tier && score < bestScore):
			best, tier, bestScore = []projections.Worker{w}, w.Priority, score
		case w.Priority == tier && score == bestScore:
			best = append(best, w)
		}
	}
	if len(best) == 0 {
		for _, w := range candidates {
			if !exclude[w.ID] && !r.isInhibitedLocked(w) {
				return projections.Worker{}, ErrAllBusy
			}
		}
		return projections.Worker{}, errNoWorkers
	}
	return best[rand.IntN(len(best))], nil
}

// free reports whether some candidate is neither inhibited nor busy, and
// its load report counts at least the dispatches this frontend has running
// on it (a report that does not is older than the last of them).
func (r *router) free(candidates []projections.Worker) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range candidates {
		if !r.isInhibitedLocked(w) && !r.busy(w) && r.active[w.ID] <= w.Load.ActiveRequests {
			return true
		}
	}
	return false
}

// leastRecentlyFailedLocked is the inhibited candidate of the highest tier,
// not excluded and not busy, whose inhibition was set longest ago;
// errNoWorkers if none.
func (r *router) leastRecentlyFailedLocked(candidates []projections.Worker, exclude map[string]bool) (projections.Worker, error) {
	var best projections.Worker
	var until time.Time
	for _, w := range candidates {
		if exclude[w.ID] || r.busy(w) || !r.isInhibitedLocked(w) {
			continue
		}
		in := r.inhibited[w.ID]
		if until.IsZero() || w.Priority > best.Priority || (w.Priority == best.Priority && in.until.Before(until)) {
			best, until = w, in.until
		}
	}
	if until.IsZero() {
		return projections.Worker{}, errNoWorkers
	}
	return best, nil
}

// track counts a dispatch to worker id until the returned func is called.
func (r *router) track(id string) (done func()) {
	r.mu.Lock()
	r.active[id]++
	r.mu.Unlock()
	return r.untrack(id)
}

// untrack returns the func that ends one counted dispatch to id, once.
func (r *router) untrack(id string) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			if r.active[id]--; r.active[id] <= 0 {
				delete(r.active, id)
			}
			r.mu.Unlock()
		})
	}
}

// capable keeps the workers whose engines can run a request of endpoint:
// serve it and, for a continuation (start > 0), continue it (token ids, when
// ids says every generated id is known, or prefill). It fails with
// errNotCapable when workers were routable but none is capable.
func capable(ws []projections.Worker, endpoint string, start int, ids bool) ([]projections.Worker, error) {
	out := ws[:0:0]
	for _, w := range ws {
		if w.CanServe(endpoint) && (start == 0 || w.CanContinue(endpoint, ids)) {
			out = append(out, w)
		}
	}
	if len(out) == 0 && len(ws) > 0 {
		what := "serve " + endpoint
		if start > 0 {
			what = fmt.Sprintf("continue it at token %d (needs token ids or prefill)", start)
		}
		return nil, fmt.Errorf("%w: %d routable, none can %s", errNotCapable, len(ws), what)
	}
	return out, nil
}
