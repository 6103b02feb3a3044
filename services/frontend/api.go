package frontend

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/migrations"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/frontend/httpguard"
	"github.com/baton-dev/baton/services/frontend/openai"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/services/frontend/tenants"
	"github.com/baton-dev/baton/streams"
	"github.com/google/uuid"
)

// Headers of the API.
const (
	headerRequestID   = "X-Request-Id"
	headerParentID    = "X-Parent-Request-Id"
	headerWorkerID    = "X-Worker-Id"
	headerResumable   = "X-Resumable"
	headerLastEventID = "Last-Event-ID"
)

const busyMessage = migrations.BusyMessage

func endpointOf(r *http.Request) string {
	if strings.HasSuffix(r.URL.Path, "/chat/completions") {
		return events.EndpointChat
	}
	return events.EndpointCompletions
}

// handleCompletion serves POST /v1/chat/completions and /v1/completions.
func (fe *Frontend) handleCompletion(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	endpoint := endpointOf(r)
	tenant := tenantOf(r)
	public := r.Header.Get(headerRequestID)
	clientID := public != ""
	if !clientID {
		public = uuid.NewString()
	}
	echoRequestID(w, public)
	id, ok := requestID(tenant, public)
	if !ok {
		writeAPIError(w, badRequest("invalid_request_id", "%s must be 1 to 128 letters, digits, '-' or '_'", headerRequestID))
		return
	}
	if fe.isDraining() {
		writeError(w, http.StatusServiceUnavailable, "service_unavailable", "draining", "Service temporarily unavailable: this frontend is shutting down, please retry")
		return
	}
	p, body, apiErr := fe.readRequest(w, r, endpoint)
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	bodySHA := fmt.Sprintf("%x", sha256.Sum256(body))
	from, apiErr := parseOffset(r)
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	if clientID && fe.servedAsRetry(w, r, id, tenant, public, endpoint, bodySHA, from, p.Stream) {
		return
	}
	promptTokens := openai.EstimateTokens(p.Prompt)
	pinned := r.Header.Get(headerWorkerID)
	apiErr = fe.checkNew(tenant, public, promptTokens)
	if apiErr == nil {
		apiErr = refusal(fe.tenants.AdmitLogShare(tenant))
	}
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	tk, apiErr := fe.admitNew(r, tenant, p.Model, endpoint, pinned, int64(p.N*(promptTokens+p.MaxTokens)))
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	defer tk.End(choiceIDs(id, p.N))
	r = tenants.WithTicket(r, tk)
	parent, apiErr := fe.parentOf(r, tenant)
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	acc := events.RequestAccepted{
		// Body holds the messages as sent: they are not recorded twice.
		RequestID: id, Model: p.Model, Endpoint: endpoint, Body: body, Prompt: p.Prompt,
		PromptTokens: promptTokens, MaxTokens: p.MaxTokens, Stream: p.Stream, IncludeUsage: p.IncludeUsage,
		Created: start.Unix(), Frontend: fe.id, ParentID: parent, PinnedWorker: pinned,
		Resumable: strings.EqualFold(r.Header.Get(headerResumable), "true"),
		Tenant:    tenant, BodySHA256: bodySHA, ClientModel: fe.cfg.ClientModel,
	}
	if apiErr := groupIDError(id, p.N); apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	spent, ok := fe.chargeBudget(w, r, tenant, int64(p.N*(promptTokens+p.MaxTokens)), choiceIDs(id, p.N)...)
	if !ok {
		return
	}
	defer spent.End()
	if p.N > 1 {
		fe.serveChoices(w, r, acc, p.N, start)
		return
	}
	fe.serveNew(w, r, acc, from, start)
}

// servedAsRetry answers a create under a client's id that the log knows:
// an idempotent retry attaches to the existing request (serveReuse), and a
// log that cannot say is a 500. False: the id is new.
func (fe *Frontend) servedAsRetry(w http.ResponseWriter, r *http.Request, id, tenant, public, endpoint, bodySHA string, from int, stream bool) bool {
	t, err := fe.runtime.Attach(r.Context(), id)
	switch {
	case err == nil:
		fe.serveReuse(w, r, t, tenant, public, endpoint, bodySHA, from, stream)
		return true
	case !errors.Is(err, streams.ErrNotFound):
		writeError(w, http.StatusInternalServerError, "server_error", "log_unavailable", err.Error())
		return true
	}
	return false
}

// checkNew checks what a new chat or completion (not a retry) must pass
// before it is admitted (admitNew) and anything is written to the log: an
// id in the caller's own namespace and a prompt within --max-prompt-tokens.
func (rq *requests) checkNew(tenant, public string, promptTokens int) *apiError {
	if createsInOtherTenant(tenant, public) {
		return badRequest("invalid_request_id", "the admin creates requests under ids without ':'; %s names another tenant's request, which does not exist", public)
	}
	if promptTokens > rq.cfg.Runtime.MaxPromptTokens {
		return &apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error", code: "prompt_too_large",
			message: fmt.Sprintf("the prompt is %d tokens, more than the limit of %d", promptTokens, rq.cfg.Runtime.MaxPromptTokens)}
	}
	return nil
}

// groupIDError refuses an id too long for the ids of n > 1 choices
// (childID appends "-<index>").
func groupIDError(id string, n int) *apiError {
	if _, rest := streams.SplitRequestID(id); n > 1 && len(rest) > 120 {
		return badRequest("invalid_request_id", "%s must be at most 120 characters when n > 1", headerRequestID)
	}
	return nil
}

// serveReuse answers a create under the id of request t, which exists: as
// a retry of it (serveExisting from offset from) if it is the caller's and
// of the same body and endpoint, else with reuseError's 404 or 409. It
// releases t.
func (fe *Frontend) serveReuse(w http.ResponseWriter, r *http.Request, t *runner.Request, tenant, public, endpoint, bodySHA string, from int, stream bool) {
	if apiErr := reuseError(t, tenant, public, endpoint, bodySHA); apiErr != nil {
		t.Release()
		writeAPIError(w, apiErr)
		return
	}
	fe.serveExisting(w, r, t, from, stream)
}

// readRequest reads a completion request body of at most --max-body-bytes
// and parses it; it returns the body as sent, too.
func (fe *Frontend) readRequest(w http.ResponseWriter, r *http.Request, endpoint string) (openai.Completion, []byte, *apiError) {
	body, err := httpguard.Body(w, r, fe.cfg.MaxBodyBytes)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return openai.Completion{}, nil, &apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error", code: "request_too_large",
				message: fmt.Sprintf("request body is larger than the limit of %d bytes", fe.cfg.MaxBodyBytes)}
		}
		return openai.Completion{}, nil, badRequest("invalid_body", "could not read the request body: %v", err)
	}
	p, perr := openai.ParseCompletion(endpoint, body, fe.cfg.DefaultMaxTokens, fe.cfg.MaxTokensLimit)
	if perr != nil {
		return p, body, paramError(perr)
	}
	return p, body, nil
}

// serveNew starts request acc (one choice) and answers with it; an id that
// turns out to exist already is served as a retry from offset from.
func (fe *Frontend) serveNew(w http.ResponseWriter, r *http.Request, acc events.RequestAccepted, from int, start time.Time) {
	t, err := fe.runtime.Accept(r.Context(), acc)
	if errors.Is(err, runner.ErrExists) {
		if t, err = fe.runtime.Attach(r.Context(), acc.RequestID); err == nil {
			fe.serveReuse(w, r, t, acc.Tenant, publicID(acc.Tenant, acc.RequestID), acc.Endpoint, acc.BodySHA256, from, acc.Stream)
			return
		}
	}
	if err != nil {
		writeRecordError(w, "the request", err)
		return
	}
	defer t.Release()
	fe.tenants.Admitted(acc)
	defer fe.tenants.Ended(acc.Tenant, t)
	if acc.ParentID != "" {
		fe.runtime.Link(r.Context(), acc.ParentID, acc.RequestID)
	}
	fe.metrics.active.WithLabelValues(acc.Model).Inc()
	defer fe.metrics.active.WithLabelValues(acc.Model).Dec()

	// Wait until the first dispatch settles, so that "no worker" is still a
	// plain 503 rather than a broken stream.
	select {
	case <-t.Dispatched():
	case <-r.Context().Done():
	}
	tenants.SettleTicket(r)
	out := fe.respond(w, r, acc, []*runner.Request{t}, 0, acc.Stream, start, func() { fe.onClientGone(t) })
	fe.countRequest(acc.Model, acc.Endpoint, acc.Stream, out)
}

// parseOffset reads the client's resume point: Last-Event-ID or ?starting_after.
func parseOffset(r *http.Request) (int, *apiError) {
	name, v := headerLastEventID, r.Header.Get(headerLastEventID)
	if q := r.URL.Query().Get("starting_after"); q != "" {
		name, v = "starting_after", q
	}
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return 0, badRequest("invalid_offset", "%s must be a token offset (a whole number), got %q", name, v)
	}
	if n < 0 {
		return 0, badRequest("invalid_offset", "%s must not be negative, got %d", name, n)
	}
	return n, nil
}

// serveExisting answers a retry or resume of a request already in the log.
func (fe *Frontend) serveExisting(w http.ResponseWriter, r *http.Request, t *runner.Request, from int, stream bool) {
	defer t.Release()
	var model string
	var n, choices int
	var terminal bool
	t.View(func(p *projections.Request) {
		model, n, terminal, choices = p.Accepted.Model, p.Len(), p.Status.Terminal(), p.Accepted.Choices
	})
	if choices > 1 {
		tenant := tenantOf(r)
		writeAPIError(w, badRequest("group_request", "request %s has %d choices: resume each as %s … %s",
			publicID(tenant, t.ID()), choices, publicID(tenant, childID(t.ID(), 0)), publicID(tenant, childID(t.ID(), choices-1))))
		return
	}
	if from > n && terminal {
		writeAPIError(w, badRequest("invalid_offset", "offset %d is past the end of request %s (%d tokens)", from, t.ID(), n))
		return
	}
	fe.metrics.resumes.WithLabelValues(model).Inc()
	t.Claim()
	acc := snapshotOf(t, 0).acc
	fe.respond(w, r, acc, []*runner.Request{t}, from, stream, time.Now(), func() { fe.onClientGone(t) })
}

// handleResume serves GET /v1/requests/{id}/stream.
func (fe *Frontend) handleResume(w http.ResponseWriter, r *http.Request) {
	public := r.PathValue("id")
	echoRequestID(w, public)
	if _, ok := requestID(tenantOf(r), public); !ok {
		writeLookupError(w, public, streams.ErrNotFound)
		return
	}
	from, apiErr := parseOffset(r)
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	t, err := fe.attachFor(r, public)
	if err != nil {
		writeLookupError(w, public, err)
		return
	}
	release, ok := fe.countUnlessBackground(w, r, t)
	if !ok {
		t.Release()
		return
	}
	defer release()
	id := public
	var n int
	t.View(func(p *projections.Request) { n = p.Len() })
	if from > n {
		// The fold may be behind the log (a read that came up short: a
		// stream leader that did not answer in time, where the replica's
		// answer stands; a batched attempt's output not read back yet):
		// read once more before refusing what a client may have seen.
		if err := t.CatchUp(r.Context()); err != nil {
			t.Release()
			writeLookupError(w, public, err)
			return
		}
		t.View(func(p *projections.Request) { n = p.Len() })
	}
	if from > n {
		t.Release()
		writeAPIError(w, badRequest("invalid_offset", "offset %d is past the end of request %s (%d tokens so far)", from, id, n))
		return
	}
	fe.serveExisting(w, r, t, from, true)
}

// RequestState is the JSON of GET /v1/requests/{id}: the projection's state
// and, for a failed request, the error a client got.
type RequestState struct {
	projections.State
	Error map[string]any `json:"error,omitempty"`
}

func stateOf(p *projections.Request) RequestState {
	s := RequestState{State: p.State()}
	if f := p.Failure; f != nil {
		_, s.Error = openai.FailureBody(f)
	}
	return s
}

// handleModels serves GET /v1/models: the models at least one routable
// worker serves. A model whose workers are all not ready or draining cannot
// answer now, so it is not listed (a request for it still gets 503, not 404).
func (fe *Frontend) handleModels(w http.ResponseWriter, r *http.Request) {
	models := fe.fleet.Models()
	ready := map[string]bool{}
	for _, wk := range fe.fleet.Workers() {
		if wk.Routable() {
			ready[wk.Model] = true
		}
	}
	data := make([]map[string]any, 0, len(models))
	for _, m := range models {
		if ready[m] {
			data = append(data, map[string]any{"id": m, "object": "model", "created": 0, "owned_by": "baton"})
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// handleWorkers serves GET /v1/workers: the discovery view.
func (fe *Frontend) handleWorkers(w http.ResponseWriter, r *http.Request) {
	ws := fe.fleet.Workers()
	if fe.keys != nil && tenantOf(r) != streams.AdminTenant {
		ws = redactWorkers(ws)
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": ws})
}

// handleLive serves GET /live.
func (fe *Frontend) handleLive(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"status": "live"})
}

// handleHealth serves GET /health: 200 while connected, not draining, and
// every model in discovery has a routable worker: "healthy", or "degraded"
// with the workers out of routing named in workers_out. 503 "not_ready"
// otherwise: no routable worker at all (no_routable_workers), or some model
// without one (models_not_ready names them), or draining, disconnected, a
// full log.
func (fe *Frontend) handleHealth(w http.ResponseWriter, r *http.Request) {
	ws := fe.fleet.Workers()
	instances := make([]map[string]any, 0, len(ws))
	routable := 0
	ready := map[string]bool{}
	out := []string{}
	for _, wk := range ws {
		if wk.Routable() {
			routable++
			ready[wk.Model] = true
		} else {
			out = append(out, wk.ID)
		}
		inst := map[string]any{"worker_id": wk.ID, "model": wk.Model, "state": wk.State}
		if wk.Reason != "" {
			inst["reason"] = wk.Reason
		}
		instances = append(instances, inst)
	}
	var unready []string
	for _, m := range fe.fleet.Models() {
		if !ready[m] {
			unready = append(unready, m)
		}
	}
	reason := ""
	switch {
	case fe.isDraining():
		reason = "draining"
	case !fe.nc.IsConnected():
		reason = "nats_disconnected"
	case routable == 0:
		reason = "no_routable_workers"
	case len(unready) > 0:
		reason = "model_not_ready"
	}
	body := map[string]any{"status": "not_ready", "reason": reason, "instances": instances, "workers_out": out}
	if len(unready) > 0 {
		body["models_not_ready"] = unready
	}
	if reason == "" {
		if why := fe.runtime.LogHealth(); why != "" {
			reason = codeLogFull
			body["reason"], body["detail"] = reason, why
		}
	}
	if reason != "" {
		writeJSON(w, http.StatusServiceUnavailable, fe.tenants.HealthNote(body))
		return
	}
	status := "healthy"
	if len(out) > 0 {
		status = "degraded"
	}
	writeJSON(w, http.StatusOK, fe.tenants.HealthNote(map[string]any{"status": status, "instances": instances, "workers_out": out}))
}

func requestType(stream bool) string {
	if stream {
		return "stream"
	}
	return "unary"
}

// writeLookupError answers a failed lookup of request id: 404 when the log
// has no such request, 500 when the log could not be read.
func writeLookupError(w http.ResponseWriter, id string, err error) {
	if errors.Is(err, streams.ErrNotFound) {
		writeError(w, http.StatusNotFound, "invalid_request_error", "request_not_found",
			fmt.Sprintf("no request %q in the log (never accepted, or past retention)", id))
		return
	}
	writeError(w, http.StatusInternalServerError, "server_error", "log_unavailable", err.Error())
}
