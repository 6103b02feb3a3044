package openai

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"

	"github.com/baton-dev/baton/events"
)

// NewSSE returns the event stream of the response to acc on w.
func NewSSE(w http.ResponseWriter, acc events.RequestAccepted) *SSE {
	return &SSE{w: w, head: chunkHead{endpoint: acc.Endpoint, id: openaiID(acc), model: acc.Model, created: acc.Created}}
}

// Err is the first write error, if any.
func (s *SSE) Err() error { return s.err }

// StartSSE writes the headers of an event stream and returns its flush.
func StartSSE(w http.ResponseWriter) (flush func()) {
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

// SSE formats OpenAI stream chunks as server-sent events on w, each with
// its id: the token offset after it. It stops writing at the first error
// (Err). An SSE is used by one goroutine.
type SSE struct {
	w      http.ResponseWriter
	head   chunkHead
	err    error
	buf    []byte // the event being written, reused
	text   []byte // a text chunk's text, reused
	suffix []byte // what follows the choices in every chunk (see textEvent)
}

// chunkHead is what every chunk of a stream names besides its choices: of
// the request's accepted event, only these fields (a stream holds them
// while it lasts, thousands of streams at once).
type chunkHead struct {
	endpoint, id, model string // id: openaiID's
	created             int64
}

// SetModel makes the chunks name model: the upstream's, known from the
// first delta on (projections.Request.ResponseModel).
func (s *SSE) SetModel(model string) {
	if model != "" && s.head.model != model {
		s.head.model, s.suffix = model, nil
	}
}

func (s *SSE) event(id int, data []byte) {
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

func (s *SSE) chunk(id int, choice map[string]any, usage map[string]any, mark map[string]any) {
	var body map[string]any
	h := s.head
	if h.endpoint == events.EndpointChat {
		body = map[string]any{"id": "chatcmpl-" + h.id, "object": "chat.completion.chunk", "created": h.created, "model": h.model}
	} else {
		body = map[string]any{"id": "cmpl-" + h.id, "object": "text_completion", "created": h.created, "model": h.model}
	}
	if choice != nil {
		body["choices"] = []map[string]any{choice}
	} else {
		body["choices"] = []map[string]any{}
	}
	if usage != nil {
		body["usage"] = usage
	}
	if mark != nil {
		body[MarkField] = mark
	}
	data, _ := json.Marshal(body)
	s.event(id, data)
}

// Delta writes the chunk of choice index carrying tokens and their details
// (see chunk.go); first names the role of a chat choice.
func (s *SSE) Delta(id, index int, tokens []string, details []json.RawMessage, first bool) {
	if !slices.ContainsFunc(details, func(d json.RawMessage) bool { return d != nil }) {
		s.textEvent(id, index, tokens, first)
		return
	}
	s.chunk(id, merge(tokens, details).chunkChoice(s.head.endpoint, index, first), nil, nil)
}

// Finish writes the chunk that ends choice index with reason, carrying
// mark (Mark: nil for none).
func (s *SSE) Finish(id, index int, reason string, mark map[string]any) {
	if s.head.endpoint == events.EndpointChat {
		s.chunk(id, map[string]any{"index": index, "delta": map[string]any{}, "finish_reason": reason}, nil, mark)
		return
	}
	s.chunk(id, map[string]any{"index": index, "text": "", "logprobs": nil, "finish_reason": reason}, nil, mark)
}

// Usage writes the chunk of the usage (stream_options.include_usage),
// carrying mark (Mark: nil for none).
func (s *SSE) Usage(id int, usage map[string]any, mark map[string]any) { s.chunk(id, nil, usage, mark) }

// Done writes [DONE]: the stream ended in success.
func (s *SSE) Done(id int) { s.event(id, []byte("[DONE]")) }

// Error writes the error event that ends a failed stream.
func (s *SSE) Error(id int, body map[string]any) {
	data, _ := json.Marshal(map[string]any{"error": body})
	s.event(id, data)
}
