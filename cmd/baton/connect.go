package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Defaults of the NATS connection of every component.
const (
	defaultNATSURL     = "nats://127.0.0.1:4222"
	natsConnectTimeout = 10 * time.Second // a component started before its server waits this long
	natsReconnectWait  = 250 * time.Millisecond
	natsDrainTimeout   = 5 * time.Second
)

// natsFlags is --nats, the server (or the nodes of a cluster) to connect to.
type natsFlags struct {
	urls string
}

func addNATSFlags(f *flagSet) *natsFlags {
	n := &natsFlags{}
	f.StringVar(&n.urls, "nats", defaultNATSURL, "NATS server `URL[,URL...]`; a list names the nodes of a cluster")
	f.bindEnv("nats", "NATS_SERVER", nil)
	return n
}

// validate checks the syntax of every URL of the list.
func (n *natsFlags) validate() error {
	return validateNATSURLs("--nats", n.urls)
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
func connectNATS(ctx context.Context, urls, name string, timeout time.Duration, log *slog.Logger) (*conn, error) {
	connected := make(chan struct{}, 1)
	closed := make(chan struct{})
	var once sync.Once
	nc, err := nats.Connect(urls,
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(natsReconnectWait),
		nats.RetryOnFailedConnect(true),
		nats.DrainTimeout(natsDrainTimeout),
		nats.ConnectHandler(func(*nats.Conn) {
			select {
			case connected <- struct{}{}:
			default:
			}
		}),
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
	)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w", urls, err)
	}
	c := &conn{Conn: nc, closed: closed}
	if nc.IsConnected() {
		return c, nil
	}
	log.Info("waiting for nats", "url", urls, "timeout", timeout)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-connected:
		return c, nil
	case <-t.C:
		nc.Close()
		return nil, fmt.Errorf("no NATS server reachable at %s after %v (start one with 'baton nats' or use 'baton up')", urls, timeout)
	case <-ctx.Done():
		nc.Close()
		return nil, ctx.Err()
	}
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
