package natstest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// recorder is a testing.TB that records Errorf instead of failing.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Helper() {}

// TestCutIsReal: after Cut, the client through the proxy reads EOF; a Cut
// with nothing to cut is reported, not silently passed.
func TestCutIsReal(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c) }() // echo
		}
	}()
	p := NewProxy(t, l.Addr().String())
	c, err := net.Dial("tcp", p.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through the proxy: %q, %v", buf, err)
	}
	p.Cut()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(buf); !errors.Is(err, io.EOF) {
		t.Fatalf("read after Cut: %d bytes, %v; want EOF", n, err)
	}

	r := &recorder{TB: t}
	empty := NewProxy(t, l.Addr().String())
	empty.t = r
	empty.Cut()
	if len(r.errs) != 1 {
		t.Fatalf("Cut of no connection reported %q, want one error", r.errs)
	}
}
