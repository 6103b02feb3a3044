package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A cluster of `baton nats` nodes: a node lost, NATS authentication, and
// docs/deployment.md's cluster recipe run as written.

// natsNode is one `baton nats` process of a cluster.
type natsNode struct {
	*proc
	name string
	url  string
	args []string
}

// cluster is three `baton nats` processes on loopback forming one JetStream
// cluster.
type cluster struct {
	t     testing.TB
	nodes []*natsNode
}

// newCluster starts a 3-node cluster and waits until JetStream answers.
func newCluster(t testing.TB) *cluster {
	t.Helper()
	dir := t.TempDir()
	c := &cluster{t: t}
	var routes []string
	ports := make([][2]int, 3)
	for i := range ports {
		ports[i] = [2]int{freePort(t), freePort(t)}
		routes = append(routes, "nats-route://127.0.0.1:"+strconv.Itoa(ports[i][1]))
	}
	for i, p := range ports {
		name := fmt.Sprintf("n%d", i+1)
		n := &natsNode{name: name, url: "nats://127.0.0.1:" + strconv.Itoa(p[0]), args: []string{
			"nats", "--port", strconv.Itoa(p[0]), "--server-name", name, "--store-dir", filepath.Join(dir, name),
			"--cluster-name", "baton-it", "--cluster-port", strconv.Itoa(p[1]), "--routes", strings.Join(routes, ","),
		}}
		c.nodes = append(c.nodes, n)
		c.startNode(n)
	}
	c.waitJetStream()
	return c
}

func (c *cluster) startNode(n *natsNode) {
	c.t.Helper()
	n.proc = start(c.t, n.name, nil, n.args...)
	addr := strings.TrimPrefix(n.url, "nats://")
	waitFor(c.t, 20*time.Second, n.name+" to listen", func() bool {
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
}

// urls is the comma-separated client URLs of every node.
func (c *cluster) urls() string {
	var us []string
	for _, n := range c.nodes {
		us = append(us, n.url)
	}
	return strings.Join(us, ",")
}

func (c *cluster) node(name string) *natsNode {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	c.t.Fatalf("no node %q", name)
	return nil
}

// jetStream connects a test client to the cluster.
func (c *cluster) jetStream() jetstream.JetStream {
	c.t.Helper()
	return natstest.JetStream(c.t, c.urls(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
}

// waitJetStream waits until the cluster has a meta leader.
func (c *cluster) waitJetStream() {
	c.t.Helper()
	js := c.jetStream()
	waitFor(c.t, 30*time.Second, "a JetStream meta leader", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err == nil
	})
}

// newLeader waits until stream name has a leader other than old, which was
// killed, and fails the test loudly if none is elected: the leader kill did
// not take effect.
func (c *cluster) newLeader(js jetstream.JetStream, name, old string) string {
	c.t.Helper()
	var leader string
	waitFor(c.t, 60*time.Second, fmt.Sprintf("%s to elect a leader other than %s, killed (the kill did not take effect if none)", name, old), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if s, err := js.Stream(ctx, name); err == nil {
			if info, err := s.Info(ctx); err == nil && info.Cluster != nil {
				leader = info.Cluster.Leader
			}
		}
		return leader != "" && leader != old
	})
	return leader
}

// streamInfo returns the cluster view of a stream once it has a leader and
// every replica is current.
func (c *cluster) streamInfo(js jetstream.JetStream, name string) *jetstream.StreamInfo {
	c.t.Helper()
	var info *jetstream.StreamInfo
	waitFor(c.t, 30*time.Second, name+" to have a leader and current replicas", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s, err := js.Stream(ctx, name)
		if err != nil {
			return false
		}
		info, err = s.Info(ctx)
		if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
			return false
		}
		for _, r := range info.Cluster.Replicas {
			if !r.Current || r.Offline {
				return false
			}
		}
		return len(info.Cluster.Replicas) == len(c.nodes)-1
	})
	return info
}

// clusterStream is one streaming request of the cluster test and what its
// client received.
type clusterStream struct {
	id, prompt string
	res        sseResult
	maxGap     time.Duration
	maxTokens  int
}

// partitionedID is the first id "<tag>-<i>-<j>" whose request partition of
// parts is i modulo their number: streams i = 0, 1, 2, ... spread over them.
func partitionedID(parts streams.Partitions, tag string, i int) string {
	for j := 0; ; j++ {
		if id := fmt.Sprintf("%s-%d-%d", tag, i, j); parts.PartitionOf(id) == i%parts.Count() {
			return id
		}
	}
}

// streamAll runs n streaming completions through fe at once, their ids
// spread over the request partitions of parts, and calls fault once every
// stream has received at least faultAt tokens.
func streamAll(t *testing.T, fe *frontend, parts streams.Partitions, tag string, n, maxTokens, faultAt int, fault func()) []*clusterStream {
	t.Helper()
	out := make([]*clusterStream, n)
	var wg, reached sync.WaitGroup
	reached.Add(n)
	for i := range out {
		cs := &clusterStream{id: partitionedID(parts, tag, i), prompt: fmt.Sprintf("cluster %s stream %d", tag, i)}
		out[i] = cs
		wg.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			defer once.Do(reached.Done)
			resp, err := tryPost(context.Background(), fe.url+"/v1/completions",
				map[string]any{"model": "mock", "prompt": cs.prompt, "max_tokens": maxTokens, "stream": true},
				map[string]string{"X-Request-Id": cs.id})
			if err != nil {
				t.Errorf("%s: %v", cs.id, err)
				return
			}
			defer resp.Body.Close()
			last := time.Now()
			cs.res = readStream(t, resp, func(e sseEvent) {
				if gap := time.Since(last); gap > cs.maxGap {
					cs.maxGap = gap
				}
				last = time.Now()
				if off, err := strconv.Atoi(e.id); err == nil && off >= faultAt {
					once.Do(reached.Done)
				}
			})
		}()
	}
	reached.Wait()
	fault()
	wg.Wait()
	return out
}

// checkClusterStreams checks that every stream completed with the fault-free
// text, that the log, read through another frontend, holds all of it, and
// that the log stored at most twice the tokens delivered, counted over every
// delta of the request (a re-send after a failed append carries only what was
// not acknowledged): each attempt at most twice what it had to produce, from
// its start offset to the end.
func checkClusterStreams(t *testing.T, js jetstream.JetStream, reader *frontend, css []*clusterStream, maxTokens int) {
	t.Helper()
	for _, cs := range css {
		stored, deltas, starts := storedTokens(t, js, cs.id)
		bound := 0
		for _, start := range starts {
			bound += 2 * (maxTokens - start)
		}
		t.Logf("%s: the log stores %d tokens in %d deltas for %d delivered (%d attempts)", cs.id, stored, deltas, maxTokens, len(starts))
		if stored > bound {
			t.Errorf("%s: the log stores %d tokens for %d delivered in %d attempts; want at most %d", cs.id, stored, maxTokens, len(starts), bound)
		}
	}
	for _, cs := range css {
		want := engine.MockText(cs.prompt, 0, maxTokens)
		if !cs.res.done || cs.res.text != want {
			t.Errorf("%s: done=%v error=%q\n got %q\nwant %q", cs.id, cs.res.done, cs.res.errorBody, cs.res.text, want)
			continue
		}
		checkIDs(t, cs.res, 0)
		st := reader.state(t, cs.id)
		if st.Status != "completed" || st.TokensGenerated != maxTokens {
			t.Errorf("%s: state via %s: status %q, %d tokens; want completed, %d", cs.id, reader.Name, st.Status, st.TokensGenerated, maxTokens)
		}
		replay := postlessReplay(t, reader, cs.id)
		if !replay.done || replay.text != want {
			t.Errorf("%s: replay from the log via %s differs:\n got %q\nwant %q", cs.id, reader.Name, replay.text, want)
		}
		t.Logf("%s: %d tokens, longest pause %v, %d migrations", cs.id, maxTokens, cs.maxGap.Round(time.Millisecond), len(st.Migrations))
	}
}

// storedTokens sums the tokens of every delta stored for request id, over
// all its attempts, duplicates included, counts the deltas, and returns the
// start offset of each routed attempt.
func storedTokens(t *testing.T, js jetstream.JetStream, id string) (tokens, deltas int, starts []int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for e, err := range readLog(ctx, t, js, id) {
		if err != nil {
			t.Fatalf("read %s from the log: %v", id, err)
		}
		switch ev := e.Event.(type) {
		case events.TokensGenerated:
			if strings.HasPrefix(e.Source, "baton/frontend/") {
				continue // a compaction's carry of the answer, not a worker's delta
			}
			tokens += len(ev.Tokens)
			deltas++
		case events.RequestAccepted:
			if ev.Route != nil { // attempt 0 routed with the acceptance
				starts = append(starts, ev.Route.StartOffset)
			}
		case events.RequestRouted:
			starts = append(starts, ev.StartOffset)
		}
	}
	return tokens, deltas, starts
}

// postlessReplay reads a whole request from the log through fe's resume API.
func postlessReplay(t *testing.T, fe *frontend, id string) sseResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fe.url+"/v1/requests/"+id+"/stream?starting_after=0", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("replay %s: %v", id, err)
	}
	defer resp.Body.Close()
	return readStream(t, resp, nil)
}

// clusterPartitions is the request log's layout in the cluster test: one
// partition per node.
const clusterPartitions = 3

// TestClusterNodeLoss runs streams through a 3-node cluster with R3 streams
// and a request log of three partitions, whose leaders the first frontend
// spreads over the three nodes. Twice it kills (SIGKILL) the node leading one
// partition (a leader for that partition, a follower for the others),
// mid-stream, with a frontend connected to the killed node. In-flight streams
// of every partition pause at most for the election and complete with the
// fault-free text; the log, read through the other frontend, holds every
// acknowledged event.
func TestClusterNodeLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	t.Parallel() // waits on elections, with no timing bound of its own
	c := newCluster(t)
	s := &stack{t: t, dir: t.TempDir(), natsURL: c.urls(), workers: map[string]*proc{}, partitions: clusterPartitions}
	parts := streams.Partitions(clusterPartitions)
	// fe1 provisions the R3 streams with the full list. Migration is on, as
	// in any cluster deployment (compose runs with 3): on a loaded machine an
	// election can outlast a worker's lease (10 s), and a lease lost then is a
	// worker lost, whose requests must move on, not fail.
	//
	// The frontends keep every delta (--log-compaction=false), so that the
	// log's count of stored tokens can be checked; the last phase compacts
	// the requests by hand while a partition leader is killed.
	fe1 := s.frontend(nil, "--replicas", "3", "--migration-limit", "3", "--log-compaction=false")
	js := c.jetStream()
	checkLeadersSpread(t, c, js, parts)
	for i := 1; i <= 2; i++ {
		s.worker(fmt.Sprintf("w%d", i), "--replicas", "3", "--mock-tokens-per-sec", "150", "--mock-ttft", "10ms")
	}
	fe1.waitRoutable(t, "w1", "w2")
	var all []*clusterStream
	for k, phase := range []struct {
		name      string
		maxTokens int // at 150 tokens/s; the second outlasts its partition leader's election (~6 s)
	}{{"partition-0-leader", 300}, {"partition-1-leader", 1500}} {
		maxTokens := phase.maxTokens
		t.Run(phase.name, func(t *testing.T) {
			for j := range parts.Count() {
				c.streamInfo(js, parts.Stream(j))
			}
			info := c.streamInfo(js, parts.Stream(k))
			victim := c.node(info.Cluster.Leader)
			t.Logf("%s leader %s; killing it", parts.Stream(k), victim.name)
			// A frontend that knows only the victim: it must find the other
			// nodes through the cluster's gossip and carry on through one.
			saved := s.natsURL
			s.natsURL = victim.url
			fe := s.frontend(nil, "--replicas", "3", "--migration-limit", "3", "--log-compaction=false")
			s.natsURL = saved
			fe.waitRoutable(t, "w1", "w2")

			killed := time.Now()
			res := streamAll(t, fe, parts, phase.name, 4, maxTokens, 100, func() {
				victim.signal(syscall.SIGKILL)
				victim.wait(10 * time.Second)
				killed = time.Now()
			})
			t.Logf("streams ended %v after the kill", time.Since(killed).Round(time.Millisecond))
			// The kill must have moved the leadership: a partition still led
			// by the victim (or by nobody) means the fault did nothing.
			c.newLeader(js, parts.Stream(k), victim.name)
			checkClusterStreams(t, js, fe1, res, maxTokens)
			for _, cs := range res {
				all = append(all, cs)
				cs.maxTokens = maxTokens
			}

			// Bring the node back with its store, so the next phase has three.
			c.startNode(victim)
			c.streamInfo(js, parts.Stream(k))
		})
	}
	t.Run("compaction-through-leader-kill", func(t *testing.T) { compactThroughLeaderKill(t, c, s, js, fe1, parts, all) })
}

// compactThroughLeaderKill compacts the finished requests css by hand
// (baton compact, what an owner does at a request's end) while the leader
// of the last partition is killed: every compaction completes through the
// election, and every request reads the same afterwards, from its record.
func compactThroughLeaderKill(t *testing.T, c *cluster, s *stack, js jetstream.JetStream, reader *frontend, parts streams.Partitions, css []*clusterStream) {
	k := parts.Count() - 1
	info := c.streamInfo(js, parts.Stream(k))
	victim := c.node(info.Cluster.Leader)
	ids := make([]string, len(css))
	for i, cs := range css {
		ids[i] = cs.id
	}
	type result struct {
		out, errOut string
		code        int
	}
	done := make(chan result, 1)
	go func() {
		out, errOut, code := runTool(t, batonBin, append([]string{"compact", "--nats", s.natsURL}, ids...)...)
		done <- result{out, errOut, code}
	}()
	victim.signal(syscall.SIGKILL)
	victim.wait(10 * time.Second)
	r := <-done
	c.newLeader(js, parts.Stream(k), victim.name)
	if r.code != 0 {
		t.Fatalf("baton compact through a leader kill: exit %d\n%s%s", r.code, r.out, r.errOut)
	}
	for _, cs := range css {
		if stored, deltas, _ := storedTokens(t, js, cs.id); deltas != 0 {
			t.Errorf("%s: %d deltas (%d tokens) left after compaction", cs.id, deltas, stored)
		}
		want := engine.MockText(cs.prompt, 0, cs.maxTokens)
		if replay := postlessReplay(t, reader, cs.id); !replay.done || replay.text != want {
			t.Errorf("%s: after compaction, the resume from the log differs:\n got %q\nwant %q", cs.id, replay.text, want)
		}
		if st := reader.state(t, cs.id); st.Status != "completed" || st.TokensGenerated != cs.maxTokens {
			t.Errorf("%s: after compaction, status %q with %d tokens, want completed with %d", cs.id, st.Status, st.TokensGenerated, cs.maxTokens)
		}
	}
	c.startNode(victim)
}

// checkLeadersSpread checks that the request partitions, created by the
// first frontend, have their leaders on different nodes, and logs them.
func checkLeadersSpread(t *testing.T, c *cluster, js jetstream.JetStream, parts streams.Partitions) {
	t.Helper()
	led := map[string]string{}
	for k := range parts.Count() {
		info := c.streamInfo(js, parts.Stream(k))
		t.Logf("%s: leader %s, subjects %v", parts.Stream(k), info.Cluster.Leader, info.Config.Subjects[:2])
		if prev, ok := led[info.Cluster.Leader]; ok {
			t.Errorf("%s and %s are both led by %s; want the leaders on different nodes", prev, parts.Stream(k), info.Cluster.Leader)
		}
		led[info.Cluster.Leader] = parts.Stream(k)
	}
}

// TestNATSAuthentication runs a frontend and a worker against a `baton nats`
// that admits only one user: with --nats-user/--nats-password (the worker
// through NATS_USER/NATS_PASSWORD) they serve a stream; anonymous clients are
// refused.
func TestNATSAuthentication(t *testing.T) {
	dir := t.TempDir()
	port := freePort(t)
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	start(t, "nats", nil, "nats", "--port", strconv.Itoa(port), "--store-dir", filepath.Join(dir, "nats"),
		"--user", "svc", "--password", "s3cret")
	waitFor(t, 20*time.Second, "nats to listen", func() bool {
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	if nc, err := nats.Connect(url); err == nil {
		nc.Close()
		t.Fatal("anonymous client connected to a server that requires a user")
	}
	s := &stack{t: t, dir: dir, natsURL: url, workers: map[string]*proc{}}
	fe := s.frontend(nil, "--nats-user", "svc", "--nats-password", "s3cret")
	s.workerEnv = []string{"NATS_USER=svc", "NATS_PASSWORD=s3cret"}
	s.worker("w1", "--mock-ttft", "10ms")
	fe.waitRoutable(t, "w1")
	res := postStream(t, fe.url, "/v1/completions", completion("secured stream", 20), nil, nil)
	if want := engine.MockText("secured stream", 0, 20); !res.done || res.text != want {
		t.Fatalf("got %q (done %v, error %q), want %q", res.text, res.done, res.errorBody, want)
	}
}

// recipeBlocks returns the shell blocks of docs/deployment.md's section
// "A 3-node cluster with `baton nats`", continuation lines joined.
func recipeBlocks(t *testing.T) [][]string {
	t.Helper()
	doc, err := os.ReadFile("../docs/deployment.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(doc)
	start := strings.Index(s, "## A 3-node cluster with `baton nats`")
	end := strings.Index(s, "### Provisioning")
	if start < 0 || end < start {
		t.Fatal("docs/deployment.md has no cluster recipe section")
	}
	var blocks [][]string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(s[start:end], -1) {
		blocks = append(blocks, strings.Split(strings.TrimSpace(strings.ReplaceAll(m[1], "\\\n", " ")), "\n"))
	}
	if len(blocks) != 4 {
		t.Fatalf("the cluster recipe has %d shell blocks, want 4 (nodes, components, worker users, route certificates)", len(blocks))
	}
	return blocks
}

// TestClusterRecipe runs docs/deployment.md's cluster recipe as written, on
// 127.0.0.1-3 instead of 10.0.0.1-3 and in a temporary directory instead
// of /etc/baton and /var/lib/baton: the route certificates (openssl), the
// worker users file, three `baton nats` nodes with route authentication,
// route TLS and --worker-users, a frontend with API keys and TLS, and
// workers w1-w3 each as its own user. A request is answered over HTTPS, the
// streams are R3, and w1's credential cannot purge the log.
func TestClusterRecipe(t *testing.T) {
	t.Parallel() // no timing bound; its fixed ports (4222, 6222 on 127.0.0.1-3) are no other test's
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatalf("openssl: %v (the recipe makes its certificates with it)", err)
	}
	blocks := recipeBlocks(t)
	nodes, components, users, certs := blocks[0], blocks[1], blocks[2], blocks[3]
	dir := t.TempDir()
	etc := filepath.Join(dir, "etc")
	if err := os.MkdirAll(etc, 0o700); err != nil {
		t.Fatal(err)
	}
	local := func(line string) string {
		line = strings.ReplaceAll(line, "/etc/baton", etc)
		line = strings.ReplaceAll(line, "/var/lib/baton", filepath.Join(dir, "lib"))
		return regexp.MustCompile(`10\.0\.0\.(\d|\$n)`).ReplaceAllString(line, "127.0.0.$1")
	}
	env := []string{"PATH=" + filepath.Dir(batonBin) + ":" + os.Getenv("PATH")}
	bash := func(what, script string) {
		t.Helper()
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
		cmd.Dir, cmd.Env = etc, append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s\n%s", what, err, script, out)
		}
	}

	// The secrets the recipe reads, and the API's key and certificate.
	for name, value := range map[string]string{"sys-password": "sys-secret-0123456789", "route-password": "route-secret-0123456789",
		"client-password": "client-secret-0123456789", "api-keys": "alice sk-alice-0123456789\n"} {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(value), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	bash("the API's certificate", `openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=127.0.0.1 `+
		`-addext subjectAltName=IP:127.0.0.1 -keyout api.key -out api.pem 2>/dev/null`)
	bash("the route certificates", local(strings.Join(certs, "\n")))
	var usersLines []string
	for _, line := range users {
		if !strings.HasPrefix(line, "baton ") { // the last line points at the node commands
			usersLines = append(usersLines, local(line))
		}
	}
	bash("the worker users", strings.Join(usersLines, "\n"))

	// Three nodes, each the first block with its own name, address and
	// files, and --worker-users as the third block says.
	var nodeScript []string
	for _, line := range nodes {
		if strings.HasPrefix(line, "baton nats ") {
			line, _, _ = strings.Cut(line, " #") // "and n2, n3 likewise"
			line = "exec " + line + " --worker-users " + filepath.Join(etc, "worker-users")
		}
		nodeScript = append(nodeScript, line)
	}
	for n := 1; n <= 3; n++ {
		script := local(strings.Join(nodeScript, "\n"))
		script = strings.ReplaceAll(script, "--host 0.0.0.0", "--host 127.0.0."+strconv.Itoa(n))
		script = regexp.MustCompile(`\bn1\b`).ReplaceAllString(script, "n"+strconv.Itoa(n))
		script = strings.ReplaceAll(script, "--store-dir "+filepath.Join(dir, "lib", "nats"), "--store-dir "+filepath.Join(dir, "lib", "nats-n"+strconv.Itoa(n)))
		startBin(t, "bash", "nats-n"+strconv.Itoa(n), env, "-c", script)
	}
	client := nats.UserInfo("baton", "client-secret-0123456789")
	natsURL := "nats://127.0.0.1:4222,nats://127.0.0.2:4222,nats://127.0.0.3:4222"
	waitFor(t, 60*time.Second, "the three nodes to form a JetStream cluster", func() bool {
		nc, err := nats.Connect(natsURL, client)
		if err != nil {
			return false
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err == nil
	})

	// The components: the second block, the frontend on a free port, the
	// worker line for w1, w2 and w3.
	var export, frontendLine, workerLine string
	for _, line := range components {
		switch {
		case strings.HasPrefix(line, "export "):
			export = line
		case strings.Contains(line, " baton frontend "):
			frontendLine = line
		case strings.Contains(line, " baton worker "):
			workerLine = line
		}
	}
	if export == "" || frontendLine == "" || workerLine == "" {
		t.Fatalf("the recipe's components block: %q", components)
	}
	port := freePort(t)
	fe := local(export + "\n" + strings.Replace(frontendLine, " baton frontend ", " exec baton frontend --http-port "+strconv.Itoa(port)+" ", 1))
	startBin(t, "bash", "frontend", env, "-c", fe)
	for _, w := range []string{"w1", "w2", "w3"} {
		line := strings.Replace(workerLine, " baton worker ", " exec baton worker ", 1)
		line = regexp.MustCompile(`\bw1\b`).ReplaceAllString(line, w)
		startBin(t, "bash", "worker-"+w, env, "-c", local(export+"\n"+line))
	}

	pem, err := os.ReadFile(filepath.Join(etc, "api.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	api := "https://127.0.0.1:" + strconv.Itoa(port)
	do := func(method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, api+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer sk-alice-0123456789")
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitFor(t, 60*time.Second, "w1, w2 and w3 ready behind the frontend", func() bool {
		code, body := do("GET", "/v1/workers", "")
		return code == 200 && strings.Count(body, `"state":"ready"`) == 3
	})
	code, body := do("POST", "/v1/completions", `{"model":"mock","prompt":"the recipe","max_tokens":8}`)
	var out struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &out) != nil || len(out.Choices) != 1 || len(strings.Fields(out.Choices[0].Text)) != 8 {
		t.Fatalf("a completion through the recipe's cluster: %d %s", code, body)
	}

	// R3, as --replicas 3 asked; and w1 is confined.
	js := natstest.JetStream(t, natsURL, client)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, streams.RequestsStream)
	if err != nil {
		t.Fatal(err)
	}
	if r := st.CachedInfo().Config.Replicas; r != 3 {
		t.Errorf("%s has %d replicas, want 3", streams.RequestsStream, r)
	}
	wpass, err := exec.Command("awk", `$1 == "w1" {print $2}`, filepath.Join(etc, "worker-users")).Output()
	if err != nil {
		t.Fatal(err)
	}
	wc, err := nats.Connect(natsURL, nats.UserInfo("w1", strings.TrimSpace(string(wpass))), nats.CustomInboxPrefix(streams.WorkerInboxPrefix("w1")), nats.ErrorHandler(expectViolations))
	if err != nil {
		t.Fatalf("w1's credential from the worker users file: %v", err)
	}
	defer wc.Close()
	if _, err := wc.Request("$JS.API.STREAM.PURGE."+streams.RequestsStream, nil, 2*time.Second); err == nil {
		t.Error("w1's credential purged the request log")
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs == 0 {
		t.Errorf("the request log after w1's purge attempt: %v, %+v", err, info)
	}
}
