package frontend

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// ProbeHeadroom is how many connections past Config.MaxConnections are
// still accepted, for /live and /health only: a probe still gets an answer
// when the API is full. Such a connection must send its request within
// overflowDeadline, and is closed after its answer.
const ProbeHeadroom = 16

const overflowDeadline = 2 * time.Second

// limitListener counts open connections. Up to max it accepts them as they
// are; up to max+ProbeHeadroom it marks them overflow (see overflowConn);
// beyond that it answers 503 and closes them at once, so that a flood of
// idle connections cannot exhaust the file descriptors of the process.
type limitListener struct {
	net.Listener
	max       int64
	open      atomic.Int64
	lingering atomic.Int64
	plainTCP  bool // write an HTTP 503 before closing a rejected connection
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		n := l.open.Add(1)
		lc := &limitConn{Conn: c, l: l}
		switch {
		case n <= l.max:
			return lc, nil
		case n <= l.max+ProbeHeadroom:
			lc.overflow = true
			lc.limit = time.Now().Add(overflowDeadline)
			_ = c.SetReadDeadline(lc.limit)
			return lc, nil
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
func (l *limitListener) reject(c *limitConn) {
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
func (l *limitListener) answer(c *limitConn) bool {
	if !l.plainTCP {
		return false
	}
	_ = c.Conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, err := c.Write(rejectResponse)
	return err == nil
}

const maxLingering = 64

// limitConn is a counted connection. An overflow connection's read
// deadlines never reach past its limit, whatever the server asks for.
type limitConn struct {
	net.Conn
	l        *limitListener
	once     sync.Once
	overflow bool
	limit    time.Time
}

func (c *limitConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

func (c *limitConn) SetReadDeadline(t time.Time) error {
	if c.overflow && (t.IsZero() || t.After(c.limit)) {
		t = c.limit
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *limitConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

type overflowKey struct{}

// connContext marks the requests of an overflow connection.
func connContext(ctx context.Context, c net.Conn) context.Context {
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

// limitConnections answers 503 to everything but the probes on an
// overflow connection, and closes it after the answer.
func limitConnections(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if over, _ := r.Context().Value(overflowKey{}).(bool); over {
			w.Header().Set("Connection", "close")
			if !probePath(r.URL.Path) {
				w.Header().Set("Retry-After", "1")
				writeError(w, http.StatusServiceUnavailable, "service_unavailable", "too_many_connections", tooManyConnections)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// readBody reads a request's whole body (up to limit+1 bytes, so that the
// handler still sees what is too large) within the body timeout, then
// clears the read deadline, so that a long response is not cut. A body that
// does not arrive in time gets 408 and the connection is closed at once.
// The handler reads the body from memory, or takes the bytes read with
// requestBody.
func readBody(timeout time.Duration, limit int64, next http.Handler) http.Handler {
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
				writeError(w, http.StatusRequestTimeout, "invalid_request_error", "request_timeout",
					fmt.Sprintf("the request body did not arrive within %v", timeout))
				return
			}
			writeAPIError(w, badRequest("invalid_body", "could not read the request body: %v", err))
			return
		}
		_ = rc.SetReadDeadline(time.Time{})
		r.Body = &bufferedBody{Reader: bytes.NewReader(data), data: data}
		next.ServeHTTP(w, r)
	})
}

// bufferedBody is a request body that readBody read whole.
type bufferedBody struct {
	*bytes.Reader
	data []byte
}

func (*bufferedBody) Close() error { return nil }

// requestBody reads r's whole body, at most limit bytes (a
// *http.MaxBytesError beyond). A body readBody read is not copied: its bytes
// are returned (the request's accepted event holds them while the response
// lasts; a second copy would stay beside them, held by the request).
func requestBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
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

// tenantLimits bounds each tenant's concurrent responses and request rate
// (a token bucket of rps with a burst of max(1, rps)). Zero disables either.
type tenantLimits struct {
	maxConcurrent int
	rps           float64
	mu            sync.Mutex
	tenants       map[string]*tenantUse // bounded by the tenants of the keys file
}

type tenantUse struct {
	active int
	tokens float64
	last   time.Time
}

func newTenantLimits(maxConcurrent int, rps float64) *tenantLimits {
	return &tenantLimits{maxConcurrent: maxConcurrent, rps: rps, tenants: map[string]*tenantUse{}}
}

func (l *tenantLimits) use(tenant string, now time.Time) *tenantUse {
	u, ok := l.tenants[tenant]
	if !ok {
		u = &tenantUse{tokens: l.burst(), last: now}
		l.tenants[tenant] = u
	}
	return u
}

func (l *tenantLimits) burst() float64 { return math.Max(1, l.rps) }

// allow takes one token of tenant's rate; when none is left it returns how
// long until one is.
func (l *tenantLimits) allow(tenant string, now time.Time) (time.Duration, bool) {
	if l.rps <= 0 {
		return 0, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	u := l.use(tenant, now)
	if el := now.Sub(u.last); el > 0 {
		u.tokens = math.Min(l.burst(), u.tokens+el.Seconds()*l.rps)
	}
	u.last = now
	if u.tokens >= 1 {
		u.tokens--
		return 0, true
	}
	wait := time.Duration((1 - u.tokens) / l.rps * float64(time.Second))
	return wait, false
}

// acquire takes one of tenant's concurrent slots; release gives it back.
func (l *tenantLimits) acquire(tenant string) bool {
	if l.maxConcurrent <= 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	u := l.use(tenant, time.Now())
	if u.active >= l.maxConcurrent {
		return false
	}
	u.active++
	return true
}

func (l *tenantLimits) release(tenant string) {
	if l.maxConcurrent <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tenants[tenant].active--
}

// retryAfter is the Retry-After header's whole seconds for a wait, at least 1.
func retryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))
}

// rateLimit answers 429 with Retry-After to a tenant over its rate. The
// probes and /metrics are not counted.
func (fe *Frontend) rateLimit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !openPath(r.URL.Path) {
			if wait, ok := fe.limits.allow(tenantOf(r), time.Now()); !ok {
				w.Header().Set("Retry-After", retryAfter(wait))
				writeError(w, http.StatusTooManyRequests, "requests", "rate_limit_exceeded",
					fmt.Sprintf("Rate limit reached: %v requests per second for this API key, please retry later", fe.cfg.TenantRPS))
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// concurrent answers 429 with Retry-After to a tenant that already has its
// maximum of responses open (completions and resumes).
func (fe *Frontend) concurrent(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tenant := tenantOf(r)
		if !fe.limits.acquire(tenant) {
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusTooManyRequests, "requests", "concurrency_limit_exceeded",
				fmt.Sprintf("Too many concurrent requests: at most %d open at once for this API key, please retry later", fe.cfg.TenantMaxConcurrent))
			return
		}
		defer fe.limits.release(tenant)
		h(w, r)
	}
}
