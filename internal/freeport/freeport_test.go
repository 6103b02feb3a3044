package freeport_test

import (
	"net"
	"strconv"
	"testing"

	"github.com/baton-dev/baton/internal/freeport"
)

// TestGet: the port is a real one, free to listen on after Get returns.
func TestGet(t *testing.T) {
	p, err := freeport.Get()
	if err != nil {
		t.Fatal(err)
	}
	if p <= 0 || p > 65535 {
		t.Fatalf("got port %d, want one in 1-65535", p)
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
	if err != nil {
		t.Fatalf("listen on the port Get returned: %v", err)
	}
	l.Close()
}
