package frontend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/fleet"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/streams"
)

// requests is how the edge's APIs use the request runtime: admission before
// the log is written, a caller's lookups of its own requests and parents,
// the state read and cancel (GET /v1/requests/{id}, POST .../cancel), and
// what a client that left leaves behind. The chat and
// completions handlers (Frontend, which embeds it) and the Responses API's
// (responses) share it. It is set up by New and not changed after.
type requests struct {
	id      string // this replica's name
	cfg     Config
	log     *slog.Logger
	runtime *runner.Runner
	metrics *metrics
	*drain  // the shutdown: a client cut by it leaves its request running
}

// admit checks that the model is served and that some worker can take the
// request, before anything is written to the log (runner.Runner.Admit), and
// says why not in OpenAI's error shape.
func (rq *requests) admit(model, endpoint, pinned string) *apiError {
	err := rq.runtime.Admit(model, endpoint, pinned)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fleet.ErrUnknownModel):
		return &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "model_not_found",
			message: fmt.Sprintf("The model '%s' does not exist or no worker serves it", model)}
	case errors.Is(err, fleet.ErrWorkerNotFound):
		return &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "worker_not_found",
			message: fmt.Sprintf("worker '%s' (%s) is not in discovery for model '%s'", pinned, headerWorkerID, model)}
	case errors.Is(err, fleet.ErrNoWorkers):
		return &apiError{status: http.StatusServiceUnavailable, typ: "service_unavailable", code: "no_workers",
			message: fmt.Sprintf("Service temporarily unavailable: no worker is ready for model '%s', please retry later", model)}
	default: // fleet.ErrAllBusy
		return &apiError{status: http.StatusServiceUnavailable, typ: "service_unavailable", code: "all_workers_busy", message: busyMessage}
	}
}

// attachFor follows the request that the caller of r names public, if it
// may see it; for anyone else it is streams.ErrNotFound, as for an id that
// does not exist. The caller holds one reference.
func (rq *requests) attachFor(r *http.Request, public string) (*runner.Request, error) {
	tenant := tenantOf(r)
	id, ok := requestID(tenant, public)
	if !ok {
		return nil, fmt.Errorf("%w: %s", streams.ErrNotFound, public)
	}
	t, err := rq.runtime.Attach(r.Context(), id)
	if err != nil {
		return nil, err
	}
	var acc events.RequestAccepted
	t.View(func(p *projections.Request) { acc = p.Accepted })
	if !mayAccess(tenant, acc) {
		t.Release()
		return nil, fmt.Errorf("%w: %s", streams.ErrNotFound, public)
	}
	return t, nil
}

// parentOf is the internal id of r's X-Parent-Request-Id ("" for none),
// once checkParent allows it.
func (rq *requests) parentOf(r *http.Request, tenant string) (string, *apiError) {
	parent := r.Header.Get(headerParentID)
	if parent == "" {
		return "", nil
	}
	if !streams.ValidRequestID(parent) {
		return "", badRequest("invalid_parent_id", "%s must be a request id", headerParentID)
	}
	if apiErr := rq.checkParent(r.Context(), tenant, parent); apiErr != nil {
		return "", apiErr
	}
	id, _ := requestID(tenant, parent)
	return id, nil
}

// checkParent checks that tenant may hang a child off parent (its own
// request, or any as the admin) and that the parent has room for one more
// child (Config.MaxChildren).
func (rq *requests) checkParent(ctx context.Context, tenant, parent string) *apiError {
	missing := &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "parent_not_found",
		message: fmt.Sprintf("parent request %q (%s) is not in the log", parent, headerParentID)}
	id, ok := requestID(tenant, parent)
	if !ok {
		return missing
	}
	p, err := rq.runtime.Load(ctx, id)
	if errors.Is(err, streams.ErrNotFound) {
		return missing
	}
	if err != nil {
		return &apiError{status: http.StatusInternalServerError, typ: "server_error", code: "log_unavailable", message: err.Error()}
	}
	if !mayAccess(tenant, p.Accepted) {
		return missing
	}
	if len(p.Children) >= rq.cfg.Runtime.MaxChildren {
		return badRequest("too_many_children", "parent request %s has %d children, the limit (--max-children)", parent, len(p.Children))
	}
	return nil
}

// handleRequest serves GET /v1/requests/{id}: the request's state from the log.
func (rq *requests) handleRequest(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	echoRequestID(w, id)
	writeResult(w, rq.requestState(r, id))
}

func (rq *requests) requestState(r *http.Request, id string) result {
	t, err := rq.attachFor(r, id)
	if err != nil {
		return errResult(&lookupError{id: id, err: err})
	}
	defer t.Release()
	rq.catchUp(r, t)
	var state RequestState
	t.View(func(p *projections.Request) { state = stateOf(p) })
	if tenant := tenantOf(r); tenant != "" && tenant != streams.AdminTenant {
		state.ID, state.ParentID = id, publicID(tenant, state.ParentID)
		state.Children = publicIDs(tenant, state.Children)
	}
	return okResult(state)
}

// catchUp brings t, which a state read is about to render, up to the log:
// a cancel another frontend just stored is there, even when its live copy
// is still on its way here. A log that does not answer leaves what was
// applied, which is at most that far behind.
func (rq *requests) catchUp(r *http.Request, t *runner.Request) {
	if err := t.CatchUp(r.Context()); err != nil && r.Context().Err() == nil {
		rq.log.Debug("catch up before a state read", "request_id", t.ID(), "err", err)
	}
}

func (rq *requests) countRequest(model, endpoint string, stream bool, ok bool) {
	status := "success"
	if !ok {
		status = "error"
	}
	rq.metrics.requests.WithLabelValues(model, endpoint, requestType(stream), status).Inc()
}

// onClientGone handles a client that left before its response ended: a
// non-resumable request is cancelled (kill); a resumable one keeps generating.
func (rq *requests) onClientGone(t *runner.Request) {
	rq.metrics.disconnected.Inc()
	var resumable, terminal bool
	t.View(func(p *projections.Request) { resumable, terminal = p.Accepted.Resumable, p.Status.Terminal() })
	if resumable || terminal || rq.isClosing() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), streams.DefaultTimeout)
	defer cancel()
	if err := rq.runtime.Cancel(ctx, t.ID(), events.CancelKill, "client disconnected", ""); err != nil {
		rq.log.Warn("cancel after client disconnect", "request_id", t.ID(), "err", err)
	}
}

// onGroupGone cancels a non-resumable group whose client left.
func (rq *requests) onGroupGone(parent events.RequestAccepted) {
	rq.metrics.disconnected.Inc()
	if parent.Resumable || rq.isClosing() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), streams.DefaultTimeout)
	defer cancel()
	if err := rq.runtime.Cancel(ctx, parent.RequestID, events.CancelKill, "client disconnected", ""); err != nil {
		rq.log.Warn("cancel after client disconnect", "request_id", parent.RequestID, "err", err)
	}
}
