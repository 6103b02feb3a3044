package integration

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMaxChildrenAndCancel: children per request are capped (400 beyond),
// so that filling a request's events subject with children can no longer
// refuse its own cancel; the cancel reaches every child. A frontend whose
// --max-children would not leave room for a cancel under the stream's
// messages-per-subject limit refuses to start.
func TestMaxChildrenAndCancel(t *testing.T) {
	s, f, _ := keyedStack(t, "--max-children", "3")
	alice := apiClient{f.url, aliceKey}
	long := func(prompt string) map[string]any {
		return map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 5000}
	}
	var wg sync.WaitGroup
	results := make([]sseResult, 4)
	run := func(i int, body map[string]any, header map[string]string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = alice.stream(t, body, header, nil)
		}()
	}
	running := func(id string) func() bool {
		return func() bool {
			var st requestState
			r := alice.get(t, "/v1/requests/"+id)
			return r.status == 200 && json.Unmarshal(r.body, &st) == nil && st.TokensGenerated > 0
		}
	}
	run(0, long("parent"), map[string]string{"X-Request-Id": "p"})
	waitFor(t, 10*time.Second, "the parent to run", running("p"))
	for i := 1; i <= 3; i++ {
		id := "kid-" + strconv.Itoa(i)
		run(i, long(id), map[string]string{"X-Request-Id": id, "X-Parent-Request-Id": "p"})
		waitFor(t, 10*time.Second, id+" to run", running(id))
	}
	data, _ := bodyOf(long("one too many"))
	alice.do(t, "POST", "/v1/completions", data, map[string]string{"X-Parent-Request-Id": "p"}).want(t, "a fourth child", 400, "too_many_children")

	r := alice.do(t, "POST", "/v1/requests/p/cancel", []byte(`{"mode":"kill"}`), nil)
	if r.status != 200 {
		t.Fatalf("cancel of a parent with the most children: %d %s", r.status, r.body)
	}
	var out struct {
		Children []string `json:"children"`
	}
	_ = json.Unmarshal(r.body, &out)
	if strings.Join(out.Children, ",") != "kid-1,kid-2,kid-3" {
		t.Errorf("cancelled children %v, want kid-1..3", out.Children)
	}
	wg.Wait()
	for i, res := range results {
		if res.done || !strings.Contains(res.errorBody, "cancel") {
			t.Errorf("stream %d after the parent's kill: done=%v error=%q", i, res.done, res.errorBody)
		}
	}

	// No room for a cancel: refused at start, on a fresh server whose
	// stream this frontend provisions with 500 messages per subject.
	s2 := newStack(t)
	port := freePort(t)
	p := start(t, "frontend-no-room", nil, "frontend", "--nats", s2.natsURL, "--http-port", strconv.Itoa(port),
		"--stream-max-msgs-per-subject", "500", "--max-children", "1000")
	if code := p.wait(30 * time.Second); code != 1 || !strings.Contains(p.output(), "no room for a cancel") {
		t.Errorf("frontend with --max-children 1000 over 500 messages per subject: exit %d, output:\n%s", code, p.output())
	}
	_ = s
}

// rawConn is a TCP connection to a frontend for requests written by hand.
func rawConn(t *testing.T, url string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// startedConn is a raw connection that sent the first bytes of a request
// (so that the first-byte deadline does not close it) and no more.
func startedConn(t *testing.T, url string) net.Conn {
	t.Helper()
	c := rawConn(t, url)
	if _, err := c.Write([]byte("GET ")); err != nil {
		t.Fatal(err)
	}
	return c
}

// closedWithin reads from c until the server closes it, and fails unless
// that happens within limit. It returns what was read.
func closedWithin(t *testing.T, c net.Conn, limit time.Duration, what string) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(limit))
	data, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: the connection was still open after %v (read %q)", what, limit, data)
	}
	return string(data)
}

// TestConnectionBounds: an idle keep-alive connection is closed after the
// idle timeout, a trickled body gets 408 after the body timeout, headers
// that never end are cut after the header timeout (all formerly held for as
// long as the client liked).
func TestConnectionBounds(t *testing.T) {
	s := newStack(t)
	f := s.frontend(nil, "--idle-timeout", "1s", "--body-timeout", "1s", "--read-header-timeout", "1s")

	// Idle keep-alive.
	c := rawConn(t, f.url)
	fmt.Fprintf(c, "GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /live: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	began := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("idle keep-alive: read %v, want EOF (closed by the server)", err)
	}
	idle := time.Since(began)
	if idle < 900*time.Millisecond {
		t.Errorf("idle connection closed after %v, before the 1s idle timeout", idle)
	}
	t.Logf("idle keep-alive closed after %v (idle timeout 1s)", idle)

	// A trickled body: one byte every 100 ms of a 1000-byte body.
	tc := rawConn(t, f.url)
	fmt.Fprintf(tc, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := tc.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	began = time.Now()
	got := closedWithin(t, tc, 10*time.Second, "trickled body")
	if !strings.HasPrefix(got, "HTTP/1.1 408") || !strings.Contains(got, "request_timeout") {
		t.Errorf("trickled body: got %q, want a 408 request_timeout", got)
	}
	t.Logf("trickled body answered and closed after %v (body timeout 1s)", time.Since(began))

	// Headers that never end.
	c = rawConn(t, f.url)
	fmt.Fprintf(c, "GET /live HTTP/1.1\r\nHost: x\r\n")
	began = time.Now()
	closedWithin(t, c, 10*time.Second, "unfinished headers")
	t.Logf("unfinished headers cut after %v (header timeout 1s)", time.Since(began))
}

// TestMaxConnections: past --max-connections a request gets 503 with
// Retry-After, the probes are still answered on the headroom, connections
// past the headroom are answered 503 on their request and closed, and the frontend
// serves again as soon as connections close.
func TestMaxConnections(t *testing.T) {
	s := newStack(t)
	f := s.frontend(nil, "--max-connections", "4")
	noKeepAlive := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	held := make([]net.Conn, 0, 4)
	for range 4 {
		held = append(held, startedConn(t, f.url))
	}
	resp, err := noKeepAlive.Get(f.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "too_many_connections") {
		t.Fatalf("a fifth connection: %d Retry-After %q %s, want 503 too_many_connections", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if resp, err := noKeepAlive.Get(f.url + "/live"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/live on the headroom: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	// Fill the headroom, then one more: answered 503 and closed at once.
	for range 16 {
		held = append(held, startedConn(t, f.url))
	}
	c := rawConn(t, f.url)
	fmt.Fprintf(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
	if got := closedWithin(t, c, 5*time.Second, "a connection past the headroom"); !strings.HasPrefix(got, "HTTP/1.1 503") {
		t.Errorf("past the headroom: got %q, want a 503", got)
	}
	for _, c := range held {
		c.Close()
	}
	waitFor(t, 10*time.Second, "requests served again", func() bool { return answers200(noKeepAlive, f.url+"/v1/models") })
}

// TestMaxConnectionsPerAddress: with --max-connections-per-address 3, one
// address holds three connections and its fourth is answered 503
// too_many_connections while another address (127.0.0.2) is served; a
// connection that sends nothing is closed after the first-byte deadline (2
// s), well before the header timeout (10 s). Formerly one client with no
// key held every slot with silent connections (issue 32).
func TestMaxConnectionsPerAddress(t *testing.T) {
	s := newStack(t)
	f := s.frontend(nil, "--max-connections-per-address", "3")
	host := strings.TrimPrefix(f.url, "http://")
	dial := func(from string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", host)
		if err != nil {
			t.Fatalf("dial from %s: %v", from, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// The cap is held from 127.0.0.4, not 127.0.0.1: the harness's readiness
	// probe came from 127.0.0.1, and the frontend counts that connection until
	// it has read the probe's close, which may come after the dials below.
	for range 3 {
		dial("127.0.0.4").Write([]byte("GET ")) // its first bytes: held for the header timeout
	}
	c := dial("127.0.0.4")
	fmt.Fprintf(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
	if got := closedWithin(t, c, 5*time.Second, "a fourth connection from 127.0.0.4"); !strings.HasPrefix(got, "HTTP/1.1 503") || !strings.Contains(got, "too_many_connections") {
		t.Errorf("a fourth connection from 127.0.0.4: got %q, want 503 too_many_connections", got)
	}
	other := dial("127.0.0.2")
	fmt.Fprintf(other, "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if got := closedWithin(t, other, 5*time.Second, "a connection from 127.0.0.2"); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Errorf("127.0.0.2 while 127.0.0.4 holds its limit: got %q, want 200", got)
	}
	silent := dial("127.0.0.3")
	began := time.Now()
	if got := closedWithin(t, silent, 5*time.Second, "a silent connection"); got != "" {
		t.Errorf("a silent connection was answered %q, want closed", got)
	}
	if took := time.Since(began); took < 1500*time.Millisecond {
		t.Errorf("a silent connection closed after %v, before the first-byte deadline of 2 s", took)
	}
	t.Logf("a silent connection closed after %v", time.Since(began))
}

// TestIdleConnectionFlood: at a low file limit (256), 600 idle connections
// formerly made accept fail for everyone. With --max-connections below the
// limit the frontend keeps answering: a probe is answered while the flood
// is held, and requests are served once the flood's connections are cut by
// the header timeout.
func TestIdleConnectionFlood(t *testing.T) {
	s := newStack(t)
	port := freePort(t)
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	// The flood comes from one address: the per-address cap is off, so that
	// the test measures the global one.
	p := startShell(t, "frontend-lowfd", fmt.Sprintf("ulimit -n 256 && exec %q frontend --nats %s --http-port %d --max-connections 100 --max-connections-per-address 0 --read-header-timeout 3s",
		batonBin, s.natsURL, port))
	waitFor(t, 20*time.Second, "the frontend to serve", func() bool { return answers200(http.DefaultClient, url+"/live") })
	flood := make([]net.Conn, 0, 600)
	for range 600 {
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("flood connection %d: %v", len(flood), err)
		}
		flood = append(flood, c)
	}
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	noKeepAlive := &http.Client{Transport: askFirst()}
	waitFor(t, 15*time.Second, "/live answered 200 during the flood", func() bool { return answers200(noKeepAlive, url+"/live") })
	waitFor(t, 15*time.Second, "the API to serve during the flood", func() bool { return answers200(noKeepAlive, url+"/v1/models") })
	if out := p.output(); strings.Contains(out, "too many open files") {
		t.Errorf("the frontend ran out of file descriptors:\n%s", out)
	}
}

// askFirst is a Transport for a client of a frontend under a connection
// flood. While 64 rejected connections linger, the frontend answers 503 and
// closes each further one as it accepts it, before its request (keeping its
// descriptors bounded is the point), and Go's Transport logs such an answer
// as an "Unsolicited response received on idle HTTP channel", at every poll
// of a test that waits through the flood. Its connections show the
// Transport nothing until it has written its request, so that the 503 is
// the answer to it, or the request fails, without the log.
func askFirst() *http.Transport {
	var d net.Dialer
	return &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &writeFirstConn{Conn: c, asked: make(chan struct{})}, nil
	}}
}

// writeFirstConn holds reads until the first write (or the close).
type writeFirstConn struct {
	net.Conn
	once  sync.Once
	asked chan struct{}
}

func (c *writeFirstConn) release() { c.once.Do(func() { close(c.asked) }) }

func (c *writeFirstConn) Write(b []byte) (int, error) {
	c.release()
	return c.Conn.Write(b)
}

func (c *writeFirstConn) Read(b []byte) (int, error) {
	<-c.asked
	return c.Conn.Read(b)
}

func (c *writeFirstConn) Close() error {
	c.release()
	return c.Conn.Close()
}

// startShell runs a shell command line as a test process.
func startShell(t *testing.T, name, line string) *proc {
	t.Helper()
	return startBin(t, "/bin/sh", name, nil, "-c", line)
}

// TestTenantLimits: past --tenant-max-concurrent open completions a tenant
// gets 429 with Retry-After while another tenant is served; past
// --tenant-rps requests per second, likewise.
func TestTenantLimits(t *testing.T) {
	s, f, keys := keyedStack(t, "--tenant-max-concurrent", "1")
	alice, bob := apiClient{f.url, aliceKey}, apiClient{f.url, bobKey}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		alice.stream(t, map[string]any{"model": "mock", "prompt": "hold", "max_tokens": 5000}, map[string]string{"X-Request-Id": "hold"}, nil)
	}()
	waitFor(t, 10*time.Second, "alice's first request to run", func() bool {
		var st requestState
		r := alice.get(t, "/v1/requests/hold")
		return r.status == 200 && json.Unmarshal(r.body, &st) == nil && st.TokensGenerated > 0
	})
	data, _ := bodyOf(map[string]any{"model": "mock", "prompt": "second", "max_tokens": 2})
	r := alice.do(t, "POST", "/v1/completions", data, nil)
	r.want(t, "alice's second concurrent request", 429, "concurrency_limit_exceeded")
	if r.header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	if r := bob.do(t, "POST", "/v1/completions", data, nil); r.status != 200 {
		t.Errorf("bob while alice is at her limit: %d %s", r.status, r.body)
	}
	if r := alice.do(t, "POST", "/v1/requests/hold/cancel", []byte(`{"mode":"kill"}`), nil); r.status != 200 {
		t.Fatalf("cancel: %d %s", r.status, r.body)
	}
	wg.Wait()

	g := s.frontend(nil, "--api-keys-file", keys, "--tenant-rps", "1")
	alice, bob = apiClient{g.url, aliceKey}, apiClient{g.url, bobKey}
	if r := alice.get(t, "/v1/models"); r.status != 200 {
		t.Fatalf("alice's first request: %d", r.status)
	}
	r = alice.get(t, "/v1/models")
	r.want(t, "alice's second request within a second at 1 rps", 429, "rate_limit_exceeded")
	if r.header.Get("Retry-After") != "1" {
		t.Errorf("Retry-After %q, want 1", r.header.Get("Retry-After"))
	}
	if r := bob.get(t, "/v1/models"); r.status != 200 {
		t.Errorf("bob limited by alice's rate: %d", r.status)
	}
	if r := (apiClient{g.url, ""}).get(t, "/live"); r.status != 200 {
		t.Errorf("/live counted against a rate: %d", r.status)
	}
}

// TestAPITLS: with --tls-cert and --tls-key the API is served over TLS only.
func TestAPITLS(t *testing.T) {
	s := newStack(t)
	dir := t.TempDir()
	cert, key, pool := selfSigned(t, dir)
	port := freePort(t)
	start(t, "frontend-tls", nil, "frontend", "--nats", s.natsURL, "--http-port", strconv.Itoa(port), "--tls-cert", cert, "--tls-key", key)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	url := "https://127.0.0.1:" + strconv.Itoa(port)
	waitFor(t, 20*time.Second, "the frontend to serve TLS", func() bool { return answers200(client, url+"/live") })
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/live")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("plain HTTP served with --tls-cert")
		}
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key into dir.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "baton test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(c)
	return certFile, keyFile, pool
}
