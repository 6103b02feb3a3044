package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/internal/waitfor"
	"github.com/baton-dev/baton/services/natsserver"
	"github.com/nats-io/nats.go"
)

// writeCerts writes a CA and a client certificate and key signed by it, as
// PEM files in dir.
func writeCerts(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "baton test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	clKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	clTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "baton-worker"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	clDER, err := x509.CreateCertificate(rand.Reader, clTmpl, caCert, &clKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(clKey)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("client.pem", "CERTIFICATE", clDER), write("client-key.pem", "EC PRIVATE KEY", keyDER)
}

func TestNATSSecurityFlags(t *testing.T) {
	dir := t.TempDir()
	ca, cert, key := writeCerts(t, dir)
	junk := filepath.Join(dir, "junk.pem")
	os.WriteFile(junk, []byte("not a certificate"), 0o600)
	creds := filepath.Join(dir, "user.creds")
	os.WriteFile(creds, []byte("-----BEGIN NATS USER JWT-----\n"), 0o600)

	tests := []struct {
		name     string
		n        natsFlags
		wantOpts int
		wantTLS  bool
		wantCert bool
		wantErr  string // substring; "" means valid
	}{
		{name: "none", n: natsFlags{}, wantOpts: 0},
		{name: "user and password", n: natsFlags{user: "fe", password: "pw"}, wantOpts: 1},
		{name: "creds", n: natsFlags{creds: creds}, wantOpts: 1},
		{name: "ca only", n: natsFlags{tlsCA: ca}, wantOpts: 1, wantTLS: true},
		{name: "mutual TLS and password", n: natsFlags{tlsCA: ca, tlsCert: cert, tlsKey: key, user: "u", password: "p"}, wantOpts: 2, wantTLS: true, wantCert: true},
		{name: "password without user", n: natsFlags{password: "p"}, wantErr: "--nats-password needs --nats-user"},
		{name: "user and creds", n: natsFlags{user: "u", creds: creds}, wantErr: "give one"},
		{name: "missing creds", n: natsFlags{creds: filepath.Join(dir, "nope")}, wantErr: "--nats-creds"},
		{name: "cert without key", n: natsFlags{tlsCert: cert}, wantErr: "go together"},
		{name: "bad CA", n: natsFlags{tlsCA: junk}, wantErr: "no PEM certificate"},
		{name: "key of nothing", n: natsFlags{tlsCert: junk, tlsKey: key}, wantErr: "--nats-tls-cert"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.n.urls = "nats://127.0.0.1:4222"
			err := tt.n.validate()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("validate() = %v, want an error containing %q", err, tt.wantErr)
				}
				if !errors.As(err, new(usageError)) {
					t.Errorf("%v is not a usage error (exit code 2)", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("validate() = %v, want nil", err)
			}
			if got := len(tt.n.options()); got != tt.wantOpts {
				t.Errorf("got %d options, want %d", got, tt.wantOpts)
			}
			tc := tt.n.tlsConfig()
			if got := tc != nil; got != tt.wantTLS {
				t.Fatalf("TLS config set = %v, want %v", got, tt.wantTLS)
			}
			if tc == nil {
				return
			}
			if tc.RootCAs == nil {
				t.Error("RootCAs not set from --nats-tls-ca")
			}
			if got := len(tc.Certificates) == 1; got != tt.wantCert {
				t.Errorf("client certificate set = %v, want %v", got, tt.wantCert)
			}
		})
	}
}

// TestConnectNATSRefused: a server that answers but refuses the client is
// reported at once, as what it is, and as a usage error (exit code 2); no
// server at all is still waited for.
func TestConnectNATSRefused(t *testing.T) {
	dir := t.TempDir()
	ca, _, _ := writeCerts(t, dir)
	s, err := natsserver.Start(natsserver.Config{Port: -1, InMemory: true, User: "alice", Password: "right"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	url := s.ClientURL()
	tlsOpts := (&natsFlags{urls: url, tlsCA: ca})
	if err := tlsOpts.validate(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		urls string
		opts []nats.Option
		want []string // substrings of the error
	}{
		{name: "wrong password", urls: url, opts: []nats.Option{nats.UserInfo("alice", "wrong")}, want: []string{"refused the connection (authentication)", "authorization violation"}},
		{name: "no credentials", urls: url, want: []string{"(authentication)", "authorization violation"}},
		{name: "password in the URL", urls: strings.Replace(url, "nats://", "nats://alice:wrong@", 1), want: []string{"(authentication)", "alice:xxxxx@"}},
		{name: "TLS to a plain server", urls: url, opts: tlsOpts.options(), want: []string{"refused the connection (TLS)", "secure connection not available"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := slog.New(slog.DiscardHandler)
			start := time.Now()
			nc, err := connectNATS(context.Background(), tt.urls, "test", 10*time.Second, log, tt.opts...)
			if err == nil {
				nc.Close()
				t.Fatal("connected, want a refusal")
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("refused after %v, want at once (the wait is 10s)", d)
			}
			if !errors.As(err, new(usageError)) {
				t.Errorf("%v is not a usage error (exit code 2)", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(w)) {
					t.Errorf("got %q, want %q in it", err, w)
				}
			}
			if strings.Contains(err.Error(), "wrong") {
				t.Errorf("%q shows the password", err)
			}
		})
	}
	nc, err := connectNATS(context.Background(), url, "test", 10*time.Second, slog.New(slog.DiscardHandler), nats.UserInfo("alice", "right"))
	if err != nil {
		t.Fatalf("right credentials: %v", err)
	}
	nc.Close()
}

func TestRefused(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"authorization", nats.ErrAuthorization, "authentication"},
		{"expired", fmt.Errorf("connect: %w", nats.ErrAuthExpired), "authentication"},
		{"secure required", nats.ErrSecureConnRequired, "TLS"},
		{"unknown CA", &net.OpError{Op: "read", Err: x509.UnknownAuthorityError{}}, "TLS"},
		{"hostname", x509.HostnameError{Certificate: &x509.Certificate{}, Host: "h"}, "TLS"},
		{"remote alert", errors.New("remote error: tls: certificate required"), "TLS"},
		{"not TLS", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, "TLS"},
		{"no servers", nats.ErrNoServers, ""},
		{"refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, ""},
		{"timeout", nats.ErrTimeout, ""},
	}
	for _, tt := range tests {
		if got := refused(tt.err); got != tt.want {
			t.Errorf("%s: refused(%v) = %q, want %q", tt.name, tt.err, got, tt.want)
		}
	}
}

// lockedBuffer is a bytes.Buffer safe for a logger's and a test's use.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestAsyncErrorsLogged: what the connection reports outside any call (here
// a slow consumer's dropped messages) is a line of the process's log, with
// its subscription's subject, not nats.go's line on stderr.
func TestAsyncErrorsLogged(t *testing.T) {
	s := natstest.Start(t)
	var out lockedBuffer
	nc, err := connectNATS(t.Context(), s.URL, "test", 10*time.Second, slog.New(slog.NewTextHandler(&out, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	block := make(chan struct{})
	defer close(block)
	sub, err := nc.Subscribe("baton.test.slow", func(*nats.Msg) { <-block })
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(1, -1); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := nc.Publish("baton.test.slow", nil); err != nil {
			t.Fatal(err)
		}
	}
	waitfor.Poll(t, "the slow consumer logged", func() bool {
		return strings.Contains(out.String(), "subject=baton.test.slow") && strings.Contains(out.String(), "slow consumer")
	})
}
