package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of the NATS connection of every component.
const (
	defaultNATSURL     = "nats://127.0.0.1:4222"
	natsConnectTimeout = 10 * time.Second // a component started before its server waits this long
	natsReconnectWait  = 250 * time.Millisecond
	natsDrainTimeout   = 5 * time.Second
)

// natsFlags is --nats, the server (or the nodes of a cluster) to connect to,
// and how to authenticate to it and secure the connection.
type natsFlags struct {
	urls     string
	user     string
	password string
	creds    string
	tlsCA    string
	tlsCert  string
	tlsKey   string
	opts     []nats.Option // built by validate
	tls      *tls.Config   // the TLS part of opts, nil without TLS files
}

func addNATSFlags(f *flagSet) *natsFlags {
	n := &natsFlags{}
	f.StringVar(&n.urls, "nats", defaultNATSURL, "NATS server `URL[,URL...]`; a list names the nodes of a cluster; nats://user:password@host:port carries credentials")
	f.bindEnv("nats", "NATS_SERVER", nil)
	f.StringVar(&n.user, "nats-user", "", "NATS `user` (with --nats-password)")
	f.bindEnv("nats-user", "NATS_USER", nil)
	f.StringVar(&n.password, "nats-password", "", "NATS `password` of --nats-user")
	f.bindEnv("nats-password", "NATS_PASSWORD", nil)
	f.StringVar(&n.creds, "nats-creds", "", "NATS credentials `file` (JWT and NKey seed, as made by nsc)")
	f.bindEnv("nats-creds", "NATS_CREDS", nil)
	f.StringVar(&n.tlsCA, "nats-tls-ca", "", "PEM `file` of the CA that signed the NATS server's certificate (implies TLS)")
	f.bindEnv("nats-tls-ca", "NATS_TLS_CA", nil)
	f.StringVar(&n.tlsCert, "nats-tls-cert", "", "PEM client certificate `file` for TLS client authentication (with --nats-tls-key)")
	f.bindEnv("nats-tls-cert", "NATS_TLS_CERT", nil)
	f.StringVar(&n.tlsKey, "nats-tls-key", "", "PEM private key `file` of --nats-tls-cert")
	f.bindEnv("nats-tls-key", "NATS_TLS_KEY", nil)
	return n
}

// validate checks the syntax of every URL of the list and the security
// flags, reads the files they name, and builds the connection options.
func (n *natsFlags) validate() error {
	if err := validateNATSURLs("--nats", n.urls); err != nil {
		return err
	}
	opts, tc, err := n.security()
	if err != nil {
		return err
	}
	n.opts, n.tls = opts, tc
	return nil
}

// options are the NATS connection options of the security flags; validate
// builds them.
func (n *natsFlags) options() []nats.Option { return n.opts }

// tlsConfig is the TLS part of options (nil without TLS files), for a
// connection that carries its own credentials (the frontend's
// system-account URL).
func (n *natsFlags) tlsConfig() *tls.Config { return n.tls }

// security builds the connection options of the flags, and returns the TLS
// configuration among them.
func (n *natsFlags) security() ([]nats.Option, *tls.Config, error) {
	var opts []nats.Option
	var errs []error
	switch {
	case n.user != "" && n.creds != "":
		errs = append(errs, errors.New("--nats-user and --nats-creds: give one"))
	case n.user != "":
		opts = append(opts, nats.UserInfo(n.user, n.password))
	case n.password != "":
		errs = append(errs, errors.New("--nats-password needs --nats-user"))
	case n.creds != "":
		if _, err := os.Stat(n.creds); err != nil {
			errs = append(errs, fmt.Errorf("--nats-creds: %w", err))
		}
		opts = append(opts, nats.UserCredentials(n.creds))
	}
	tc, err := tlsConfig(n.tlsCA, n.tlsCert, n.tlsKey)
	if err != nil {
		errs = append(errs, err)
	} else if tc != nil {
		opts = append(opts, nats.Secure(tc))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, usageError{err}
	}
	return opts, tc, nil
}

// tlsConfig is the client TLS configuration of the --nats-tls-* files, or
// nil when none is given (TLS is then used only if a URL says tls://).
func tlsConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	if caFile == "" && certFile == "" && keyFile == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	var errs []error
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("--nats-tls-ca: %w", err))
		} else {
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				errs = append(errs, fmt.Errorf("--nats-tls-ca %s: no PEM certificate", caFile))
			}
		}
	}
	switch {
	case (certFile == "") != (keyFile == ""):
		errs = append(errs, errors.New("--nats-tls-cert and --nats-tls-key go together"))
	case certFile != "":
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("--nats-tls-cert/--nats-tls-key: %w", err))
		} else {
			tc.Certificates = []tls.Certificate{cert}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return tc, nil
}

func validateNATSURLs(what, list string) error {
	if strings.TrimSpace(list) == "" {
		return usagef("%s: no URL", what)
	}
	for _, raw := range strings.Split(list, ",") {
		raw = strings.TrimSpace(raw)
		u, err := url.Parse(raw)
		if err != nil {
			return usagef("%s: bad URL %q", what, raw)
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return usagef("%s: bad URL %q: want nats://host:port", what, raw)
		}
		if u.Host == "" {
			return usagef("%s: bad URL %q: no host", what, raw)
		}
	}
	return nil
}

// conn is a NATS connection that knows when it is closed.
type conn struct {
	*nats.Conn
	closed chan struct{}
}

// connectNATS connects to urls, waiting up to timeout for a server that is not
// up yet. The connection then reconnects forever. It returns ctx's error if
// ctx ends first.
//
// A server that answers but refuses the client (wrong or missing
// credentials, a TLS mismatch) is not worth waiting for: that error comes at
// once, as a usage error (exit code 2), saying what the server said.
//
// extra (natsFlags.options: credentials, TLS) is applied after the defaults.
func connectNATS(ctx context.Context, urls, name string, timeout time.Duration, log *slog.Logger, extra ...nats.Option) (*conn, error) {
	deadline := time.Now().Add(timeout)
	for attempt := 0; ; attempt++ {
		closed := make(chan struct{})
		var once sync.Once
		opts := []nats.Option{
			nats.Name(name),
			nats.MaxReconnects(-1),
			nats.ReconnectWait(natsReconnectWait),
			nats.DrainTimeout(natsDrainTimeout),
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				if err != nil {
					log.Warn("nats disconnected", "err", err)
				}
			}),
			nats.ReconnectHandler(func(c *nats.Conn) {
				log.Info("nats reconnected", "url", c.ConnectedUrlRedacted())
			}),
			nats.ClosedHandler(func(*nats.Conn) {
				once.Do(func() { close(closed) })
			}),
			nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
				logAsyncError(log, sub, err)
			}),
		}
		nc, err := nats.Connect(urls, append(opts, extra...)...)
		if err == nil {
			return &conn{Conn: nc, closed: closed}, nil
		}
		if what := refused(err); what != "" {
			hint := "--nats-user/--nats-password, --nats-creds or the user:password in --nats"
			if what == "TLS" {
				hint = "--nats-tls-ca, --nats-tls-cert/--nats-tls-key and whether the server uses TLS"
			}
			return nil, usagef("NATS at %s refused the connection (%s): %v; check %s", redactURLs(urls), what, err, hint)
		}
		if attempt == 0 {
			log.Info("waiting for nats", "url", redactURLs(urls), "timeout", timeout, "err", err)
		}
		if !time.Now().Before(deadline) {
			return nil, fmt.Errorf("no NATS server reachable at %s after %v: if the stack runs elsewhere (baton up on another port, compose, a cluster), "+
				"pass its address with --nats URL or NATS_SERVER; otherwise start one with 'baton nats' or 'baton up': %w", redactURLs(urls), timeout, err)
		}
		t := time.NewTimer(min(natsReconnectWait, time.Until(deadline)))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
}

// logAsyncError logs what the server or the client library reports
// outside any call (a slow consumer's dropped messages, a permissions
// violation) in the process's own log, where nats.go would print it to
// stderr unstructured. A dropped live message is repaired (its reader
// reads the log, runner/live.go), so it is a warning, not an error.
func logAsyncError(log *slog.Logger, sub *nats.Subscription, err error) {
	if sub == nil {
		log.Warn("nats", "err", err)
		return
	}
	log.Warn("nats", "subject", sub.Subject, "err", err)
}

// refused says what kind of refusal err is, when a server answered and
// turned the client away: "authentication" or "TLS"; "" for anything else
// (no server, a timeout), which is worth waiting out.
func refused(err error) string {
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
		alert     tls.AlertError
		recordHdr tls.RecordHeaderError
		// A TLS alert from the server ("remote error: tls: certificate
		// required") has no exported type.
		tlsText = strings.Contains(err.Error(), "tls: ")
	)
	switch {
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired),
		errors.Is(err, nats.ErrAuthRevoked), errors.Is(err, nats.ErrAccountAuthExpired):
		return "authentication"
	case errors.Is(err, nats.ErrSecureConnRequired), errors.Is(err, nats.ErrSecureConnWanted),
		errors.As(err, &unknownCA), errors.As(err, &hostname), errors.As(err, &invalid),
		errors.As(err, &verify), errors.As(err, &alert), errors.As(err, &recordHdr), tlsText:
		return "TLS"
	}
	return ""
}

// redactURLs is a URL list with any passwords replaced, for messages.
func redactURLs(list string) string {
	parts := strings.Split(list, ",")
	for i, raw := range parts {
		if u, err := url.Parse(strings.TrimSpace(raw)); err == nil {
			parts[i] = u.Redacted()
		}
	}
	return strings.Join(parts, ",")
}

// close drains the connection, so that what was published is flushed, bounded
// by the drain timeout.
func (c *conn) close() {
	if c == nil {
		return
	}
	if err := c.Drain(); err != nil {
		c.Close()
		return
	}
	t := time.NewTimer(natsDrainTimeout + time.Second)
	defer t.Stop()
	select {
	case <-c.closed:
	case <-t.C:
		c.Close()
	}
}

// connectTool connects a command-line tool (replay, events) and opens
// JetStream. A nil conn with a nil error means ctx ended while connecting.
// connectTool connects a tool (replay, events) to NATS and learns the request
// log's layout from the server: tools take no --request-partitions. conn is
// nil when ctx ended while connecting.
// toolDiscoverBudget bounds a tool's look-up of the request log's layout once
// connected.
const toolDiscoverBudget = 30 * time.Second

func connectTool(ctx context.Context, env *environment, common *commonFlags, nf *natsFlags, name string) (*conn, jetstream.JetStream, streams.Partitions, error) {
	log := common.logger(env.stderr, name)
	nc, err := connectNATS(ctx, nf.urls, "baton-"+name, toolConnectTimeout, log, nf.options()...)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, 0, nil
		}
		return nil, nil, 0, err
	}
	js, err := jetstream.New(nc.Conn)
	if err != nil {
		nc.Close()
		return nil, nil, 0, fmt.Errorf("jetstream: %w", err)
	}
	// Connected: a discovery that fails now is a cluster electing a
	// leader (5-7 s), which a tool rides out as the components do.
	dctx, cancel := context.WithTimeout(ctx, toolDiscoverBudget)
	defer cancel()
	var parts streams.Partitions
	err = streams.Retry(dctx, func(ctx context.Context) error {
		var err error
		parts, err = streams.Discover(ctx, js)
		return err
	})
	if err != nil {
		nc.Close()
		return nil, nil, 0, err
	}
	return nc, js, parts, nil
}
