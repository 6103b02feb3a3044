package natstest

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy forwards TCP connections to a NATS server until Cut, which closes
// every connection and refuses new ones until Restore: a network partition
// between a client and its server, for reconnect tests.
type Proxy struct {
	t      testing.TB
	l      net.Listener
	target string
	pumps  sync.WaitGroup // one per direction of every forwarded connection
	mu     sync.Mutex
	conns  []net.Conn
	down   bool
}

// NewProxy listens on a random loopback port and forwards to target.
func NewProxy(t testing.TB, target string) *Proxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{t: t, l: l, target: target}
	t.Cleanup(func() { l.Close(); p.cut() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.down {
				p.mu.Unlock()
				c.Close()
				continue
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.conns = append(p.conns, c, s)
			p.pumps.Add(2)
			p.mu.Unlock()
			go func() { defer p.pumps.Done(); _, _ = io.Copy(s, c); s.Close() }()
			go func() { defer p.pumps.Done(); _, _ = io.Copy(c, s); c.Close() }()
		}
	}()
	return p
}

// URL is the proxy's NATS URL.
func (p *Proxy) URL() string { return "nats://" + p.l.Addr().String() }

// Cut closes every forwarded connection and refuses new ones. It checks
// that the cut took effect, and fails the test otherwise: there was at least
// one connection to cut (a cut of nothing tests nothing), and every
// forwarding goroutine has stopped, so not one more byte crosses, and both
// peers have seen their connection closed (EOF).
func (p *Proxy) Cut() {
	p.t.Helper()
	n := p.cut()
	if n == 0 {
		p.t.Errorf("natstest: Cut found no connection to cut: the partition would be a no-op")
	}
	done := make(chan struct{})
	go func() { p.pumps.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		p.t.Errorf("natstest: %d connections cut, but bytes still flow 5s later: the cut did not take effect", n)
	}
}

// cut closes the connections and refuses new ones; it returns how many
// client connections it closed.
func (p *Proxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for _, c := range p.conns {
		c.Close()
	}
	n := len(p.conns) / 2
	p.conns = nil
	return n
}

// Restore accepts connections again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}
