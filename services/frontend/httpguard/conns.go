package httpguard

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/baton-dev/baton/services/frontend/openai"
)

// ProbeHeadroom is how many connections past Config.MaxConnections are
// still accepted, for /live and /health only: a probe still gets an answer
// when the API is full. Such a connection must send its request within
// overflowDeadline, and is closed after its answer.
const ProbeHeadroom = 16

const overflowDeadline = 2 * time.Second

// FirstByteTimeout is how long a new connection may stay silent: one that
// sends no byte within it is closed, before the header timeout
// (Config.ReadHeaderTimeout) would, so that silent connections cannot hold
// slots for that long.
const FirstByteTimeout = 2 * time.Second

// Listener counts open connections. Up to max it accepts them as they
// are; up to max+ProbeHeadroom it marks them overflow (see overflowConn);
// beyond that it answers 503 and closes them at once, so that a flood of
// idle connections cannot exhaust the file descriptors of the process. A
// connection from a remote address (an IPv4 address, an IPv6 /64) that
// already has perAddress open (0: no such cap) is answered and closed the
// same way, so that one client cannot hold every slot. Every connection
// must send its first byte within FirstByteTimeout.
type Listener struct {
	net.Listener
	max        int64
	perAddress int
	open       atomic.Int64
	lingering  atomic.Int64
	plainTCP   bool // write an HTTP 503 before closing a rejected connection

	mu    sync.Mutex
	addrs map[netip.Addr]int // open connections per remote address (perAddress > 0); guarded by mu
}

// NewListener counts the connections l accepts: at most maxOpen open, and
// ProbeHeadroom more for the probes; at most perAddress from one remote
// address (0: no cap). plainTCP says they are not TLS, so that a rejected
// one is answered 503 before it is closed.
func NewListener(l net.Listener, maxOpen int64, perAddress int, plainTCP bool) *Listener {
	return &Listener{Listener: l, max: maxOpen, perAddress: max(0, perAddress), plainTCP: plainTCP}
}

// Accept accepts the next connection that is admitted.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		n := l.open.Add(1)
		lc := &limitConn{Conn: c, l: l}
		if l.admitAddress(lc) {
			lc.waiting.Store(true)
			lc.firstByte = time.Now().Add(FirstByteTimeout)
			switch {
			case n <= l.max:
				_ = lc.Conn.SetReadDeadline(lc.firstByte)
				return lc, nil
			case n <= l.max+ProbeHeadroom:
				lc.overflow = true
				lc.limit = time.Now().Add(overflowDeadline)
				_ = lc.Conn.SetReadDeadline(lc.deadline(time.Time{}))
				return lc, nil
			}
		}
		if l.lingering.Add(1) <= maxLingering {
			go l.reject(lc)
			continue
		}
		// Too many lingering already: answer and close here, so that the
		// descriptors in use stay bounded however fast connections come.
		l.lingering.Add(-1)
		l.answer(lc)
		lc.Close()
	}
}

// admitAddress counts c against its remote address and reports whether
// that address is under its cap (or there is none).
func (l *Listener) admitAddress(c *limitConn) bool {
	if l.perAddress <= 0 {
		return true
	}
	a, ok := addressOf(c.RemoteAddr())
	if !ok {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.addrs[a] >= l.perAddress {
		return false
	}
	if l.addrs == nil {
		l.addrs = map[netip.Addr]int{}
	}
	l.addrs[a]++
	c.addr, c.counted = a, true
	return true
}

// leaveAddress gives back c's place under its address's cap.
func (l *Listener) leaveAddress(c *limitConn) {
	if !c.counted {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.addrs[c.addr]--; l.addrs[c.addr] <= 0 {
		delete(l.addrs, c.addr)
	}
}

// addressOf is the address a connection from a is counted under: its IPv4
// address (an IPv4-mapped IPv6 one as IPv4), or its IPv6 /64, since one host
// commonly holds a whole /64.
func addressOf(a net.Addr) (netip.Addr, bool) {
	var ip netip.Addr
	switch a := a.(type) {
	case *net.TCPAddr:
		ip = a.AddrPort().Addr()
	default:
		ap, err := netip.ParseAddrPort(a.String())
		if err != nil {
			return netip.Addr{}, false
		}
		ip = ap.Addr()
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		p, err := ip.Prefix(64)
		if err != nil {
			return netip.Addr{}, false
		}
		ip = p.Addr()
	}
	return ip, ip.IsValid()
}

var rejectResponse = func() []byte {
	body := fmt.Sprintf(`{"error":{"message":%q,"type":"service_unavailable","code":"too_many_connections"}}`, tooManyConnections)
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n" +
		"Connection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

const tooManyConnections = "Service temporarily unavailable: too many open connections, please retry later"

// reject answers 503 on a connection past the headroom and closes it. It
// answers once the client has begun its request (or after a second of
// silence), not at once: to an HTTP client, an answer that comes before its
// request is an unsolicited response on an idle connection (Go's Transport
// logs it and fails the request instead of reading the 503). It then
// lingers (up to a second) reading what the client sent, so that the close
// does not reset the connection before the client reads the answer. At most
// maxLingering connections linger at once; Accept closes the rest at once.
func (l *Listener) reject(c *limitConn) {
	defer l.lingering.Add(-1)
	defer c.Close()
	if !l.plainTCP {
		return // a TLS connection is just closed
	}
	_ = c.Conn.SetReadDeadline(time.Now().Add(time.Second))
	var first [1]byte
	if _, err := c.Conn.Read(first[:]); errors.Is(err, io.EOF) {
		return // the client went without asking
	}
	if !l.answer(c) {
		return
	}
	if tc, ok := c.Conn.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	_ = c.Conn.SetReadDeadline(time.Now().Add(time.Second))
	_, _ = io.Copy(io.Discard, io.LimitReader(c.Conn, 64<<10))
}

// answer writes the 503 on a plain TCP connection (a TLS one is just closed).
func (l *Listener) answer(c *limitConn) bool {
	if !l.plainTCP {
		return false
	}
	_ = c.Conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, err := c.Write(rejectResponse)
	return err == nil
}

const maxLingering = 64

// limitConn is a counted connection. Until its first byte arrives, its read
// deadlines never reach past its first-byte deadline; an overflow
// connection's never reach past its limit, whatever the server asks for.
type limitConn struct {
	net.Conn
	l        *Listener
	once     sync.Once
	addr     netip.Addr // counted under it, if counted
	counted  bool
	overflow bool
	limit    time.Time

	waiting   atomic.Bool // no byte read yet
	firstByte time.Time   // the deadline of the first byte
	mu        sync.Mutex  // orders the read deadline's changes
	wanted    time.Time   // the read deadline the server set last; guarded by mu
}

func (c *limitConn) Close() error {
	c.once.Do(func() {
		c.l.open.Add(-1)
		c.l.leaveAddress(c)
	})
	return c.Conn.Close()
}

// Read reads from the connection; the first byte lifts the first-byte
// deadline, restoring the deadline the server set.
func (c *limitConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.waiting.Load() {
		c.mu.Lock()
		if c.waiting.Swap(false) {
			_ = c.Conn.SetReadDeadline(c.deadline(c.wanted))
		}
		c.mu.Unlock()
	}
	return n, err
}

// deadline is the read deadline in force when the server asks for t.
func (c *limitConn) deadline(t time.Time) time.Time {
	if c.overflow && (t.IsZero() || t.After(c.limit)) {
		t = c.limit
	}
	if c.waiting.Load() && (t.IsZero() || t.After(c.firstByte)) {
		t = c.firstByte
	}
	return t
}

func (c *limitConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wanted = t
	return c.Conn.SetReadDeadline(c.deadline(t))
}

func (c *limitConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

type overflowKey struct{}

// ConnContext marks the requests of an overflow connection.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if lc, ok := c.(*limitConn); ok && lc.overflow {
		return context.WithValue(ctx, overflowKey{}, true)
	}
	return ctx
}

// probePath reports whether path is a probe, answered on overflow connections.
func probePath(path string) bool { return path == "/live" || path == "/health" }

// Overflow answers 503 to everything but the probes on an
// overflow connection, and closes it after the answer.
func Overflow(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if over, _ := r.Context().Value(overflowKey{}).(bool); over {
			w.Header().Set("Connection", "close")
			if !probePath(r.URL.Path) {
				w.Header().Set("Retry-After", "1")
				openai.WriteError(w, http.StatusServiceUnavailable, "service_unavailable", "too_many_connections", tooManyConnections)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
