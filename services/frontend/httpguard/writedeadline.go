package httpguard

import (
	"net/http"
	"time"
)

// deadlineWriter gives every write and flush of a streamed response a
// deadline of at least Config.WriteTimeout from the moment it starts, so
// that a client that stops reading (its socket buffers full) is
// disconnected once a write has waited that long (at most an eighth more),
// and its connection and goroutine are freed (issue 23: 2,000 such streams
// formerly held 2,014 descriptors and 2,049 goroutines after generation
// ended, until their clients closed). A client that reads, however slowly
// between tokens, is never cut: the deadline is renewed as writes go on,
// not set for the stream.
//
// Setting a deadline re-arms a runtime timer, which cost a stream at decode
// rates more than its write did when it was set at every write and flush
// (three a token): it is moved only once less than the timeout is left, and
// then to timeout + timeout/8 from now, so a stream writing every few
// milliseconds sets it once per timeout/8.
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	until   time.Time // the deadline set last; zero: none
}

// WithWriteDeadline wraps w; a timeout of 0 leaves it as it is.
func WithWriteDeadline(w http.ResponseWriter, timeout time.Duration) http.ResponseWriter {
	if timeout <= 0 {
		return w
	}
	return &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: timeout}
}

// renew makes the deadline at least the timeout from now.
func (w *deadlineWriter) renew() {
	now := time.Now()
	if w.until.Sub(now) >= w.timeout {
		return
	}
	w.until = now.Add(w.timeout + w.timeout/8)
	_ = w.rc.SetWriteDeadline(w.until)
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	w.renew()
	return w.ResponseWriter.Write(p)
}

// Flush sends what is buffered, within the deadline.
func (w *deadlineWriter) Flush() {
	w.renew()
	_ = w.rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// EndWrites flushes what is left within the deadline, then clears it, so
// that the next response on a kept-alive connection starts with none.
func EndWrites(w http.ResponseWriter) {
	if d, ok := w.(*deadlineWriter); ok {
		d.Flush()
		_ = d.rc.SetWriteDeadline(time.Time{})
		d.until = time.Time{}
	}
}
