package integration

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
)

// The routes between `baton nats` nodes: route authentication and TLS keep
// a rogue node out, the system account has no default password, and open
// routes are refused.

// routeNode is a `baton nats` node of a route test.
type routeNode struct {
	*proc
	name                       string
	port, clusterPort, monPort int
}

func (n *routeNode) url() string { return "nats://127.0.0.1:" + strconv.Itoa(n.port) }

func (n *routeNode) routeURL() string {
	return "nats-route://127.0.0.1:" + strconv.Itoa(n.clusterPort)
}

// peers is the set of server names this node has routes to.
func (n *routeNode) peers(t *testing.T) map[string]bool {
	t.Helper()
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(n.monPort) + "/routez")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var rz struct {
		Routes []struct {
			RemoteName string `json:"remote_name"`
			RemoteID   string `json:"remote_id"`
		} `json:"routes"`
	}
	if json.NewDecoder(resp.Body).Decode(&rz) != nil {
		return nil
	}
	out := map[string]bool{}
	for _, r := range rz.Routes {
		out[r.RemoteName+r.RemoteID] = true
	}
	return out
}

func startRouteNode(t *testing.T, dir, name string, routes []string, extra ...string) *routeNode {
	t.Helper()
	n := &routeNode{name: name, port: freePort(t), clusterPort: freePort(t), monPort: freePort(t)}
	return n.start(t, dir, routes, extra...)
}

func (n *routeNode) start(t *testing.T, dir string, routes []string, extra ...string) *routeNode {
	t.Helper()
	args := append([]string{"nats", "--port", strconv.Itoa(n.port), "--server-name", n.name,
		"--store-dir", filepath.Join(dir, n.name), "--http-port", strconv.Itoa(n.monPort),
		"--cluster-name", "guarded", "--cluster-port", strconv.Itoa(n.clusterPort)}, extra...)
	if len(routes) > 0 {
		args = append(args, "--routes", strings.Join(routes, ","))
	}
	n.proc = start(t, n.name, nil, args...)
	waitFor(t, 20*time.Second, n.name+" to serve", func() bool { return n.peers(t) != nil })
	return n
}

// TestRogueNodeCannotJoin: with --cluster-user/--cluster-password (and,
// in the second cluster, route TLS) the nodes route to each other and a
// `baton nats` without the credentials (or without TLS) cannot join: no
// legitimate node routes to it, and a subscriber on it to baton.live.requests.> receives
// nothing of what is published on the cluster (formerly it received the
// prompts).
func TestRogueNodeCannotJoin(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cert, key, _ := selfSigned(t, dir)
	tlsArgs := []string{"--cluster-tls-cert", cert, "--cluster-tls-key", key, "--cluster-tls-ca", cert}
	for _, c := range []struct {
		name      string
		auth      []string // of the cluster
		rogue     []string // of the rogue node
		refusedBy string   // in a legitimate node's log
	}{
		{"authentication", []string{"--cluster-user", "route", "--cluster-password", "route-secret-1"}, nil, "Authentication Failure"},
		{"tls and authentication", append([]string{"--cluster-user", "route", "--cluster-password", "route-secret-2"}, tlsArgs...),
			[]string{"--cluster-user", "route", "--cluster-password", "route-secret-2"}, "TLS"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-"))
			a := &routeNode{name: "a", port: freePort(t), clusterPort: freePort(t), monPort: freePort(t)}
			b := &routeNode{name: "b", port: freePort(t), clusterPort: freePort(t), monPort: freePort(t)}
			routes := []string{a.routeURL(), b.routeURL()}
			a.start(t, d, routes, c.auth...)
			b.start(t, d, routes, c.auth...)
			waitFor(t, 30*time.Second, "a and b to route to each other", func() bool {
				return len(a.peers(t)) > 0 && len(b.peers(t)) > 0
			})
			rogue := startRouteNode(t, d, "rogue", routes, c.rogue...)
			waitFor(t, 30*time.Second, "the rogue route to be refused", func() bool {
				return strings.Contains(a.output(), c.refusedBy) || strings.Contains(b.output(), c.refusedBy)
			})
			// (The rogue's own /routez may list a route for the moment
			// between a's INFO and a's refusal of its CONNECT: the
			// legitimate nodes' view is the one that counts.)
			for _, n := range []*routeNode{a, b} {
				for peer := range n.peers(t) {
					if strings.HasPrefix(peer, "rogue") {
						t.Fatalf("%s routes to the rogue node", n.name)
					}
				}
			}

			// What is published on a reaches a subscriber on b, never one on
			// the rogue node.
			spy, err := nats.Connect(rogue.url())
			if err != nil {
				t.Fatal(err)
			}
			defer spy.Close()
			leaked, _ := spy.SubscribeSync("baton.live.requests.>")
			spy.Flush()
			peer, err := nats.Connect(b.url())
			if err != nil {
				t.Fatal(err)
			}
			defer peer.Close()
			got, _ := peer.SubscribeSync("baton.live.requests.>")
			peer.Flush()
			pub, err := nats.Connect(a.url())
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			waitFor(t, 10*time.Second, "a's publication to reach b", func() bool {
				_ = pub.Publish(streams.LiveSubject(streams.RequestEvents("r1")), []byte("a prompt"))
				_ = pub.Flush()
				_, err := got.NextMsg(100 * time.Millisecond)
				return err == nil
			})
			if m, err := leaked.NextMsg(200 * time.Millisecond); err == nil {
				t.Fatalf("the rogue node received %q", m.Data)
			}
		})
	}
}

// TestNoDefaultSystemPassword: the system account has no default password
// (formerly "baton-sys", with which a forged $SYS disconnect advisory
// revoked healthy workers' leases, CONNZ listed every connection and KICK
// disconnected a worker): `baton nats` generates one at first start, keeps
// it with mode 0600 in its store directory and uses it again after a
// restart; --sys-password (or BATON_NATS_SYS_PASSWORD) sets it.
func TestNoDefaultSystemPassword(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	file := filepath.Join(s.dir, "nats", "sys-password")
	st, err := os.Stat(file)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("password file %s: %v (mode %v), want mode 0600", file, err, st.Mode().Perm())
	}
	old := strings.Replace(s.natsURL, "nats://", "nats://sys:baton-sys@", 1)
	if nc, err := nats.Connect(old); err == nil {
		nc.Close()
		t.Fatal("the old default system password is accepted")
	}
	sys, err := nats.Connect(s.sysURL())
	if err != nil {
		t.Fatalf("the generated system password: %v", err)
	}
	if _, err := sys.Request("$SYS.REQ.SERVER.PING.CONNZ", nil, 5*time.Second); err != nil {
		t.Errorf("CONNZ as the system user: %v", err)
	}
	sys.Close()
	// The passwords reach nats-server as bcrypt: no "Plaintext passwords
	// detected" at every start (issue 23; formerly even with the generated
	// system password alone).
	if strings.Contains(s.nats.output(), "Plaintext passwords") {
		t.Errorf("the server warns of plaintext passwords:\n%s", s.nats.output())
	}

	// After a restart, the same password; with the variable, the given one.
	s.nats.signal(syscall.SIGTERM)
	s.nats.wait(20 * time.Second)
	port := strings.TrimPrefix(s.natsURL, "nats://127.0.0.1:")
	restarted := start(t, "nats-again", nil, "nats", "--port", port, "--store-dir", filepath.Join(s.dir, "nats"))
	waitFor(t, 20*time.Second, "the restarted server", func() bool {
		nc, err := nats.Connect(s.sysURL())
		if err == nil {
			nc.Close()
		}
		return err == nil
	})
	restarted.signal(syscall.SIGTERM)
	restarted.wait(20 * time.Second)
	start(t, "nats-env", []string{"BATON_NATS_SYS_PASSWORD=given-by-env-0123"}, "nats", "--port", port, "--store-dir", filepath.Join(s.dir, "nats"))
	given := strings.Replace(s.natsURL, "nats://", "nats://sys:given-by-env-0123@", 1)
	waitFor(t, 20*time.Second, "the server with the given password", func() bool {
		nc, err := nats.Connect(given)
		if err == nil {
			nc.Close()
		}
		return err == nil
	})
}

// TestOpenRoutesRefused: `baton nats` with routes on 0.0.0.0 and no route
// authentication formerly started silently, and a rogue node joined and
// read prompts. Now it exits 2 saying why; --cluster-insecure starts it,
// with a warning, and route authentication without TLS warns too.
func TestOpenRoutesRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	args := func(name string, extra ...string) []string {
		cport := strconv.Itoa(freePort(t))
		return append([]string{"nats", "--host", "0.0.0.0", "--port", strconv.Itoa(freePort(t)), "--server-name", name,
			"--store-dir", filepath.Join(dir, name), "--cluster-name", "open", "--cluster-port", cport,
			"--routes", "nats-route://127.0.0.1:" + cport}, extra...)
	}
	_, errOut, code := runTool(t, batonBin, args("refused")...)
	if code != 2 || !strings.Contains(errOut, "routes listen on 0.0.0.0 without route authentication") || !strings.Contains(errOut, "--cluster-insecure") {
		t.Errorf("open routes on 0.0.0.0: exit %d, want 2 and the reason:\n%s", code, errOut)
	}
	for _, tc := range []struct {
		name  string
		extra []string
		warn  string
	}{
		{"insecure", []string{"--cluster-insecure"}, "without route authentication (--cluster-insecure)"},
		{"no-tls", []string{"--cluster-user", "route", "--cluster-password", "route-password-0123"}, "without route TLS"},
	} {
		p := start(t, tc.name, nil, args(tc.name, tc.extra...)...)
		waitFor(t, 20*time.Second, tc.name+" to warn and serve", func() bool {
			return strings.Contains(p.output(), tc.warn) && strings.Contains(p.output(), "Server is ready")
		})
		p.signal(syscall.SIGTERM)
		if code := p.wait(20 * time.Second); code != 0 {
			t.Errorf("%s: exit %d after SIGTERM", tc.name, code)
		}
	}
}
