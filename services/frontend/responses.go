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
	"github.com/baton-dev/baton/services/frontend/httpguard"
	"github.com/baton-dev/baton/services/frontend/openai"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/services/frontend/tenants"
	"github.com/baton-dev/baton/streams"
)

// OpenAI's Responses API over the request runtime: a response is a request
// of endpoint events.EndpointResponses, accepted, routed, migrated,
// cancelled and compacted like any other; only its parsing and rendering
// differ, which the openai package does (openai/responses_parse.go and
// openai/responses_render.go, with the OpenAI reference pages followed).

// responses serves the Responses API. It holds the edge's hold on the
// runtime (requests), the fleet view's changes of the live frontends (a
// reader claims a response whose owner is gone), the tenants' gate and the
// edge's own steps around it.
type responses struct {
	*requests
	fleet   frontendsWatch
	gate    *tenants.Gate
	tenants tenantSlots
}

// frontendsWatch is what a reader that takes requests over asks of the
// fleet view (fleet.Fleet).
type frontendsWatch interface {
	// FrontendsChanged is closed at the next change of the live frontends.
	FrontendsChanged() <-chan struct{}
}

// tenantSlots is what a create and a read of a response ask of the edge
// around the tenants' gate (tenant.go).
type tenantSlots interface {
	chargeBudget(w http.ResponseWriter, r *http.Request, tenant string, tokens int64, ids ...string) (*tenants.Spent, bool)
	countUnlessBackground(w http.ResponseWriter, r *http.Request, t *runner.Request) (release func(), ok bool)
	countUntilEnd(t *runner.Request, tenant string, release, ended func())
	// admitNew admits a new request by the pool's capacity, through the
	// fair queue when it is on.
	admitNew(r *http.Request, tenant, model, endpoint, pinned string, tokens int64) (*tenants.Ticket, *apiError)
}

// register adds the Responses API's routes to mux.
func (rs *responses) register(mux *http.ServeMux) {
	// A create and a read count against the tenant's concurrency in the
	// handler, which knows whether the response runs in the background.
	mux.HandleFunc("POST /v1/responses", rs.counted(rs.handleResponseCreate))
	mux.HandleFunc("GET /v1/responses/{id}", rs.counted(rs.handleResponseGet))
	mux.HandleFunc("POST /v1/responses/{id}/cancel", rs.handleResponseCancel)
	mux.HandleFunc("DELETE /v1/responses/{id}", rs.handleResponseDelete)
	mux.HandleFunc("GET /v1/responses/{id}/input_items", rs.handleInputItems)
}

// handleResponseCreate serves POST /v1/responses.
func (rs *responses) handleResponseCreate(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	if rs.isDraining() {
		writeError(w, http.StatusServiceUnavailable, "service_unavailable", "draining", "Service temporarily unavailable: this frontend is shutting down, please retry")
		return
	}
	c, ok := rs.readCreate(w, r)
	if !ok {
		return
	}
	if c.clientID {
		// Idempotent retry: a known id answers with the response it names.
		if t, err := rs.runtime.Attach(r.Context(), c.id); err == nil {
			rs.serveRetry(w, r, t, c.public, c.q, c.bodySHA, c.after)
			return
		} else if !errors.Is(err, streams.ErrNotFound) {
			writeError(w, http.StatusInternalServerError, "server_error", "log_unavailable", err.Error())
			return
		}
	}
	acc, perr := rs.responseAccepted(r, c.q, c.body)
	if perr != nil {
		writeParamError(w, perr)
		return
	}
	acc.RequestID, acc.Created, acc.Tenant, acc.BodySHA256 = c.id, start.Unix(), c.tenant, c.bodySHA
	acc.PinnedWorker = r.Header.Get(headerWorkerID)
	if e := rs.gate.AdmitLogShare(c.tenant); e != nil {
		e.Write(w)
		return
	}
	tk, apiErr := rs.tenants.admitNew(r, c.tenant, c.q.Model, events.EndpointResponses, acc.PinnedWorker, int64(acc.PromptTokens+acc.MaxTokens))
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	defer tk.End([]string{c.id})
	r = tenants.WithTicket(r, tk)
	if acc.ParentID, apiErr = rs.parentOf(r, c.tenant); apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	rs.start(w, r, c, acc)
}

// create is a response create as read by readCreate.
type create struct {
	tenant   string
	body     []byte // as sent
	bodySHA  string
	q        openai.ResponseRequest
	public   string // the id the client knows it by
	id       string // the internal id
	clientID bool   // public came from the client's X-Request-Id
	after    int    // the sequence number a retried stream resumes after; -1: none
}

// readCreate reads and checks a create's body and headers, answering the
// client when they are wrong (false).
func (rs *responses) readCreate(w http.ResponseWriter, r *http.Request) (create, bool) {
	c := create{tenant: tenantOf(r)}
	body, err := httpguard.Body(w, r, rs.cfg.MaxBodyBytes)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large",
				fmt.Sprintf("request body is larger than the limit of %d bytes", rs.cfg.MaxBodyBytes))
			return c, false
		}
		writeAPIError(w, badRequest("invalid_body", "could not read the request body: %v", err))
		return c, false
	}
	c.body = body
	q, perr := openai.ParseResponseRequest(body, rs.cfg.MaxTokensLimit)
	if perr != nil {
		writeParamError(w, perr)
		return c, false
	}
	c.q = q
	c.public = r.Header.Get(headerRequestID)
	c.clientID = c.public != ""
	if !c.clientID {
		c.public = "resp_" + randomHex(16)
	}
	id, ok := requestID(c.tenant, c.public)
	if !ok {
		writeAPIError(w, badRequest("invalid_request_id", "%s must be 1 to 128 letters, digits, '-' or '_'", headerRequestID))
		return c, false
	}
	c.id = id
	w.Header().Set(headerRequestID, c.public)
	c.bodySHA = fmt.Sprintf("%x", sha256.Sum256(body))
	// The headers of chat, checked as chat checks them: Last-Event-ID
	// (the sequence number a retried stream resumes after), then, for a new
	// response, X-Worker-Id and X-Parent-Request-Id.
	if c.after, perr = responseAfter(r); perr != nil {
		writeParamError(w, perr)
		return c, false
	}
	return c, true
}

// start takes the tenant's slot and budget for new response acc, stores it
// and answers with it (serveResponse); an id stored meanwhile by another
// try of the same create is answered as a retry.
func (rs *responses) start(w http.ResponseWriter, r *http.Request, c create, acc events.RequestAccepted) {
	// One of the tenant's concurrent slots: a response in the background
	// keeps it until it ends, another while this handler runs. Its budget
	// likewise: given back when it ends (Spent.End).
	release, e := rs.gate.Acquire(r.Context(), c.tenant)
	if e != nil {
		e.Write(w)
		return
	}
	spent, ok := rs.tenants.chargeBudget(w, r, c.tenant, int64(acc.PromptTokens+acc.MaxTokens), c.id)
	if !ok {
		release()
		return
	}
	t, err := rs.runtime.Accept(r.Context(), acc)
	if err != nil {
		release()
		spent.Unused()                        // nothing started
		if errors.Is(err, runner.ErrExists) { // stored meanwhile by another try of the same id
			if t, err = rs.runtime.Attach(r.Context(), c.id); err == nil {
				rs.serveRetry(w, r, t, c.public, c.q, c.bodySHA, c.after)
				return
			}
		}
		writeRecordError(w, "the response", err)
		return
	}
	defer t.Release()
	rs.gate.Admitted(acc)
	if !c.q.Background { // a background one's are counted when it ends (countUntilEnd)
		defer rs.gate.Ended(acc.Tenant, t)
	}
	if c.q.Background {
		rs.tenants.countUntilEnd(t, c.tenant, release, spent.End)
	} else {
		defer release()
		defer spent.End()
	}
	if acc.ParentID != "" {
		rs.runtime.Link(r.Context(), acc.ParentID, acc.RequestID)
	}
	rs.metrics.active.WithLabelValues(acc.Model).Inc()
	defer rs.metrics.active.WithLabelValues(acc.Model).Dec()
	rs.countRequest(acc.Model, acc.Endpoint, acc.Stream, rs.serveResponse(w, r, t, c.public, c.q, c.after))
}

// serveRetry answers a create under the id of request t, which exists:
// with that response if it is the caller's, of the same body, and not
// deleted (a stream with its events after sequence number after); otherwise
// a 404, a 409, or a 400 for an after past the end. It releases t.
func (rs *responses) serveRetry(w http.ResponseWriter, r *http.Request, t *runner.Request, public string, q openai.ResponseRequest, bodySHA string, after int) {
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
	release, ok := rs.tenants.countUnlessBackground(w, r, t)
	if !ok {
		return
	}
	defer release()
	t.Claim()
	rs.serveResponse(w, r, t, public, q, after)
}

// serveResponse answers a create of response t, new or retried (q is the
// request as sent), and reports whether it ended in success: a background
// response at once with its object, otherwise its stream (its events after
// sequence number after; -1: all) or, once it ended, its object.
func (rs *responses) serveResponse(w http.ResponseWriter, r *http.Request, t *runner.Request, public string, q openai.ResponseRequest, after int) bool {
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
	tenants.SettleTicket(r)
	if s := snapshotOf(t, 0); s.status == projections.StatusFailed && s.Total == 0 {
		return writeUnary(w, s)
	}
	gone := func() { rs.onClientGone(t) }
	if q.Stream {
		return rs.streamResponse(w, r, t, public, after, gone)
	}
	ok := rs.awaitEnd(r, t, gone)
	if ok {
		writeJSON(w, http.StatusOK, responseObject(public, t))
	}
	return ok
}

// responseAccepted is the accepted record of response request q (body as
// sent): its rendering on chat for engines, with the turns of its previous
// response read from the log, and its prompt text. The caller sets the id,
// time and tenant.
func (rs *responses) responseAccepted(r *http.Request, q openai.ResponseRequest, body []byte) (events.RequestAccepted, *openai.ParamError) {
	var items []openai.InputItem
	if q.Instructions != "" {
		items = append(items, openai.InputItem{Type: "message", Role: "system", Text: q.Instructions})
	}
	if q.Previous != "" {
		turns, err := rs.previousTurns(r, q.Previous)
		if err != nil {
			return events.RequestAccepted{}, err
		}
		items = append(items, turns...)
	}
	items = append(items, q.Input...)
	prompt := openai.PromptText(items)
	promptTokens := openai.EstimateTokens(prompt)
	if promptTokens > rs.cfg.Runtime.MaxPromptTokens {
		if q.Previous != "" {
			return events.RequestAccepted{}, openai.BadParam("previous_response_id", "context_length_exceeded",
				"the conversation is %d tokens with its previous responses, more than the limit of %d (--max-prompt-tokens)", promptTokens, rs.cfg.Runtime.MaxPromptTokens)
		}
		return events.RequestAccepted{}, &openai.ParamError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
			Code: "prompt_too_large", Message: fmt.Sprintf("the prompt is %d tokens, more than the limit of %d", promptTokens, rs.cfg.Runtime.MaxPromptTokens), Param: "input"}
	}
	maxTokens := rs.cfg.DefaultMaxTokens
	if q.MaxOutput > 0 {
		maxTokens = q.MaxOutput
	}
	return events.RequestAccepted{
		Model: q.Model, Endpoint: events.EndpointResponses, Body: body, Prompt: prompt,
		PromptTokens: promptTokens, MaxTokens: maxTokens, Stream: q.Stream, Frontend: rs.id,
		Resumable:  q.Background || strings.EqualFold(r.Header.Get(headerResumable), "true"),
		Background: q.Background, ClientModel: rs.cfg.ClientModel,
		EngineEndpoint: events.EndpointChat, EngineBody: q.EngineBody(items, maxTokens),
	}, nil
}

// previousTurns is the conversation that response prev (the caller's)
// ended, read from the log (openai.PreviousTurns).
func (rs *responses) previousTurns(r *http.Request, prev string) ([]openai.InputItem, *openai.ParamError) {
	p, err := rs.loadResponse(r, prev)
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
