package httpguard

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/baton-dev/baton/internal/waitfor"
)

// pipeListener accepts the server ends of net.Pipe connections.
type pipeListener struct{ conns chan net.Conn }

func (p *pipeListener) Accept() (net.Conn, error) {
	c, ok := <-p.conns
	if !ok {
		return nil, net.ErrClosed
	}
	return c, nil
}
func (p *pipeListener) Close() error   { return nil }
func (p *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// TestFirstByteDeadline: a new connection that sends nothing is cut
// FirstByteTimeout after it was accepted, though the server asked for a
// longer (header) deadline; its first byte restores the server's deadline;
// a shorter one of the server's stays.
func TestFirstByteDeadline(t *testing.T) {
	cases := []struct {
		name      string
		serverDL  time.Duration // the read deadline the server sets at once
		firstByte time.Duration // when the client sends a byte; 0: never
		wantCut   time.Duration // when the server's read times out
		wantBytes int           // read before it
	}{
		{name: "silent: cut at the first-byte deadline", serverDL: 10 * time.Second, wantCut: FirstByteTimeout},
		{name: "silent, no server deadline", wantCut: FirstByteTimeout},
		{name: "a byte in time: the header deadline", serverDL: 10 * time.Second, firstByte: 1900 * time.Millisecond, wantCut: 10 * time.Second, wantBytes: 1},
		{name: "a shorter header deadline stays", serverDL: time.Second, wantCut: time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				server, client := net.Pipe()
				defer client.Close()
				pl := &pipeListener{conns: make(chan net.Conn, 1)}
				pl.conns <- server
				l := &Listener{Listener: pl, max: 10, perAddress: 256}
				c, err := l.Accept()
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				start := time.Now()
				if tc.serverDL > 0 {
					_ = c.SetReadDeadline(start.Add(tc.serverDL))
				}
				if tc.firstByte > 0 {
					go func() {
						time.Sleep(tc.firstByte)
						_, _ = client.Write([]byte("G"))
					}()
				}
				got := 0
				buf := make([]byte, 16)
				for {
					n, err := c.Read(buf)
					got += n
					if err != nil {
						if !errors.Is(err, os.ErrDeadlineExceeded) {
							t.Fatalf("read: %v, want a deadline", err)
						}
						break
					}
				}
				if el := time.Since(start); el != tc.wantCut || got != tc.wantBytes {
					t.Errorf("cut after %v with %d bytes read, want %v with %d", el, got, tc.wantCut, tc.wantBytes)
				}
			})
		})
	}
}

// TestAddressOf: connections are counted per IPv4 address and per IPv6 /64.
func TestAddressOf(t *testing.T) {
	cases := []struct {
		in   string
		want string
	}{
		{"127.0.0.1:5000", "127.0.0.1"},
		{"[::ffff:10.1.2.3]:80", "10.1.2.3"},
		{"[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:443", "2001:db8:1:2::"},
		{"[2001:db8:1:2::1]:443", "2001:db8:1:2::"},
		{"[fe80::1%eth0]:22", "fe80::"},
	}
	for _, tc := range cases {
		ap := netip.MustParseAddrPort(tc.in)
		got, ok := addressOf(net.TCPAddrFromAddrPort(ap))
		if !ok || got.String() != tc.want {
			t.Errorf("addressOf(%s): got %v (%v), want %s", tc.in, got, ok, tc.want)
		}
	}
	if _, ok := addressOf(pipeAddr{}); ok {
		t.Error("a pipe's address is counted")
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// TestMaxConnectionsPerAddress: one address holds its limit of open
// connections; past it a new one is answered 503 too_many_connections, as
// past the global cap's headroom, while another address (127.0.0.2) is still
// served; once one closes, the address is served again.
func TestMaxConnectionsPerAddress(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &Listener{Listener: tcp, max: 100, perAddress: 3, plainTCP: true}
	srv := &http.Server{ConnContext: ConnContext, ReadHeaderTimeout: 10 * time.Second,
		Handler: Overflow(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))}
	go srv.Serve(l)
	defer srv.Close()
	addr := tcp.Addr().String()
	dial := func(from string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial from %s: %v", from, err)
		}
		return c
	}
	get := func(from string) (int, string) {
		t.Helper()
		c := dial(from)
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return 0, err.Error()
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	open := func(a string) int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.addrs[netip.MustParseAddr(a)]
	}
	held := make([]net.Conn, 3)
	for i := range held {
		held[i] = dial("127.0.0.1")
		defer held[i].Close()
		io.WriteString(held[i], "GET / HTTP/1.1\r\n") // its first byte, not yet its headers
	}
	waitfor.Poll(t, "three connections open from 127.0.0.1", func() bool { return open("127.0.0.1") == 3 })
	if code, body := get("127.0.0.1"); code != http.StatusServiceUnavailable || !strings.Contains(body, `"code":"too_many_connections"`) {
		t.Errorf("a fourth connection from 127.0.0.1: %d %s, want 503 too_many_connections", code, body)
	}
	if code, body := get("127.0.0.2"); code != http.StatusOK {
		t.Errorf("a connection from 127.0.0.2 while 127.0.0.1 holds its limit: %d %s, want 200", code, body)
	}
	held[0].Close()
	waitfor.Poll(t, "a closed connection to give its place back", func() bool { return open("127.0.0.1") == 2 })
	if code, body := get("127.0.0.1"); code != http.StatusOK {
		t.Errorf("127.0.0.1 under its limit again: %d %s, want 200", code, body)
	}
	waitfor.Poll(t, "the places of closed connections given back", func() bool { return open("127.0.0.2") == 0 })
}

// TestRejectAnswersTheRequest: a connection past the headroom is answered
// 503 once its request begins, never before: an answer before the request
// is, to Go's Transport, an unsolicited response on an idle connection,
// which it logs and turns into an error instead of the 503 (a test of the
// idle-connection flood logged it by the hundred). A client that asks gets
// the 503 as its answer, every time.
func TestRejectAnswersTheRequest(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &Listener{Listener: ln, max: 0, plainTCP: true}
	accepted := make(chan net.Conn, ProbeHeadroom)
	served := make(chan struct{})
	go func() {
		defer close(served)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c // the headroom: held open, never answered
		}
	}()
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	var held []net.Conn
	for range ProbeHeadroom {
		held = append(held, dial())
		held = append(held, <-accepted)
	}
	defer func() {
		ln.Close()
		<-served
		for _, c := range held {
			c.Close()
		}
	}()

	c := dial()
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("past the headroom, before any request: read %d bytes, %v; want nothing yet", n, err)
	}
	fmt.Fprintf(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("past the headroom, after the request: %v, want a 503", err)
	}
	resp.Body.Close()
	c.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("past the headroom: %d, want 503", resp.StatusCode)
	}

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer client.CloseIdleConnections()
	for i := range 50 {
		resp, err := client.Get("http://" + ln.Addr().String() + "/v1/models")
		if err != nil {
			t.Fatalf("request %d past the headroom: %v, want a 503", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "too_many_connections") {
			t.Fatalf("request %d past the headroom: %d %s, want 503 too_many_connections", i, resp.StatusCode, body)
		}
	}
	waitfor.Poll(t, "no rejected connection to linger", func() bool { return l.lingering.Load() == 0 })
}
