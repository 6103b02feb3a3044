package frontend

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
)

// handleCancel serves POST /v1/requests/{id}/cancel with {"mode":"stop"|"kill"}.
func (rq *requests) handleCancel(w http.ResponseWriter, r *http.Request) {
	public := r.PathValue("id")
	echoRequestID(w, public)
	writeResult(w, rq.cancelRequest(w, r, public))
}

// cancelRequest cancels request public (and its children) as the body asks.
func (rq *requests) cancelRequest(w http.ResponseWriter, r *http.Request, public string) result {
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
	p, err := rq.runtime.Load(r.Context(), id)
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
	if err := rq.runtime.Cancel(r.Context(), id, mode, "cancelled by API", tenant); err != nil {
		return errResult(serverError("cancel_failed", err))
	}
	return okResult(map[string]any{
		"id": public, "object": "request.cancel", "mode": mode, "status": string(p.Status), "cancelled": true,
		"children": publicIDs(tenant, p.Children),
	})
}
