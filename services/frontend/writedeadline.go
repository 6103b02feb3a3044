package frontend

import (
	"net/http"
	"time"
)

// deadlineWriter gives every write and flush of a streamed response a
// deadline of its own (Config.WriteTimeout from the moment it starts), so
// that a client that stops reading (its socket buffers full) is
// disconnected once a write has waited that long, and its connection and
// goroutine are freed (issue 23: 2,000 such streams formerly held 2,014
// descriptors and 2,049 goroutines after generation ended, until their
// clients closed). A client that reads, however slowly between tokens, is
// never cut: the deadline is renewed at each write, not set for the stream.
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

// withWriteDeadline wraps w; a timeout of 0 leaves it as it is.
func withWriteDeadline(w http.ResponseWriter, timeout time.Duration) http.ResponseWriter {
	if timeout <= 0 {
		return w
	}
	return &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: timeout}
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	return w.ResponseWriter.Write(p)
}

// Flush sends what is buffered, within the deadline.
func (w *deadlineWriter) Flush() {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	_ = w.rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// endWrites flushes what is left within the deadline, then clears it, so
// that the next response on a kept-alive connection starts with none.
func endWrites(w http.ResponseWriter) {
	if d, ok := w.(*deadlineWriter); ok {
		d.Flush()
		_ = d.rc.SetWriteDeadline(time.Time{})
	}
}
