package httpguard

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/baton-dev/baton/services/frontend/openai"
)

// ReadBody reads a request's whole body (up to limit+1 bytes, so that the
// handler still sees what is too large) within the body timeout, then
// clears the read deadline, so that a long response is not cut. A body that
// does not arrive in time gets 408 and the connection is closed at once.
// The handler reads the body from memory, or takes the bytes read with
// Body.
func ReadBody(timeout time.Duration, limit int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Now().Add(timeout))
		data, err := readAllSized(io.LimitReader(r.Body, limit+1), r.ContentLength)
		if err != nil {
			// Leave the deadline passed: the server must not wait for the
			// rest of the body before it closes the connection.
			_ = rc.SetReadDeadline(time.Now())
			w.Header().Set("Connection", "close")
			if errors.Is(err, os.ErrDeadlineExceeded) {
				openai.WriteError(w, http.StatusRequestTimeout, "invalid_request_error", "request_timeout",
					fmt.Sprintf("the request body did not arrive within %v", timeout))
				return
			}
			openai.WriteError(w, http.StatusBadRequest, "invalid_request_error", "invalid_body", fmt.Sprintf("could not read the request body: %v", err))
			return
		}
		_ = rc.SetReadDeadline(time.Time{})
		r.Body = &bufferedBody{Reader: bytes.NewReader(data), data: data}
		next.ServeHTTP(w, r)
	})
}

// bufferedBody is a request body that ReadBody read whole.
type bufferedBody struct {
	*bytes.Reader
	data []byte
}

func (*bufferedBody) Close() error { return nil }

// Body reads r's whole body, at most limit bytes (a
// *http.MaxBytesError beyond). A body ReadBody read is not copied: its bytes
// are returned (the request's accepted event holds them while the response
// lasts; a second copy would stay beside them, held by the request).
func Body(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if b, ok := r.Body.(*bufferedBody); ok && b.Len() == len(b.data) && int64(len(b.data)) <= limit {
		_, _ = b.Seek(0, io.SeekEnd) // read, as by io.ReadAll
		return b.data, nil
	}
	return io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
}

// maxPresized bounds the buffer readAllSized makes before the body came: a
// client that sends a large Content-Length and then nothing holds no more
// until it sends more.
const maxPresized = 8 << 10

// readAllSized is io.ReadAll into a buffer made for size bytes (a
// Content-Length; unknown if not positive; at most maxPresized at first),
// which grows as more come: io.ReadAll's starts at 512 bytes and doubles,
// so a body of 100 bytes held for a stream's life took 512, and one of 600
// took 896.
func readAllSized(r io.Reader, size int64) ([]byte, error) {
	if size <= 0 {
		return io.ReadAll(r)
	}
	b := make([]byte, 0, min(size, maxPresized)+1) // +1: room for the read that sees the end
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // grow
		}
	}
}
