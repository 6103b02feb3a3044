package frontend

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/services/frontend/tenants"
	"github.com/baton-dev/baton/streams"
)

// The edge's side of its tenants: it asks the gate (package tenants) of
// every request, and keeps only what is the edge's own, the HTTP chain and
// the watchers of background responses, which the drain stops.

// CheckTenantBudgetsFile reads and checks a budgets file as the frontend
// will, so that a bad file is a configuration error at start.
func CheckTenantBudgetsFile(path string) error { return tenants.CheckBudgetsFile(path) }

// ReloadBudgets reads the budgets file again (on SIGHUP). On an error the
// budgets in use stay and the error is returned; without a file it does
// nothing.
func (fe *Frontend) ReloadBudgets() error {
	if err := fe.tenants.Reload(); err != nil {
		return fmt.Errorf("frontend: %w", err)
	}
	return nil
}

// tenantGate sets the tenant's x-ratelimit-* headers on every answer
// (those of a tenant with a per-minute budget) and answers 429 with
// Retry-After to a tenant over --tenant-rps. The probes and /metrics are
// neither.
func (fe *Frontend) tenantGate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !openPath(r.URL.Path) {
			tenant := tenantOf(r)
			fe.tenants.Headers(w, tenant)
			if e := fe.tenants.Rate(tenant); e != nil {
				e.Write(w)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// concurrent answers 429 with Retry-After to a tenant that already has its
// maximum of responses open (completions and resumes).
func (fe *Frontend) concurrent(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		release, e := fe.tenants.Acquire(r.Context(), tenantOf(r))
		if e != nil {
			e.Write(w)
			return
		}
		defer release()
		h(w, r)
	}
}

// refusal is e as an apiError, for the paths that answer one.
func refusal(e *tenants.Refusal) *apiError {
	if e == nil {
		return nil
	}
	return &apiError{status: e.Status, typ: e.Type, code: e.Code, message: e.Message}
}

// admitNew is admit for a new request of tenant reserving tokens, through
// the fair queue when it is on (tenants.Gate.Admit). Pinned requests, and
// those the queue does not hold, are answered as by admit.
func (fe *Frontend) admitNew(r *http.Request, tenant, model, endpoint, pinned string, tokens int64) (*tenants.Ticket, *apiError) {
	if !fe.tenants.Queues() || pinned != "" {
		return nil, fe.admit(model, endpoint, pinned)
	}
	tk, err := fe.tenants.Admit(r.Context(), tenant, model, endpoint, tokens)
	var e *tenants.Refusal
	switch {
	case err == nil:
		return tk, nil
	case errors.As(err, &e):
		return nil, refusal(e)
	default: // tenants.ErrNotQueued
		return nil, fe.admit(model, endpoint, pinned) // the same answer, counted as admit counts it
	}
}

// chargeBudget charges a create's budget (tenants.Gate.Charge), answering
// the refusal itself.
func (fe *Frontend) chargeBudget(w http.ResponseWriter, r *http.Request, tenant string, tokens int64, ids ...string) (*tenants.Spent, bool) {
	spent, e := fe.tenants.Charge(r.Context(), w, tenant, tokens, ids...)
	if e != nil {
		e.Write(w)
		return nil, false
	}
	return spent, true
}

// countUnlessBackground takes one of the caller's concurrent slots for a
// reader of request t (answering 429 when none is left, and returning
// false), unless t runs in the background: a background response counts
// once, from its create until it ends (countUntilEnd), not again for each
// reader. The caller gives the slot back with the returned release.
func (fe *Frontend) countUnlessBackground(w http.ResponseWriter, r *http.Request, t *runner.Request) (release func(), ok bool) {
	var background bool
	t.View(func(p *projections.Request) { background = p.Accepted.Background })
	if background {
		return func() {}, true
	}
	release, e := fe.tenants.Acquire(r.Context(), tenantOf(r))
	if e != nil {
		e.Write(w)
		return nil, false
	}
	return release, true
}

// countUntilEnd keeps the slot of tenant its caller took for background
// response t until t ends (completed, failed or cancelled, whichever
// frontend stored the end), whether or not a client reads it, or until the
// frontend stops; then it gives the slot back (release) and calls ended
// (the budget's give-back). It takes its own reference to t.
func (fe *Frontend) countUntilEnd(t *runner.Request, tenant string, release, ended func()) {
	ctx, cancel := context.WithTimeout(context.Background(), streams.DefaultTimeout)
	held, err := fe.runtime.Attach(ctx, t.ID()) // t is followed here: a new reference
	cancel()
	if err != nil || !fe.startBackground() {
		if err == nil {
			held.Release()
		}
		release()
		ended()
		return
	}
	go func() {
		defer fe.background.Done()
		defer ended()
		defer release()
		defer held.Release()
		wake := make(chan struct{}, 1)
		defer held.Listen(wake)()
		for {
			var terminal bool
			held.View(func(p *projections.Request) { terminal = p.Status.Terminal() })
			if terminal {
				fe.tenants.Ended(tenant, held)
				return
			}
			select {
			case <-wake:
			case <-fe.stopped:
				return
			}
		}
	}()
}
