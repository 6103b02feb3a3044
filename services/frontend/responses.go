package frontend

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
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
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, fe.cfg.MaxBodyBytes))
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
	if s := snapshotOf(t, 0); s.status == projections.StatusFailed && s.total == 0 {
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
	if promptTokens > fe.cfg.MaxPromptTokens {
		if q.previous != "" {
			return events.RequestAccepted{}, badParam("previous_response_id", "context_length_exceeded",
				"the conversation is %d tokens with its previous responses, more than the limit of %d (--max-prompt-tokens)", promptTokens, fe.cfg.MaxPromptTokens)
		}
		return events.RequestAccepted{}, &paramError{apiError: apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error",
			code: "prompt_too_large", message: fmt.Sprintf("the prompt is %d tokens, more than the limit of %d", promptTokens, fe.cfg.MaxPromptTokens)}, param: "input"}
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
		Resumable:      q.background || strings.EqualFold(r.Header.Get(headerResumable), "true"),
		Background:     q.background,
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

// chatMessage is a chat message as chatMessages writes it.
type chatMessage struct {
	Role       string  `json:"role"`
	Content    *string `json:"content"`
	ToolCallID string  `json:"tool_call_id"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// itemsOfMessages is chatMessages in reverse.
func itemsOfMessages(msgs []chatMessage) []inputItem {
	var out []inputItem
	for _, m := range msgs {
		text := ""
		if m.Content != nil {
			text = *m.Content
		}
		switch {
		case m.Role == "tool":
			out = append(out, inputItem{Type: "function_call_output", CallID: m.ToolCallID, Output: text})
		case len(m.ToolCalls) > 0:
			for _, c := range m.ToolCalls {
				out = append(out, inputItem{Type: "function_call", CallID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
			}
		default:
			out = append(out, inputItem{Type: "message", Role: m.Role, Text: text})
		}
	}
	return out
}

// loadResponse is the state of the caller's response public from the log:
// streams.ErrNotFound for an unknown id, another tenant's, a request that is
// not a response, or a deleted one.
func (fe *Frontend) loadResponse(r *http.Request, public string) (*projections.Request, error) {
	tenant := tenantOf(r)
	id, ok := requestID(tenant, public)
	if !ok {
		return nil, fmt.Errorf("%w: %s", streams.ErrNotFound, public)
	}
	p, err := fe.runtime.Load(r.Context(), id)
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
func (fe *Frontend) attachResponse(r *http.Request, public string) (*runner.Request, error) {
	t, err := fe.attachFor(r, public)
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

// responseObject is t's response object now.
func responseObject(public string, t *runner.Request) map[string]any {
	var obj map[string]any
	t.View(func(p *projections.Request) { obj, _ = renderResponse(public, p, nil) })
	return obj
}

// handleResponseGet serves GET /v1/responses/{id}: the object, or with
// stream=true its events after starting_after, then live.
func (fe *Frontend) handleResponseGet(w http.ResponseWriter, r *http.Request) {
	public := r.PathValue("id")
	stream, perr := streamWanted(r)
	if perr != nil {
		writeParamError(w, perr)
		return
	}
	after := -1
	if v := r.URL.Query().Get("starting_after"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeParamError(w, badParam("starting_after", "invalid_value", "'starting_after' must be a sequence number (a whole number), got %q", v))
			return
		}
		after = n
	}
	t, err := fe.attachResponse(r, public)
	if err != nil {
		writeResponseLookupError(w, public, err)
		return
	}
	defer t.Release()
	t.Claim() // a response whose owner is gone is taken over by whoever reads it
	if !stream {
		writeJSON(w, http.StatusOK, responseObject(public, t))
		return
	}
	n := 1 << 62 // events so far: counted only for a starting_after to check
	var model string
	t.View(func(p *projections.Request) {
		if model = p.Accepted.Model; after >= 0 {
			_, n = renderResponse(public, p, nil)
		}
	})
	if after >= n {
		writeParamError(w, badParam("starting_after", "invalid_value",
			"'starting_after' %d is past the last event of response %s (sequence number %d so far)", after, public, n-1))
		return
	}
	fe.metrics.resumes.WithLabelValues(model).Inc()
	fe.streamResponse(w, r, t, public, after, func() { fe.onClientGone(t) })
}

// streamWanted reads stream=true from the query, or from a JSON body (the
// openai-go SDK's GetStreaming sends it so).
func streamWanted(r *http.Request) (bool, *paramError) {
	if v := r.URL.Query().Get("stream"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return false, badParam("stream", "invalid_value", "'stream' must be true or false, got %q", v)
		}
		return b, nil
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	var q struct {
		Stream bool `json:"stream"`
	}
	if len(body) > 0 && json.Unmarshal(body, &q) != nil {
		return false, badParam("", "invalid_json", "request body must be a JSON object")
	}
	return q.Stream, nil
}

// handleResponseCancel serves POST /v1/responses/{id}/cancel: it kills the
// response (at once: the tokens so far stay its output) and answers with
// the object, status cancelled. A response that ended already is answered
// as it is.
func (fe *Frontend) handleResponseCancel(w http.ResponseWriter, r *http.Request) {
	public := r.PathValue("id")
	t, err := fe.attachResponse(r, public)
	if err != nil {
		writeResponseLookupError(w, public, err)
		return
	}
	defer t.Release()
	if err := fe.endResponse(r, t); err != nil {
		writeError(w, http.StatusInternalServerError, "server_error", "cancel_failed", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, responseObject(public, t))
}

// endResponse cancels t (kill) unless it ended, and waits (at most
// streams.DefaultTimeout) until this frontend has folded its end.
func (fe *Frontend) endResponse(r *http.Request, t *runner.Request) error {
	var terminal bool
	t.View(func(p *projections.Request) { terminal = p.Status.Terminal() })
	if terminal {
		return nil
	}
	if err := fe.runtime.Cancel(r.Context(), t.ID(), events.CancelKill, "cancelled by API", tenantOf(r)); err != nil {
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
func (fe *Frontend) handleResponseDelete(w http.ResponseWriter, r *http.Request) {
	public := r.PathValue("id")
	t, err := fe.attachResponse(r, public)
	if err != nil {
		writeResponseLookupError(w, public, err)
		return
	}
	defer t.Release()
	if err := fe.endResponse(r, t); err != nil {
		writeError(w, http.StatusInternalServerError, "server_error", "cancel_failed", err.Error())
		return
	}
	if err := fe.runtime.Delete(r.Context(), t.ID(), tenantOf(r)); err != nil {
		writeRecordError(w, "the deletion", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": public, "object": "response", "deleted": true})
}

// handleInputItems serves GET /v1/responses/{id}/input_items: the items of
// the response's input as the client sent them (not those of its previous
// responses), with OpenAI's list parameters order (default desc), after and
// limit (1-100, default 20).
func (fe *Frontend) handleInputItems(w http.ResponseWriter, r *http.Request) {
	public := r.PathValue("id")
	qs := r.URL.Query()
	limit := 20
	if v := qs.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			writeParamError(w, badParam("limit", "invalid_value", "'limit' must be an integer from 1 to 100, got %q", v))
			return
		}
		limit = n
	}
	order := qs.Get("order")
	if order == "" {
		order = "desc"
	}
	if order != "asc" && order != "desc" {
		writeParamError(w, badParam("order", "invalid_value", "'order' must be asc or desc, got %q", order))
		return
	}
	p, err := fe.loadResponse(r, public)
	if err != nil {
		writeResponseLookupError(w, public, err)
		return
	}
	q, _ := parseResponseRequest(p.Accepted.Body, 1<<30)
	data := make([]map[string]any, 0, len(q.input))
	for i, it := range q.input {
		data = append(data, inputItemJSON(public, i, it))
	}
	if order == "desc" {
		for i, j := 0, len(data)-1; i < j; i, j = i+1, j-1 {
			data[i], data[j] = data[j], data[i]
		}
	}
	if after := qs.Get("after"); after != "" {
		for i, d := range data {
			if d["id"] == after {
				data = data[i+1:]
				break
			}
		}
	}
	more := len(data) > limit
	if more {
		data = data[:limit]
	}
	list := map[string]any{"object": "list", "data": data, "has_more": more, "first_id": nil, "last_id": nil}
	if len(data) > 0 {
		list["first_id"], list["last_id"] = data[0]["id"], data[len(data)-1]["id"]
	}
	writeJSON(w, http.StatusOK, list)
}

// inputItemJSON is input item i of response public in OpenAI's shape.
func inputItemJSON(public string, i int, it inputItem) map[string]any {
	id := "item_" + public + "_" + strconv.Itoa(i)
	switch it.Type {
	case "function_call":
		return map[string]any{"id": id, "type": it.Type, "status": "completed", "call_id": it.CallID, "name": it.Name, "arguments": it.Arguments}
	case "function_call_output":
		return map[string]any{"id": id, "type": it.Type, "status": "completed", "call_id": it.CallID, "output": it.Output}
	}
	part := "input_text"
	if it.Role == "assistant" {
		part = "output_text"
	}
	return map[string]any{"id": id, "type": "message", "status": "completed", "role": it.Role,
		"content": []map[string]any{{"type": part, "text": it.Text}}}
}
