package streams_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// startCluster starts three in-process servers n1..n3 forming a JetStream
// cluster. Users: "admin" may do anything; "nostep" may not ask a stream
// leader to step down.
func startCluster(t *testing.T) (url string) {
	t.Helper()
	ports := make([]int, 6)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	var routes, urls []string
	for i := range 3 {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[3+i]))
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", ports[i]))
	}
	var servers []*server.Server
	for i := range 3 {
		conf := fmt.Sprintf(`
listen: 127.0.0.1:%d
server_name: n%d
jetstream { store_dir: %q }
cluster { name: c, listen: 127.0.0.1:%d, routes: [%s] }
accounts {
  BATON { jetstream: enabled, users: [
    {user: admin, password: a}
    {user: nostep, password: n, permissions: {publish: {deny: ["$JS.API.STREAM.LEADER.STEPDOWN.>"]}}}
  ] }
  SYS { users: [{user: sys, password: s}] }
}
system_account: SYS
`, ports[i], i+1, t.TempDir(), ports[3+i], strings.Join(routes, ", "))
		opts := &server.Options{}
		if err := opts.ProcessConfigString(conf); err != nil {
			t.Fatal(err)
		}
		opts.NoSigs, opts.NoLog = true, true
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		servers = append(servers, s)
	}
	t.Cleanup(func() {
		for _, s := range servers {
			s.Shutdown()
			s.WaitForShutdown()
		}
	})
	for _, s := range servers {
		if !s.ReadyForConnections(20 * time.Second) {
			t.Fatal("cluster node not ready")
		}
	}
	return strings.Join(urls, ",")
}

func clusterJS(t *testing.T, url, user, password string) jetstream.JetStream {
	t.Helper()
	return natstest.JetStream(t, url, nats.UserInfo(user, password))
}

func clusterCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func distinct(leaders []string) bool {
	seen := map[string]bool{}
	for _, l := range leaders {
		if l == "" || seen[l] {
			return false
		}
		seen[l] = true
	}
	return true
}

// TestSpreadLeaders provisions three R3 partitions on a 3-node cluster: their
// leaders end on three nodes. Moved all onto n1, SpreadLeaders spreads them
// again.
func TestSpreadLeaders(t *testing.T) {
	t.Parallel() // a cluster of its own; it waits for elections more than it computes
	url := startCluster(t)
	js := clusterJS(t, url, "admin", "a")
	ctx := clusterCtx(t)
	parts := streams.Partitions(3)
	if _, err := streams.Provision(ctx, js, streams.Config{Replicas: 3, MemoryStorage: true, RequestPartitions: 3}); err != nil {
		t.Fatalf("provision: %v", err)
	}
	leaders, err := streams.Leaders(ctx, js, parts)
	if err != nil || !distinct(leaders) {
		t.Fatalf("after provisioning: leaders %v (%v), want three nodes", leaders, err)
	}
	for k, l := range leaders {
		if l != "n1" {
			if err := streams.MoveLeader(ctx, js, parts.Stream(k), "n1"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if leaders, err := streams.Leaders(ctx, js, parts); err != nil || strings.Join(leaders, ",") != "n1,n1,n1" {
		t.Fatalf("moved onto n1: leaders %v (%v)", leaders, err)
	}
	if err := streams.SpreadLeaders(ctx, js, parts); err != nil {
		t.Fatalf("spread: %v", err)
	}
	if leaders, err := streams.Leaders(ctx, js, parts); err != nil || !distinct(leaders) {
		t.Errorf("after SpreadLeaders: leaders %v (%v), want three nodes", leaders, err)
	}
}

// TestProvisionLeadersNotSpread: a component that may not ask for a step
// down still provisions a working partitioned log, and says that the
// leaders could not be spread.
func TestProvisionLeadersNotSpread(t *testing.T) {
	t.Parallel() // a cluster of its own; it waits for elections more than it computes
	url := startCluster(t)
	js := clusterJS(t, url, "nostep", "n")
	ctx := clusterCtx(t)
	start := time.Now()
	parts, err := streams.Provision(ctx, js, streams.Config{Replicas: 3, MemoryStorage: true, RequestPartitions: 3})
	// The cluster places each partition's leader where it will: about one
	// time in five they are on three nodes already, and nothing needs
	// saying (and leaders it could not move may still move apart on their
	// own afterwards).
	spread := false
	if leaders, lerr := streams.Leaders(ctx, js, 3); lerr == nil {
		spread = distinct(leaders)
	}
	if parts != 3 || (err == nil && !spread) || (err != nil && !errors.Is(err, streams.ErrLeadersNotSpread)) {
		t.Fatalf("provision without the step-down permission: got %d, %v (leaders on three nodes: %v); want 3 and ErrLeadersNotSpread unless they are", parts, err, spread)
	}
	if took := time.Since(start); took > streams.SpreadBudget+10*time.Second {
		t.Errorf("provision took %v; the spread is bounded by %v", took, streams.SpreadBudget)
	}
	log := streams.NewLog(js, "test")
	for i := range 6 {
		id := fmt.Sprintf("ns-%d", i)
		ev := events.RequestAttached{RequestID: id, Frontend: "fe"}
		if _, err := log.Append(ctx, streams.RequestEvents(id), log.Envelope(id, id, ev), -1); err != nil {
			t.Fatalf("append %s: %v", id, err)
		}
		n := 0
		for _, err := range streams.ReadRequest(ctx, js, parts, id, 1) {
			if err != nil {
				t.Fatalf("read %s: %v", id, err)
			}
			n++
		}
		if n != 1 {
			t.Errorf("read %d events of %s, want 1", n, id)
		}
	}
}
