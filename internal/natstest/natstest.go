package natstest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/natsserver"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Server is a running test server.
type Server struct {
	*server.Server
	URL string
}

// Start starts a server that stops when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := natsserver.Start(natsserver.Config{Port: -1, StoreDir: t.TempDir()}, nil)
	if err != nil {
		t.Fatalf("start nats: %v", err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return &Server{Server: s, URL: s.ClientURL()}
}

// Connect opens a connection that closes when the test ends.
func (s *Server) Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return Connect(t, s.URL, opts...)
}

// JetStream connects and returns a JetStream context.
func (s *Server) JetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	return JetStream(t, s.URL)
}

// Connect opens a connection to url (any server: a cluster's, a proxy, a
// baton process's) with opts; it closes when the test ends.
//
// What the connection reports outside any call (a slow consumer, which
// nats.go would print to stderr) goes to the test's log, shown with -v or
// on failure, until the test ends; an opts' ErrorHandler replaces that.
func Connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	var (
		mu    sync.Mutex
		ended bool
	)
	t.Cleanup(func() { mu.Lock(); ended = true; mu.Unlock() })
	logErr := nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
		mu.Lock()
		defer mu.Unlock()
		if ended {
			return
		}
		if sub != nil {
			t.Logf("nats: %s: %v", sub.Subject, err)
		} else {
			t.Logf("nats: %v", err)
		}
	})
	nc, err := nats.Connect(url, append([]nats.Option{logErr}, opts...)...)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JetStream connects to url with opts (Connect) and returns a JetStream
// context.
func JetStream(t testing.TB, url string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(Connect(t, url, opts...))
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return js
}

// Provision connects, provisions baton's streams in memory (one request
// partition), and returns the JetStream context.
func (s *Server) Provision(t testing.TB) jetstream.JetStream {
	t.Helper()
	return s.ProvisionPartitions(t, 1)
}

// ProvisionPartitions is Provision with a request log of p partitions.
func (s *Server) ProvisionPartitions(t testing.TB, p streams.Partitions) jetstream.JetStream {
	t.Helper()
	js := s.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := streams.Provision(ctx, js, streams.Config{MemoryStorage: true, RequestPartitions: int(p)}); err != nil {
		t.Fatalf("provision: %v", err)
	}
	return js
}

// Append appends ev to subject with l, as event evid of request (its
// CloudEvents subject), expecting nothing of the subject's last sequence,
// and returns its sequence; a failed append fails t.
func Append(ctx context.Context, t testing.TB, l *streams.Log, subject, evid, request string, ev events.Event) uint64 {
	t.Helper()
	seq, err := l.Append(ctx, subject, l.Envelope(evid, request, ev), -1)
	if err != nil {
		t.Fatalf("append %s to %s: %v", ev.EventType(), subject, err)
	}
	return seq
}
