package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

// maxTreeSize bounds how many requests one cancellation walks.
const maxTreeSize = 10_000

// cancelTree cancels request id and, breadth first, every request below it.
// A cancel is an event on each request's events subject, so every frontend
// following the request ends its streams, and a command to the worker of
// its current attempt, which stops. Requests that already ended are skipped.
func (fe *Frontend) cancelTree(ctx context.Context, id, mode, reason string) error {
	return fe.cancelTreeBy(ctx, id, mode, reason, "")
}

// cancelTreeBy is cancelTree on behalf of an API tenant, recorded in each
// cancel event.
func (fe *Frontend) cancelTreeBy(ctx context.Context, id, mode, reason, tenant string) error {
	queue, seen := []string{id}, map[string]bool{id: true}
	var errs []error
	for len(queue) > 0 && len(seen) <= maxTreeSize {
		cur := queue[0]
		queue = queue[1:]
		p, err := fe.load(ctx, cur)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !p.Status.Terminal() {
			if err := fe.cancel(ctx, cur, mode, reason, tenant); err != nil {
				errs = append(errs, err)
			} else {
				fe.sendCancel(p, mode, reason)
				fe.metrics.cancellations.WithLabelValues(p.Accepted.Model, p.Accepted.Endpoint, requestType(p.Accepted.Stream)).Inc()
			}
		}
		for _, c := range p.Children {
			if !seen[c] {
				seen[c] = true
				queue = append(queue, c)
			}
		}
	}
	return errors.Join(errs...)
}

// load returns the current state of request id: from this frontend's
// follower if it has one, else folded from the log.
func (fe *Frontend) load(ctx context.Context, id string) (*projections.Request, error) {
	if t, ok := fe.acquire(id); ok {
		defer fe.release(t)
		p := projections.NewRequest()
		t.f.view(func(cur *projections.Request) { *p = *cur })
		return p, nil
	}
	p := projections.NewRequest()
	for e, err := range streams.ReadRequest(ctx, fe.js, fe.parts, id, 1) {
		if err != nil {
			return nil, err
		}
		p.Apply(e)
	}
	if !p.Known() {
		return nil, fmt.Errorf("%w: %s", streams.ErrNotFound, id)
	}
	return p, nil
}

// handleCancel serves POST /v1/requests/{id}/cancel with {"mode":"stop"|"kill"}.
func (fe *Frontend) handleCancel(w http.ResponseWriter, r *http.Request) {
	public := r.PathValue("id")
	echoRequestID(w, public)
	writeResult(w, fe.cancelRequest(w, r, public))
}

// cancelRequest cancels request public (and its children) as the body asks.
func (fe *Frontend) cancelRequest(w http.ResponseWriter, r *http.Request, public string) result {
	tenant := tenantOf(r)
	id, ok := requestID(tenant, public)
	if !ok {
		return errResult(notFound(public))
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil {
		return errResult(badRequest("invalid_body", "could not read the request body: %v", err))
	}
	req := struct {
		Mode *string `json:"mode"`
	}{}
	if len(body) > 0 {
		if err := json.Unmarshal(body, &req); err != nil {
			return errResult(badRequest("invalid_json", "request body must be {\"mode\": \"stop\" | \"kill\"}: %v", err))
		}
	}
	mode := events.CancelStop
	if req.Mode != nil {
		mode = *req.Mode
	}
	if mode != events.CancelStop && mode != events.CancelKill {
		return errResult(badRequest("invalid_value", "'mode' must be \"stop\" or \"kill\", got %q", mode))
	}
	p, err := fe.load(r.Context(), id)
	if err == nil && !mayAccess(tenant, p.Accepted) {
		err = streams.ErrNotFound
	}
	if err != nil {
		return errResult(&lookupError{id: public, err: err})
	}
	if p.Status.Terminal() && len(p.Children) == 0 {
		return okResult(map[string]any{
			"id": public, "object": "request.cancel", "mode": mode, "status": string(p.Status), "cancelled": false,
			"message": fmt.Sprintf("request %s already ended (%s): nothing to cancel", public, p.Status),
		})
	}
	if err := fe.cancelTreeBy(r.Context(), id, mode, "cancelled by API", tenant); err != nil {
		return errResult(serverError("cancel_failed", err))
	}
	return okResult(map[string]any{
		"id": public, "object": "request.cancel", "mode": mode, "status": string(p.Status), "cancelled": true,
		"children": publicIDs(tenant, p.Children),
	})
}

// sendCancel sends a cancel in mode to the worker of p's current attempt, if
// it runs. An attempt routed meanwhile gets it from the owner's runner.
func (fe *Frontend) sendCancel(p *projections.Request, mode, reason string) {
	if cur, ok := p.Current(); ok && !cur.Closed {
		fe.command(cur.WorkerID, streams.Command{RequestID: p.Accepted.RequestID, Attempt: cur.Attempt,
			Kind: streams.CommandCancel, Mode: mode, Reason: reason})
	}
}
