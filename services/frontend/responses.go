package frontend

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/streams"
)

// OpenAI's Responses API over the request runtime: a response is a request
// of endpoint events.EndpointResponses, accepted, routed, migrated,
// cancelled and compacted like any other; only its rendering differs
// (responses_render.go). See responses_parse.go and responses_render.go for
// the OpenAI reference pages followed.

// registerResponses adds the Responses API's routes to mux.
func (fe *Frontend) registerResponses(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/responses", fe.counted(fe.concurrent(fe.handleResponseCreate)))
	mux.HandleFunc("GET /v1/responses/{id}", fe.counted(fe.concurrent(fe.handleResponseGet)))
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
	q, perr := parseResponseRequest(body, fe.cfg.MaxTokensLimit)
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
	if clientID {
		// Idempotent retry: a known id answers with the response it names.
		if t, err := fe.runtime.Attach(r.Context(), id); err == nil {
			fe.serveRetry(w, r, t, public, q, bodySHA)
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
	if apiErr := fe.admit(q.model, events.EndpointResponses, ""); apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	t, err := fe.runtime.Accept(r.Context(), acc)
	if errors.Is(err, runner.ErrExists) { // stored meanwhile by another try of the same id
		if t, err = fe.runtime.Attach(r.Context(), id); err == nil {
			fe.serveRetry(w, r, t, public, q, bodySHA)
			return
		}
	}
	if err != nil {
		writeRecordError(w, "the response", err)
		return
	}
	defer t.Release()
	fe.metrics.active.WithLabelValues(acc.Model).Inc()
	defer fe.metrics.active.WithLabelValues(acc.Model).Dec()
	fe.countRequest(acc.Model, acc.Endpoint, acc.Stream, fe.serveResponse(w, r, t, public, q))
}

// serveRetry answers a create under the id of request t, which exists:
// with that response if it is the caller's, of the same body, and not
// deleted; otherwise a 404 or a 409. It releases t.
func (fe *Frontend) serveRetry(w http.ResponseWriter, r *http.Request, t *runner.Request, public string, q responseRequest, bodySHA string) {
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
	t.Claim()
	fe.serveResponse(w, r, t, public, q)
}

// serveResponse answers a create of response t, new or retried (q is the
// request as sent), and reports whether it ended in success: a background
// response at once with its object, otherwise its stream or, once it
// ended, its object.
func (fe *Frontend) serveResponse(w http.ResponseWriter, r *http.Request, t *runner.Request, public string, q responseRequest) bool {
	if q.background && !q.stream {
		writeJSON(w, http.StatusOK, responseObject(public, t))
		return true
	}
	// Wait until the first dispatch settles, so that "no worker" is still a
	// plain 503 rather than a failed response.
	select {
	case <-t.Dispatched():
	case <-r.Context().Done():
	}
	if s := snapshotOf(t, 0); s.status == projections.StatusFailed && s.Total == 0 {
		return writeUnary(w, s)
	}
	gone := func() { fe.onClientGone(t) }
	if q.stream {
		return fe.streamResponse(w, r, t, public, -1, gone)
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
func (fe *Frontend) responseAccepted(r *http.Request, q responseRequest, body []byte) (events.RequestAccepted, *paramError) {
	var items []inputItem
	if q.instructions != "" {
		items = append(items, inputItem{Type: "message", Role: "system", Text: q.instructions})
	}
	if q.previous != "" {
		turns, err := fe.previousTurns(r, q.previous)
		if err != nil {
			return events.RequestAccepted{}, err
		}
		items = append(items, turns...)
	}
	items = append(items, q.input...)
	prompt := promptText(items)
	promptTokens := estimateTokens(prompt)
	if promptTokens > fe.cfg.Runtime.MaxPromptTokens {
		if q.previous != "" {
			return events.RequestAccepted{}, badParam("previous_response_id", "context_length_exceeded",
				"the conversation is %d tokens with its previous responses, more than the limit of %d (--max-prompt-tokens)", promptTokens, fe.cfg.Runtime.MaxPromptTokens)
		}
		return events.RequestAccepted{}, &paramError{apiError: apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error",
			code: "prompt_too_large", message: fmt.Sprintf("the prompt is %d tokens, more than the limit of %d", promptTokens, fe.cfg.Runtime.MaxPromptTokens)}, param: "input"}
	}
	maxTokens := fe.cfg.DefaultMaxTokens
	if q.maxOutput > 0 {
		maxTokens = q.maxOutput
	}
	chat := q.chat
	chat["model"] = mustMarshal(q.model)
	chat["messages"] = mustMarshal(chatMessages(items))
	chat["max_tokens"] = mustMarshal(maxTokens)
	return events.RequestAccepted{
		Model: q.model, Endpoint: events.EndpointResponses, Body: body, Prompt: prompt,
		PromptTokens: promptTokens, MaxTokens: maxTokens, Stream: q.stream, Frontend: fe.id,
		Resumable:  q.background || strings.EqualFold(r.Header.Get(headerResumable), "true"),
		Background: q.background, ClientModel: fe.cfg.ClientModel,
		EngineEndpoint: events.EndpointChat, EngineBody: mustMarshal(chat),
	}, nil
}

// previousTurns is the conversation that response prev (the caller's)
// ended: its context and input as it was sent to the engine (less its
// instructions, which do not carry over), then its output.
func (fe *Frontend) previousTurns(r *http.Request, prev string) ([]inputItem, *paramError) {
	p, err := fe.loadResponse(r, prev)
	if err != nil {
		if errors.Is(err, streams.ErrNotFound) {
			return nil, &paramError{apiError: apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "previous_response_not_found",
				message: fmt.Sprintf("Previous response with id '%s' not found.", prev)}, param: "previous_response_id"}
		}
		return nil, &paramError{apiError: *serverError("log_unavailable", err), param: "previous_response_id"}
	}
	if !p.Status.Terminal() {
		return nil, badParam("previous_response_id", "previous_response_in_progress", "previous response '%s' has not finished yet", prev)
	}
	var sent struct {
		Messages []chatMessage `json:"messages"`
	}
	_ = json.Unmarshal(p.Accepted.EngineBody, &sent)
	var prevReq struct {
		Instructions string `json:"instructions"`
	}
	_ = json.Unmarshal(p.Accepted.Body, &prevReq)
	msgs := sent.Messages
	if prevReq.Instructions != "" && len(msgs) > 0 {
		msgs = msgs[1:]
	}
	items := itemsOfMessages(msgs)
	b := newRender(prev, p.Accepted, nil)
	b.feed(p.Tokens(0), p.Details(0))
	for _, it := range b.items {
		if it.kind == "function_call" {
			items = append(items, inputItem{Type: "function_call", CallID: it.callID, Name: it.name, Arguments: string(it.text)})
		} else {
			items = append(items, inputItem{Type: "message", Role: "assistant", Text: string(it.text)})
		}
	}
	return items, nil
}
