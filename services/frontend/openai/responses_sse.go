package openai

import (
	"io"
	"strconv"
)

// ResponseSSE writes a response's events as server-sent events on w, those
// after sequence number after only: `id: <sequence_number>`, `event:
// <type>`, `data: <event>`. The stream has no [DONE]: its terminal event
// ends it. It stops writing at the first error (Err). A ResponseSSE is
// used by one goroutine.
type ResponseSSE struct {
	w     io.Writer
	after int
	buf   []byte // the event being written, reused
	err   error
}

// NewResponseSSE returns the event stream on w of the events after
// sequence number after (-1: all). Its Emit is a ResponseRender's emit.
func NewResponseSSE(w io.Writer, after int) *ResponseSSE {
	return &ResponseSSE{w: w, after: after}
}

// Emit writes e, unless it is not after the stream's start or a write
// failed already.
func (s *ResponseSSE) Emit(e ResponseEvent) {
	if e.seq <= s.after || s.err != nil {
		return
	}
	b := append(s.buf[:0], "id: "...)
	b = strconv.AppendInt(b, int64(e.seq), 10)
	b = append(b, "\nevent: "...)
	b = append(b, e.typ...)
	b = append(b, "\ndata: "...)
	b = e.appendData(b)
	b = append(b, "\n\n"...)
	s.buf = b
	_, s.err = s.w.Write(b)
}

// Err is the first write error, if any.
func (s *ResponseSSE) Err() error { return s.err }
