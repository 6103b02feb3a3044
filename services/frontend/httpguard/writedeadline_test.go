package httpguard

import (
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"
)

// TestWriteDeadlineFreesNonReader: a handler streaming far more than the
// socket buffers hold to a client that never reads formerly blocked in its
// write for as long as the client kept the connection; through
// WithWriteDeadline its write fails once it has waited the timeout.
func TestWriteDeadlineFreesNonReader(t *testing.T) {
	const timeout = 200 * time.Millisecond
	ended := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dw := WithWriteDeadline(w, timeout)
		defer EndWrites(dw)
		chunk := make([]byte, 64<<10)
		for range 1024 { // 64 MiB
			if _, err := dw.Write(chunk); err != nil {
				ended <- err
				return
			}
			dw.(http.Flusher).Flush()
		}
		ended <- nil
	}))
	defer srv.Close()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("64 MiB went to a client that reads nothing")
		}
		t.Logf("the write failed %v after the request: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(20 * time.Second):
		t.Fatal("the handler is still writing to a client that reads nothing")
	}
}

// TestWriteDeadlineKeepsReader: a client that reads slowly, with pauses
// longer than the timeout between writes, is not cut, and a kept-alive
// connection's next response has no deadline left over.
func TestWriteDeadlineKeepsReader(t *testing.T) {
	const timeout = 50 * time.Millisecond
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dw := WithWriteDeadline(w, timeout)
		defer EndWrites(dw)
		for i := range 3 {
			if i > 0 {
				time.Sleep(2 * timeout) // a quiet stream between tokens, not a synchronisation
			}
			if _, err := dw.Write([]byte("token ")); err != nil {
				t.Errorf("write %d: %v", i, err)
				return
			}
			dw.(http.Flusher).Flush()
		}
	}))
	defer srv.Close()
	client := srv.Client()
	for i := range 2 {
		resp, err := client.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		n, _ := resp.Body.Read(buf)
		for n < len("token token token ") {
			m, err := resp.Body.Read(buf[n:])
			n += m
			if err != nil {
				break
			}
		}
		resp.Body.Close()
		if got := string(buf[:n]); got != "token token token " {
			t.Errorf("response %d: got %q, want three tokens", i, got)
		}
		if i == 0 {
			time.Sleep(2 * timeout) // the next request on the kept-alive connection comes after the old deadline
		}
	}
}
