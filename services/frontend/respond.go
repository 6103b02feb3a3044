package frontend

import (
	"encoding/json"
	"github.com/baton-dev/baton/services/frontend/runner"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

// snapshot is what a client stream needs from the projection at one moment.
type snapshot struct {
	acc          events.RequestAccepted
	tokens       []string          // from the client's offset on
	details      []json.RawMessage // the tokens' details (nil: none)
	emits        []int64           // the tokens' emit times (nil: none; benchmarks)
	worker       string            // the worker of the current attempt
	promptTokens int               // the engine's count when it reported one
	total        int
	usage        int // the answer's length for usage: the engine's count when it reported one
	status       projections.Status
	finishReason string
	failure      *events.RequestFailed
	cancel       *events.RequestCancelled
}

// usageTokens is the answer's length for its usage: the engine's count
// when it reported one, else the tokens produced.
func (s snapshot) usageTokens() int {
	if s.usage > 0 {
		return s.usage
	}
	return s.total
}

// snapshotOf is t's snapshot from token offset from on.
func snapshotOf(t *runner.Request, from int) snapshot {
	var s snapshot
	t.View(func(p *projections.Request) {
		cur, _ := p.Current()
		s = snapshot{
			acc: p.Accepted, tokens: p.Tokens(from), details: p.Details(from), worker: cur.WorkerID,
			promptTokens: p.PromptTokens(), total: p.Len(), usage: p.CompletionTokens(), status: p.Status,
			finishReason: p.FinishReason, failure: p.Failure, cancel: p.Cancel,
		}
		s.acc.Model = p.ResponseModel()
	})
	if n := len(s.tokens); n > 0 {
		s.emits = t.Emits(from, from+n)
	}
	return s
}

// respond writes requests ts to the client (one request, or the choices of
// a group, each chunk carrying its choice index), streaming (SSE) or not,
// and reports whether it ended in success. acc names the response: the
// request itself, or the group's parent. from is a single request's resume
// offset (0 for a group). gone handles a client that left before the end.
//
// While it writes, every request counts a client (a request without clients
// is cancelled after the detach timeout), and if a request's owner goes away
// this frontend takes it over.
func (fe *Frontend) respond(w http.ResponseWriter, r *http.Request, acc events.RequestAccepted, ts []*runner.Request, from int, stream bool, start time.Time, gone func()) bool {
	wake := make(chan struct{}, 1) // poked by any request's change
	for _, t := range ts {
		t.Enter()
		defer t.Leave()
		defer t.Listen(wake)()
	}
	o := &output{fe: fe, w: w, r: r, acc: acc, ts: ts, wake: wake, gone: gone}
	if stream {
		return o.stream(from, start)
	}
	return o.unary()
}

// output is one response being written by respond.
type output struct {
	fe   *Frontend
	w    http.ResponseWriter
	r    *http.Request
	acc  events.RequestAccepted
	ts   []*runner.Request
	wake chan struct{}
	gone func()
}

// wait blocks until a request changes (true), claiming requests whose owner
// went away, or until the client left or the frontend cut open
// streams (false).
func (o *output) wait(pch <-chan struct{}) bool {
	select {
	case <-o.wake:
	case <-pch:
		for _, t := range o.ts {
			t.Claim()
		}
	case <-o.fe.closing:
		return false // cut by shutdown: the requests stay resumable
	case <-o.r.Context().Done():
		o.gone()
		return false
	}
	return true
}

func (o *output) unary() bool {
	for {
		pch := o.fe.runtime.FrontendsChanged()
		snaps := make([]snapshot, len(o.ts))
		done := true
		for i, t := range o.ts {
			snaps[i] = snapshotOf(t, 0)
			done = done && snaps[i].status.Terminal()
		}
		if done {
			for _, s := range snaps {
				if s.status != projections.StatusCompleted {
					return writeUnary(o.w, s)
				}
			}
			setWorker(o.w, snaps[len(snaps)-1])
			writeJSON(o.w, http.StatusOK, completionBody(o.acc, snaps))
			return true
		}
		if !o.wait(pch) {
			return false
		}
	}
}

// writeUnary answers with s: its completion, or its failure.
func writeUnary(w http.ResponseWriter, s snapshot) bool {
	if s.status == projections.StatusCompleted {
		setWorker(w, s)
		writeJSON(w, http.StatusOK, completionBody(s.acc, []snapshot{s}))
		return true
	}
	status, body := failureOf(s)
	if status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, status, map[string]any{"error": body})
	return false
}

// failureOf is the HTTP status and OpenAI error body of a request that
// failed or was cancelled.
func failureOf(s snapshot) (int, map[string]any) {
	if s.status == projections.StatusCancelled {
		return 499, errorBody("cancelled", "request_cancelled", "the request was cancelled ("+s.cancel.Reason+")")
	}
	return failureBody(s.failure)
}

// failureBody is the HTTP status and OpenAI error body of failure f.
func failureBody(f *events.RequestFailed) (int, map[string]any) {
	status := f.Status
	if status == 0 {
		status = http.StatusInternalServerError
	}
	typ := "server_error"
	switch {
	case status == http.StatusServiceUnavailable:
		typ = "service_unavailable"
	case status >= 400 && status < 500:
		typ = "invalid_request_error"
	}
	return status, errorBody(typ, f.Code, f.Message)
}

// completionBody is the non-streaming response of acc with one choice per
// snapshot.
func completionBody(acc events.RequestAccepted, choices []snapshot) map[string]any {
	if len(choices) > 0 && choices[0].acc.Model != "" {
		acc.Model = choices[0].acc.Model // the model that answered (projections.Request.ResponseModel)
	}
	list := make([]map[string]any, 0, len(choices))
	completion, prompt := 0, acc.PromptTokens
	for i, s := range choices {
		if i == 0 && s.promptTokens > 0 {
			prompt = s.promptTokens // the engine's count
		}
		completion += s.usageTokens()
		list = append(list, merge(s.tokens, s.details).answerChoice(acc.Endpoint, i, s.finishReason))
	}
	usage := map[string]any{
		"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
	}
	if acc.Endpoint == events.EndpointChat {
		return map[string]any{
			"id": "chatcmpl-" + acc.RequestID, "object": "chat.completion", "created": acc.Created, "model": acc.Model,
			"choices": list, "usage": usage,
		}
	}
	return map[string]any{
		"id": "cmpl-" + acc.RequestID, "object": "text_completion", "created": acc.Created, "model": acc.Model,
		"choices": list, "usage": usage,
	}
}

// stream writes the requests as server-sent events, a single request from
// token offset from. Every event's id is the token offset after it (over all
// choices of a group, which is resumed per choice), so a client that
// reconnects with Last-Event-ID resumes exactly where it stopped. The stream
// ends with [DONE] only on success; a failure ends with an error event.
func (o *output) stream(from int, start time.Time) bool {
	if answered, ok := o.beforeHeaders(from); answered {
		return ok
	}
	flush := startSSE(o.w)
	sse := &sseWriter{w: o.w, acc: o.acc}
	m := o.fe.tokenMetrics(o.acc.Model, start)
	sent := make([]int, len(o.ts))
	sent[0] = from
	total := from
	started, finished := make([]bool, len(o.ts)), make([]bool, len(o.ts))
	for {
		pch := o.fe.runtime.FrontendsChanged()
		var failed *snapshot
		done, completion, prompt := true, 0, o.acc.PromptTokens
		for i, t := range o.ts {
			s := snapshotOf(t, sent[i])
			if i == 0 {
				sse.setModel(s.acc.Model)
			}
			if n := len(s.tokens); n > 0 {
				sent[i] += n
				total += n
				if s.emits != nil {
					sse.emits(s.emits)
				}
				sse.delta(total, i, s.tokens, s.details, !started[i])
				started[i] = true
				m.sent(n)
			}
			switch s.status {
			case projections.StatusCompleted:
				if !finished[i] {
					finished[i] = true
					sse.finish(total, i, s.finishReason)
				}
			case projections.StatusFailed, projections.StatusCancelled:
				if failed == nil {
					failed = &s
				}
			}
			done = done && s.status.Terminal()
			completion += s.usageTokens()
			if i == 0 && s.promptTokens > 0 {
				prompt = s.promptTokens // the engine's count
			}
		}
		if failed != nil {
			_, body := failureOf(*failed)
			sse.error(total, body)
			if len(o.ts) > 1 {
				_ = o.fe.runtime.Cancel(o.r.Context(), o.acc.RequestID, events.CancelKill, "another choice failed", "")
			}
		} else if done {
			if o.acc.IncludeUsage {
				sse.usage(total, map[string]any{
					"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
				})
			}
			sse.done(total)
		}
		flush()
		if failed != nil || done {
			m.end()
			return failed == nil
		}
		if sse.err != nil {
			o.gone()
			return false
		}
		if !o.wait(pch) {
			return false
		}
	}
}

// beforeHeaders settles what a single stream's headers depend on: it waits
// (boundedly) for the first token, answers a request that failed before any
// token as a plain error (answered; ok is what stream returns), and otherwise
// names the first token's worker, since SSE headers cannot change later.
func (o *output) beforeHeaders(from int) (answered, ok bool) {
	if len(o.ts) != 1 {
		return false, false
	}
	s := snapshotOf(o.ts[0], from)
	if from == 0 && s.total == 0 && !s.status.Terminal() {
		s = o.awaitFirstToken()
	}
	if s.status == projections.StatusFailed && from == 0 && s.total == 0 {
		// Nothing was streamed yet: answer as a plain error (e.g. 503 no
		// worker, or the model server's 400).
		return true, writeUnary(o.w, s)
	}
	if from > 0 || s.total > 0 {
		// Headers that go out before the first token (after headerWait)
		// cannot name its worker: the one running now may never produce
		// it (a queue, a failure). GET /v1/requests/{id} names it later.
		setWorker(o.w, s)
	}
	return false, false
}

// startSSE writes the headers of an event stream and returns its flush.
func startSSE(w http.ResponseWriter) (flush func()) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	return func() {
		if flusher != nil {
			flusher.Flush()
		}
	}
}

// tokenMetrics observes the tokens one response sends.
type tokenMetrics struct {
	fe          *Frontend
	model       string
	start, last time.Time
}

func (fe *Frontend) tokenMetrics(model string, start time.Time) *tokenMetrics {
	return &tokenMetrics{fe: fe, model: model, start: start}
}

// sent observes n tokens sent now: time to first token, inter-token latency,
// output tokens.
func (m *tokenMetrics) sent(n int) {
	now := time.Now()
	if m.last.IsZero() {
		m.fe.metrics.ttft.WithLabelValues(m.model).Observe(now.Sub(m.start).Seconds())
	} else {
		per := now.Sub(m.last).Seconds() / float64(n)
		for range n {
			m.fe.metrics.itl.WithLabelValues(m.model).Observe(per)
		}
	}
	m.fe.metrics.outputTokens.WithLabelValues(m.model).Add(float64(n))
	m.last = now
}

// end observes the response's duration.
func (m *tokenMetrics) end() {
	m.fe.metrics.duration.WithLabelValues(m.model).Observe(time.Since(m.start).Seconds())
}

// sseWriter formats OpenAI stream chunks as server-sent events.
type sseWriter struct {
	w      http.ResponseWriter
	acc    events.RequestAccepted
	err    error
	buf    []byte // the event being written, reused
	text   []byte // a text chunk's text, reused
	suffix []byte // what follows the choices in every chunk (see textEvent)
}

// setModel makes the chunks name model: the upstream's, known from the first
// delta on (projections.Request.ResponseModel).
func (s *sseWriter) setModel(model string) {
	if s.acc.Model != model {
		s.acc.Model, s.suffix = model, nil
	}
}

func (s *sseWriter) event(id int, data []byte) {
	if s.err != nil {
		return
	}
	s.buf = s.buf[:0]
	s.buf = append(s.buf, "id: "...)
	s.buf = strconv.AppendInt(s.buf, int64(id), 10)
	s.buf = append(s.buf, "\ndata: "...)
	s.buf = append(s.buf, data...)
	s.buf = append(s.buf, "\n\n"...)
	_, s.err = s.w.Write(s.buf)
}

func (s *sseWriter) chunk(id int, choice map[string]any, usage map[string]any) {
	var body map[string]any
	if s.acc.Endpoint == events.EndpointChat {
		body = map[string]any{"id": "chatcmpl-" + s.acc.RequestID, "object": "chat.completion.chunk", "created": s.acc.Created, "model": s.acc.Model}
	} else {
		body = map[string]any{"id": "cmpl-" + s.acc.RequestID, "object": "text_completion", "created": s.acc.Created, "model": s.acc.Model}
	}
	if choice != nil {
		body["choices"] = []map[string]any{choice}
	} else {
		body["choices"] = []map[string]any{}
	}
	if usage != nil {
		body["usage"] = usage
	}
	data, _ := json.Marshal(body)
	s.event(id, data)
}

// delta writes the chunk of choice index carrying tokens and their details
// (see chunk.go).
// emits writes the emit times of the next event's tokens as an SSE comment
// (": emit <unix ns> ..."), which clients ignore; only a worker run for a
// benchmark records them.
func (s *sseWriter) emits(ns []int64) {
	if s.err != nil {
		return
	}
	s.buf = append(s.buf[:0], ": emit"...)
	for _, v := range ns {
		s.buf = append(s.buf, ' ')
		s.buf = strconv.AppendInt(s.buf, v, 10)
	}
	s.buf = append(s.buf, '\n')
	_, s.err = s.w.Write(s.buf)
}

func (s *sseWriter) delta(id, index int, tokens []string, details []json.RawMessage, first bool) {
	if !slices.ContainsFunc(details, func(d json.RawMessage) bool { return d != nil }) {
		s.textEvent(id, index, tokens, first)
		return
	}
	s.chunk(id, merge(tokens, details).chunkChoice(s.acc.Endpoint, index, first), nil)
}

func (s *sseWriter) finish(id, index int, reason string) {
	if s.acc.Endpoint == events.EndpointChat {
		s.chunk(id, map[string]any{"index": index, "delta": map[string]any{}, "finish_reason": reason}, nil)
		return
	}
	s.chunk(id, map[string]any{"index": index, "text": "", "logprobs": nil, "finish_reason": reason}, nil)
}

func (s *sseWriter) usage(id int, usage map[string]any) { s.chunk(id, nil, usage) }

func (s *sseWriter) done(id int) { s.event(id, []byte("[DONE]")) }

func (s *sseWriter) error(id int, body map[string]any) {
	data, _ := json.Marshal(map[string]any{"error": body})
	s.event(id, data)
}

// setWorker names the worker of s's current attempt in the X-Worker-Id
// response header.
func setWorker(w http.ResponseWriter, s snapshot) {
	if s.worker != "" {
		w.Header().Set(headerWorkerID, s.worker)
	}
}

// headerWait bounds how long a new stream's headers wait for its first
// token: a request that fails before it (the model server's 400, no worker
// left) still gets a real HTTP status rather than 200 and an error event.
const headerWait = 10 * time.Second

// awaitFirstToken waits, at most headerWait, until the single request of o
// has a token or has ended, and returns its state then. A client that left
// or a frontend that cuts streams ends the wait too; the stream then sees
// them as it would have.
func (o *output) awaitFirstToken() snapshot {
	deadline := time.NewTimer(headerWait)
	defer deadline.Stop()
	for {
		pch := o.fe.runtime.FrontendsChanged()
		s := snapshotOf(o.ts[0], 0)
		if s.total > 0 || s.status.Terminal() {
			return s
		}
		select {
		case <-o.wake:
		case <-pch:
			o.ts[0].Claim()
		case <-deadline.C:
			return s
		case <-o.fe.closing:
			return s
		case <-o.r.Context().Done():
			return s
		}
	}
}
