package frontend

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/frontend/openai"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/streams"
)

// OpenAI's Responses API over the request runtime: a response is a request
// of endpoint events.EndpointResponses, accepted, routed, migrated,
// cancelled and compacted like any other; only its parsing and rendering
// differ, which the openai package does (openai/responses_parse.go and
// openai/responses_render.go, with the OpenAI reference pages followed).

// registerResponses adds the Responses API's routes to mux.
func (fe *Frontend) registerResponses(mux *http.ServeMux) {
	// A create and a read count against the tenant's concurrency in the
	// handler, which knows whether the response runs in the background.
	mux.HandleFunc("POST /v1/responses", fe.counted(fe.handleResponseCreate))
	mux.HandleFunc("GET /v1/responses/{id}", fe.counted(fe.handleResponseGet))
	mux.HandleFunc("POST /v1/responses/{id}/cancel", fe.handleResponseCancel)
	mux.HandleFunc("DELETE /v1/responses/{id}", fe.handleResponseDelete)
	mux.HandleFunc("GET /v1/responses/{id}/input_items", fe.handleInputItems)
}

// handleResponseCreate serves POST /v1/responses.
func (fe *Frontend) handleResponseCreate(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	tenant := tenantOf(r)
	if fe.isDraining() {
		writeError(w, http.StatusServiceUnavailable, "service_unavailable", "draining", "Service temporarily unavailable: this frontend is shutting down, please retry")
		return
	}
	body, err := requestBody(w, r, fe.cfg.MaxBodyBytes)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large",
				fmt.Sprintf("request body is larger than the limit of %d bytes", fe.cfg.MaxBodyBytes))
			return
		}
		writeAPIError(w, badRequest("invalid_body", "could not read the request body: %v", err))
		return
	}
	q, perr := openai.ParseResponseRequest(body, fe.cfg.MaxTokensLimit)
	if perr != nil {
		writeParamError(w, perr)
		return
	}
	public := r.Header.Get(headerRequestID)
	clientID := public != ""
	if !clientID {
		public = "resp_" + randomHex(16)
	}
	id, ok := requestID(tenant, public)
	if !ok {
		writeAPIError(w, badRequest("invalid_request_id", "%s must be 1 to 128 letters, digits, '-' or '_'", headerRequestID))
		return
	}
	w.Header().Set(headerRequestID, public)
	bodySHA := fmt.Sprintf("%x", sha256.Sum256(body))
	// The headers of chat, checked as chat checks them: Last-Event-ID
	// (the sequence number a retried stream resumes after), then, for a new
	// response, X-Worker-Id and X-Parent-Request-Id.
	after, perr := responseAfter(r)
	if perr != nil {
		writeParamError(w, perr)
		return
	}
	if clientID {
		// Idempotent retry: a known id answers with the response it names.
		if t, err := fe.runtime.Attach(r.Context(), id); err == nil {
			fe.serveRetry(w, r, t, public, q, bodySHA, after)
			return
		} else if !errors.Is(err, streams.ErrNotFound) {
			writeError(w, http.StatusInternalServerError, "server_error", "log_unavailable", err.Error())
			return
		}
	}
	acc, perr := fe.responseAccepted(r, q, body)
	if perr != nil {
		writeParamError(w, perr)
		return
	}
	acc.RequestID, acc.Created, acc.Tenant, acc.BodySHA256 = id, start.Unix(), tenant, bodySHA
	acc.PinnedWorker = r.Header.Get(headerWorkerID)
	tk, apiErr := fe.admitNew(r, tenant, q.Model, events.EndpointResponses, acc.PinnedWorker, int64(acc.PromptTokens+acc.MaxTokens))
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	defer tk.end([]string{id})
	r = withTicket(r, tk)
	if acc.ParentID, apiErr = fe.parentOf(r, tenant); apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	// One of the tenant's concurrent slots: a response in the background
	// keeps it until it ends, another while this handler runs. Its budget
	// likewise: given back when it ends (budget.end).
	if !fe.limits.acquire(tenant) {
		fe.writeConcurrencyLimit(w, tenant)
		return
	}
	spent, ok := fe.chargeBudget(w, r, tenant, int64(acc.PromptTokens+acc.MaxTokens), id)
	if !ok {
		fe.limits.release(tenant)
		return
	}
	t, err := fe.runtime.Accept(r.Context(), acc)
	if err != nil {
		fe.limits.release(tenant)
		spent.grant.Release(0)                // nothing started
		if errors.Is(err, runner.ErrExists) { // stored meanwhile by another try of the same id
			if t, err = fe.runtime.Attach(r.Context(), id); err == nil {
				fe.serveRetry(w, r, t, public, q, bodySHA, after)
				return
			}
		}
		writeRecordError(w, "the response", err)
		return
	}
	defer t.Release()
	if q.Background {
		fe.countUntilEnd(t, tenant, spent.end)
	} else {
		defer fe.limits.release(tenant)
		defer spent.end()
	}
	if acc.ParentID != "" {
		fe.runtime.Link(r.Context(), acc.ParentID, acc.RequestID)
	}
	fe.metrics.active.WithLabelValues(acc.Model).Inc()
	defer fe.metrics.active.WithLabelValues(acc.Model).Dec()
	fe.countRequest(acc.Model, acc.Endpoint, acc.Stream, fe.serveResponse(w, r, t, public, q, after))
}

// serveRetry answers a create under the id of request t, which exists:
// with that response if it is the caller's, of the same body, and not
// deleted (a stream with its events after sequence number after); otherwise
// a 404, a 409, or a 400 for an after past the end. It releases t.
func (fe *Frontend) serveRetry(w http.ResponseWriter, r *http.Request, t *runner.Request, public string, q openai.ResponseRequest, bodySHA string, after int) {
	defer t.Release()
	if apiErr := reuseError(t, tenantOf(r), public, events.EndpointResponses, bodySHA); apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	var deleted bool
	t.View(func(p *projections.Request) { deleted = p.Deleted })
	if deleted {
		writeAPIError(w, &apiError{status: http.StatusConflict, typ: "invalid_request_error", code: "request_id_conflict",
			message: fmt.Sprintf("response %s was deleted: use a new %s", public, headerRequestID)})
		return
	}
	if q.Stream && after >= 0 {
		if perr := pastTheEnd(t, public, after, headerLastEventID); perr != nil {
			writeParamError(w, perr)
			return
		}
	}
	release, ok := fe.countUnlessBackground(w, r, t)
	if !ok {
		return
	}
	defer release()
	t.Claim()
	fe.serveResponse(w, r, t, public, q, after)
}

// serveResponse answers a create of response t, new or retried (q is the
// request as sent), and reports whether it ended in success: a background
// response at once with its object, otherwise its stream (its events after
// sequence number after; -1: all) or, once it ended, its object.
func (fe *Frontend) serveResponse(w http.ResponseWriter, r *http.Request, t *runner.Request, public string, q openai.ResponseRequest, after int) bool {
	if q.Background && !q.Stream {
		writeJSON(w, http.StatusOK, responseObject(public, t))
		return true
	}
	// Wait until the first dispatch settles, so that "no worker" is still a
	// plain 503 rather than a failed response.
	select {
	case <-t.Dispatched():
	case <-r.Context().Done():
	}
	settleTicket(r)
	if s := snapshotOf(t, 0); s.status == projections.StatusFailed && s.Total == 0 {
		return writeUnary(w, s)
	}
	gone := func() { fe.onClientGone(t) }
	if q.Stream {
		return fe.streamResponse(w, r, t, public, after, gone)
	}
	ok := fe.awaitEnd(r, t, gone)
	if ok {
		writeJSON(w, http.StatusOK, responseObject(public, t))
	}
	return ok
}

// responseAccepted is the accepted record of response request q (body as
// sent): its rendering on chat for engines, with the turns of its previous
// response read from the log, and its prompt text. The caller sets the id,
// time and tenant.
func (fe *Frontend) responseAccepted(r *http.Request, q openai.ResponseRequest, body []byte) (events.RequestAccepted, *openai.ParamError) {
	var items []openai.InputItem
	if q.Instructions != "" {
		items = append(items, openai.InputItem{Type: "message", Role: "system", Text: q.Instructions})
	}
	if q.Previous != "" {
		turns, err := fe.previousTurns(r, q.Previous)
		if err != nil {
			return events.RequestAccepted{}, err
		}
		items = append(items, turns...)
	}
	items = append(items, q.Input...)
	prompt := openai.PromptText(items)
	promptTokens := estimateTokens(prompt)
	if promptTokens > fe.cfg.Runtime.MaxPromptTokens {
		if q.Previous != "" {
			return events.RequestAccepted{}, openai.BadParam("previous_response_id", "context_length_exceeded",
				"the conversation is %d tokens with its previous responses, more than the limit of %d (--max-prompt-tokens)", promptTokens, fe.cfg.Runtime.MaxPromptTokens)
		}
		return events.RequestAccepted{}, &openai.ParamError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
			Code: "prompt_too_large", Message: fmt.Sprintf("the prompt is %d tokens, more than the limit of %d", promptTokens, fe.cfg.Runtime.MaxPromptTokens), Param: "input"}
	}
	maxTokens := fe.cfg.DefaultMaxTokens
	if q.MaxOutput > 0 {
		maxTokens = q.MaxOutput
	}
	return events.RequestAccepted{
		Model: q.Model, Endpoint: events.EndpointResponses, Body: body, Prompt: prompt,
		PromptTokens: promptTokens, MaxTokens: maxTokens, Stream: q.Stream, Frontend: fe.id,
		Resumable:  q.Background || strings.EqualFold(r.Header.Get(headerResumable), "true"),
		Background: q.Background, ClientModel: fe.cfg.ClientModel,
		EngineEndpoint: events.EndpointChat, EngineBody: q.EngineBody(items, maxTokens),
	}, nil
}

// previousTurns is the conversation that response prev (the caller's)
// ended, read from the log (openai.PreviousTurns).
func (fe *Frontend) previousTurns(r *http.Request, prev string) ([]openai.InputItem, *openai.ParamError) {
	p, err := fe.loadResponse(r, prev)
	if err != nil {
		if errors.Is(err, streams.ErrNotFound) {
			return nil, &openai.ParamError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "previous_response_not_found",
				Message: fmt.Sprintf("Previous response with id '%s' not found.", prev), Param: "previous_response_id"}
		}
		return nil, &openai.ParamError{Status: http.StatusInternalServerError, Type: "server_error", Code: "log_unavailable",
			Message: err.Error(), Param: "previous_response_id"}
	}
	if !p.Status.Terminal() {
		return nil, openai.BadParam("previous_response_id", "previous_response_in_progress", "previous response '%s' has not finished yet", prev)
	}
	return openai.PreviousTurns(prev, p), nil
}
