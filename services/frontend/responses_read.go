package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/frontend/openai"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/streams"
)

// Reading a response: its object, its events after a sequence number, its
// input items; and ending it: cancel, delete. Every route answers another
// tenant's response, a deleted one and an unknown id alike: 404.

// loadResponse is the state of the caller's response public from the log:
// streams.ErrNotFound for an unknown id, another tenant's, a request that is
// not a response, or a deleted one.
func (rs *responses) loadResponse(r *http.Request, public string) (*projections.Request, error) {
	tenant := tenantOf(r)
	id, ok := requestID(tenant, public)
	if !ok {
		return nil, fmt.Errorf("%w: %s", streams.ErrNotFound, public)
	}
	p, err := rs.runtime.Load(r.Context(), id)
	if err != nil {
		return nil, err
	}
	if !mayAccess(tenant, p.Accepted) || p.Accepted.Endpoint != events.EndpointResponses || p.Deleted {
		return nil, fmt.Errorf("%w: %s", streams.ErrNotFound, public)
	}
	return p, nil
}

// attachResponse follows the caller's response public, as loadResponse
// finds it. The caller holds one reference.
func (rs *responses) attachResponse(r *http.Request, public string) (*runner.Request, error) {
	t, err := rs.attachFor(r, public)
	if err != nil {
		return nil, err
	}
	var ok bool
	t.View(func(p *projections.Request) { ok = p.Accepted.Endpoint == events.EndpointResponses && !p.Deleted })
	if !ok {
		t.Release()
		return nil, fmt.Errorf("%w: %s", streams.ErrNotFound, public)
	}
	return t, nil
}

// writeResponseLookupError answers a failed lookup of response public.
func writeResponseLookupError(w http.ResponseWriter, public string, err error) {
	if errors.Is(err, streams.ErrNotFound) {
		writeError(w, http.StatusNotFound, "invalid_request_error", "response_not_found",
			fmt.Sprintf("Response with id '%s' not found (never created, deleted, or past retention).", public))
		return
	}
	writeError(w, http.StatusInternalServerError, "server_error", "log_unavailable", err.Error())
}

// writeParamError answers with OpenAI's error shape and its param.
func writeParamError(w http.ResponseWriter, e *openai.ParamError) {
	if e.Status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, e.Status, map[string]any{"error": e.Body()})
}

// responseObject is t's response object now, named public.
func responseObject(public string, t *runner.Request) map[string]any {
	var obj map[string]any
	t.View(func(p *projections.Request) { obj = openai.Response(p, public) })
	return obj
}

// handleResponseGet serves GET /v1/responses/{id}: the object, or with
// stream=true its events after starting_after, then live.
func (rs *responses) handleResponseGet(w http.ResponseWriter, r *http.Request) {
	public := r.PathValue("id")
	stream, perr := streamWanted(r)
	if perr != nil {
		writeParamError(w, perr)
		return
	}
	after, perr := responseAfter(r)
	if perr != nil {
		writeParamError(w, perr)
		return
	}
	t, err := rs.attachResponse(r, public)
	if err != nil {
		writeResponseLookupError(w, public, err)
		return
	}
	defer t.Release()
	release, ok := rs.tenants.countUnlessBackground(w, r, t)
	if !ok {
		return
	}
	defer release()
	t.Claim() // a response whose owner is gone is taken over by whoever reads it
	if !stream {
		rs.catchUp(r, t)
		writeJSON(w, http.StatusOK, responseObject(public, t))
		return
	}
	if after >= 0 {
		name := "starting_after"
		if r.URL.Query().Get(name) == "" {
			name = headerLastEventID
		}
		if perr := pastTheEnd(t, public, after, name); perr != nil {
			writeParamError(w, perr)
			return
		}
	}
	var model string
	t.View(func(p *projections.Request) { model = p.Accepted.Model })
	rs.metrics.resumes.WithLabelValues(model).Inc()
	rs.streamResponse(w, r, t, public, after, func() { rs.onClientGone(t) })
}

// responseAfter reads where a client resumes a response's events
// (openai.ResponseAfter): -1 when it names none.
func responseAfter(r *http.Request) (int, *openai.ParamError) {
	return openai.ResponseAfter(r.Header.Get(headerLastEventID), r.URL.Query().Get("starting_after"))
}

// pastTheEnd refuses an after (read from name) at or past the last event of
// response t so far.
func pastTheEnd(t *runner.Request, public string, after int, name string) *openai.ParamError {
	var n int
	t.View(func(p *projections.Request) { n = openai.ResponseEvents(p) })
	if after < n {
		return nil
	}
	param := ""
	if name == "starting_after" {
		param = name
	}
	return openai.BadParam(param, "invalid_value", "'%s' %d is past the last event of response %s (sequence number %d so far)", name, after, public, n-1)
}

// streamWanted reads stream=true from the query, or from a JSON body (the
// openai-go SDK's GetStreaming sends it so).
func streamWanted(r *http.Request) (bool, *openai.ParamError) {
	if v := r.URL.Query().Get("stream"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return false, openai.BadParam("stream", "invalid_value", "'stream' must be true or false, got %q", v)
		}
		return b, nil
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	var q struct {
		Stream bool `json:"stream"`
	}
	if len(body) > 0 && json.Unmarshal(body, &q) != nil {
		return false, openai.BadParam("", "invalid_json", "request body must be a JSON object")
	}
	return q.Stream, nil
}

// handleResponseCancel serves POST /v1/responses/{id}/cancel: it kills the
// response (at once: the tokens so far stay its output) and answers with
// the object, status cancelled. A response that ended already is answered
// as it is.
func (rs *responses) handleResponseCancel(w http.ResponseWriter, r *http.Request) {
	public, t := rs.attachEnded(w, r)
	if t == nil {
		return
	}
	defer t.Release()
	writeJSON(w, http.StatusOK, responseObject(public, t))
}

// attachEnded follows the response the path names (attachResponse) and ends
// it (endResponse), for the handlers that end a response before they answer.
// On failure it has answered w and t is nil; otherwise the caller releases t.
func (rs *responses) attachEnded(w http.ResponseWriter, r *http.Request) (public string, t *runner.Request) {
	public = r.PathValue("id")
	t, err := rs.attachResponse(r, public)
	if err != nil {
		writeResponseLookupError(w, public, err)
		return public, nil
	}
	if err := rs.endResponse(r, t); err != nil {
		t.Release()
		writeError(w, http.StatusInternalServerError, "server_error", "cancel_failed", err.Error())
		return public, nil
	}
	return public, t
}

// endResponse cancels t (kill) unless it ended, and waits (at most
// streams.DefaultTimeout) until this frontend has folded its end.
func (rs *responses) endResponse(r *http.Request, t *runner.Request) error {
	var terminal bool
	t.View(func(p *projections.Request) { terminal = p.Status.Terminal() })
	if terminal {
		return nil
	}
	if err := rs.runtime.Cancel(r.Context(), t.ID(), events.CancelKill, "cancelled by API", tenantOf(r)); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), streams.DefaultTimeout)
	defer cancel()
	wake := make(chan struct{}, 1)
	defer t.Listen(wake)()
	for {
		t.View(func(p *projections.Request) { terminal = p.Status.Terminal() })
		if terminal {
			return nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return fmt.Errorf("cancel of %s not seen in the log: %w", t.ID(), ctx.Err())
		}
	}
}

// handleResponseDelete serves DELETE /v1/responses/{id}: a response still
// running is cancelled, then a tombstone in the log hides it from every
// frontend.
func (rs *responses) handleResponseDelete(w http.ResponseWriter, r *http.Request) {
	public, t := rs.attachEnded(w, r)
	if t == nil {
		return
	}
	defer t.Release()
	if err := rs.runtime.Delete(r.Context(), t.ID(), tenantOf(r)); err != nil {
		writeRecordError(w, "the deletion", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": public, "object": "response", "deleted": true})
}

// handleInputItems serves GET /v1/responses/{id}/input_items: the items of
// the response's input as the client sent them (not those of its previous
// responses), with OpenAI's list parameters order (default desc), after and
// limit (1-100, default 20).
func (rs *responses) handleInputItems(w http.ResponseWriter, r *http.Request) {
	public := r.PathValue("id")
	qs := r.URL.Query()
	order, limit, perr := openai.InputItemsQuery(qs)
	if perr != nil {
		writeParamError(w, perr)
		return
	}
	p, err := rs.loadResponse(r, public)
	if err != nil {
		writeResponseLookupError(w, public, err)
		return
	}
	writeJSON(w, http.StatusOK, openai.InputItemList(public, p.Accepted, order, qs.Get("after"), limit))
}
