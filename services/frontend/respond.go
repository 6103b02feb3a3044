package frontend

import (
	"cmp"
	"encoding/json"
	"net/http"
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
	worker       string            // the worker of the current attempt
	total        int
	status       projections.Status
	finishReason string
	failure      *events.RequestFailed
	cancel       *events.RequestCancelled
	promptTokens int // the engine's count when it reported one
}

func (t *tracked) snapshot(from int) snapshot {
	var s snapshot
	t.f.view(func(p *projections.Request) {
		cur, _ := p.Current()
		s = snapshot{
			acc: p.Accepted, tokens: p.Tokens(from), details: p.Details(from), worker: cur.WorkerID, total: p.Len(), status: p.Status,
			finishReason: p.FinishReason, failure: p.Failure, cancel: p.Cancel, promptTokens: p.PromptTokens(),
		}
	})
	return s
}

// respond writes request t to the client from token offset from, streaming
// (SSE) or not, and reports whether it ended in success.
//
// While it writes, t counts a client (a request without clients is cancelled
// after the detach timeout), and if t's owner goes away this frontend takes
// the request over.
func (fe *Frontend) respond(w http.ResponseWriter, r *http.Request, t *tracked, from int, stream bool, start time.Time) bool {
	fe.clientEnter(t)
	defer fe.clientLeave(t)
	if stream {
		return fe.stream(w, r, t, from, start)
	}
	for {
		ch, pch := t.f.changed.C(), fe.presence.changed.C()
		s := t.snapshot(0)
		if s.status.Terminal() {
			return fe.writeUnary(w, s)
		}
		select {
		case <-ch:
		case <-pch:
			fe.ensureOwner(r.Context(), t)
		case <-fe.closing:
			return false
		case <-r.Context().Done():
			fe.onClientGone(t)
			return false
		}
	}
}

func (fe *Frontend) writeUnary(w http.ResponseWriter, s snapshot) bool {
	switch s.status {
	case projections.StatusFailed:
		status := s.failure.Status
		if status == 0 {
			status = http.StatusInternalServerError
		}
		writeError(w, status, errorType(status), s.failure.Code, s.failure.Message)
		return false
	case projections.StatusCancelled:
		writeError(w, 499, "cancelled", "request_cancelled", "the request was cancelled ("+s.cancel.Reason+")")
		return false
	}
	if s.worker != "" {
		w.Header().Set(headerWorkerID, s.worker)
	}
	writeJSON(w, http.StatusOK, completionBody(s.acc, []snapshot{s}))
	return true
}

// completionBody is the non-streaming response of acc with one choice per
// snapshot.
func completionBody(acc events.RequestAccepted, choices []snapshot) map[string]any {
	list := make([]map[string]any, 0, len(choices))
	completion, prompt := 0, acc.PromptTokens
	for i, s := range choices {
		if i == 0 && s.promptTokens > 0 {
			prompt = s.promptTokens
		}
		completion += s.total
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

func usageOf(s snapshot) map[string]any {
	prompt := cmp.Or(s.promptTokens, s.acc.PromptTokens)
	return map[string]any{
		"prompt_tokens": prompt, "completion_tokens": s.total, "total_tokens": prompt + s.total,
	}
}

// stream writes request t as server-sent events from token offset from. Every
// event's id is the token offset after it, so a client that reconnects with
// Last-Event-ID resumes exactly where it stopped. The stream ends with
// [DONE] only on success; a failure ends with an error event.
func (fe *Frontend) stream(w http.ResponseWriter, r *http.Request, t *tracked, from int, start time.Time) bool {
	flusher, _ := w.(http.Flusher)
	s := t.snapshot(from)
	if from == 0 && s.total == 0 && !s.status.Terminal() {
		s = fe.awaitFirstToken(r, t)
	}
	if s.status == projections.StatusFailed && from == 0 && s.total == 0 {
		// Nothing was streamed yet: answer as a plain error (e.g. 503 no worker).
		return fe.writeUnary(w, s)
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	if s.worker != "" {
		h.Set(headerWorkerID, s.worker) // the worker of the first token; a trailer cannot follow SSE
	}
	w.WriteHeader(http.StatusOK)
	sse := &sseWriter{w: w, acc: s.acc}
	model := s.acc.Model
	sent := from
	var last time.Time
	first := true
	for {
		ch, pch := t.f.changed.C(), fe.presence.changed.C()
		s := t.snapshot(sent)
		if len(s.tokens) > 0 {
			sent += len(s.tokens)
			sse.chunk(sent, merge(s.tokens, s.details).chunkChoice(s.acc.Endpoint, 0, first), nil)
			now := time.Now()
			if first {
				fe.metrics.ttft.WithLabelValues(model).Observe(now.Sub(start).Seconds())
			} else if n := len(s.tokens); n > 0 {
				per := now.Sub(last).Seconds() / float64(n)
				for range n {
					fe.metrics.itl.WithLabelValues(model).Observe(per)
				}
			}
			fe.metrics.outputTokens.WithLabelValues(model).Add(float64(len(s.tokens)))
			first, last = false, now
		}
		if s.status.Terminal() && sent >= s.total {
			ok := false
			switch s.status {
			case projections.StatusCompleted:
				sse.finish(sent, 0, s.finishReason)
				if s.acc.IncludeUsage {
					sse.usage(sent, usageOf(s))
				}
				sse.done(sent)
				ok = true
			case projections.StatusFailed:
				sse.error(sent, errorBody(errorType(s.failure.Status), s.failure.Code, s.failure.Message))
			case projections.StatusCancelled:
				sse.error(sent, errorBody("cancelled", "request_cancelled", "the request was cancelled ("+s.cancel.Reason+")"))
			}
			if flusher != nil {
				flusher.Flush()
			}
			fe.metrics.duration.WithLabelValues(model).Observe(time.Since(start).Seconds())
			return ok
		}
		if sse.err != nil {
			fe.onClientGone(t)
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		select {
		case <-ch:
		case <-pch:
			fe.ensureOwner(r.Context(), t)
		case <-fe.closing:
			return false // cut by shutdown: the request stays resumable
		case <-r.Context().Done():
			fe.onClientGone(t)
			return false
		}
	}
}

// sseWriter formats OpenAI stream chunks as server-sent events.
type sseWriter struct {
	w   http.ResponseWriter
	acc events.RequestAccepted
	err error
	buf []byte
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

// headerWait bounds how long a new stream's headers wait for its first
// token: a request that fails before it (an upstream's 400, no worker left)
// still gets a real HTTP status rather than 200 and an error event.
const headerWait = 10 * time.Second

// awaitFirstToken waits, at most headerWait, until request t has a token or
// has ended, and returns its state then.
func (fe *Frontend) awaitFirstToken(r *http.Request, t *tracked) snapshot {
	timer := time.NewTimer(headerWait)
	defer timer.Stop()
	for {
		ch := t.f.changed.C()
		s := t.snapshot(0)
		if s.total > 0 || s.status.Terminal() {
			return s
		}
		select {
		case <-ch:
		case <-timer.C:
			return s
		case <-fe.closing:
			return s
		case <-r.Context().Done():
			return s
		}
	}
}

// errorType is the OpenAI error type of an HTTP status.
func errorType(status int) string {
	switch {
	case status == http.StatusServiceUnavailable:
		return "service_unavailable"
	case status >= 400 && status < 500:
		return "invalid_request_error"
	}
	return "server_error"
}
