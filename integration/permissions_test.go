package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/services/natsserver"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The NATS permissions of each component: the documented least-privilege
// sets, per-worker users (`baton nats --worker-users`), and provisioning
// that a worker's credential cannot hijack.

// permissionBlocks reads the least-privilege permission sets for frontends
// and workers from docs/deployment.md, so that the documented sets are the
// ones tested.
func permissionBlocks(t *testing.T) (frontendPerms, workerPerms string) {
	t.Helper()
	doc, err := os.ReadFile("../docs/deployment.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)### Least-privilege permissions.*?```\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/deployment.md has no permission block")
	}
	block := string(m[1])
	parts := regexp.MustCompile(`(?m)^# (frontend|worker)$`).Split(block, -1)
	if len(parts) != 3 || strings.TrimSpace(parts[0]) != "" {
		t.Fatalf("permission block is not '# frontend ... # worker ...': %s", block)
	}
	return parts[1], parts[2]
}

// violations collects the server's permission-violation log lines.
type violations struct {
	mu    sync.Mutex
	lines []string
}

func (v *violations) log(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	if strings.Contains(line, "Violation") {
		v.mu.Lock()
		v.lines = append(v.lines, line)
		v.mu.Unlock()
	}
}
func (v *violations) Noticef(f string, a ...any) { v.log(f, a...) }
func (v *violations) Warnf(f string, a ...any)   { v.log(f, a...) }
func (v *violations) Fatalf(f string, a ...any)  { v.log(f, a...) }
func (v *violations) Errorf(f string, a ...any)  { v.log(f, a...) }
func (v *violations) Debugf(f string, a ...any)  { v.log(f, a...) }
func (v *violations) Tracef(f string, a ...any)  { v.log(f, a...) }

func (v *violations) all() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.lines...)
}

// TestLeastPrivilegePermissions runs a frontend and two workers as users
// holding exactly the permission sets of docs/deployment.md, on a server that
// enforces them: a stream, a migration after a worker is killed, a resume and
// a cancel all work, and the server logs no permission violation. It runs
// with one request stream, and with three partitions and the sets expanded
// as the docs say (natsserver.ForPartitions).
func TestLeastPrivilegePermissions(t *testing.T) {
	t.Parallel()
	for _, partitions := range []int{1, 3} {
		t.Run(fmt.Sprintf("partitions=%d", partitions), func(t *testing.T) { leastPrivilege(t, partitions) })
	}
}

// permissionServer starts a server on which the users frontend (password
// fpw) and worker (wpw) hold exactly the permission sets of
// docs/deployment.md, expanded for partitions, and sys is the system
// account's; it returns its URL, port, and the violations it logs.
func permissionServer(t *testing.T, partitions int) (string, int, *violations) {
	fePerms, wkPerms := permissionBlocks(t)
	fePerms, wkPerms = natsserver.ForPartitions(fePerms, partitions), natsserver.ForPartitions(wkPerms, partitions)
	port := freePort(t)
	conf := fmt.Sprintf(`
listen: 127.0.0.1:%d
server_name: perms
jetstream { store_dir: %q }
accounts {
  BATON {
    jetstream: enabled
    users: [
      {user: frontend, password: fpw, permissions: {
%s
}}
      {user: worker, password: wpw, permissions: {
%s
allow_responses: true
}}
    ]
  }
  SYS { users: [{user: sys, password: spw}] }
}
system_account: SYS
`, port, t.TempDir(), fePerms, wkPerms)
	opts := &server.Options{}
	if err := opts.ProcessConfigString(conf); err != nil {
		t.Fatalf("server config from the documented permissions: %v\n%s", err, conf)
	}
	opts.NoSigs = true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	v := &violations{}
	srv.SetLoggerV2(v, false, false, false)
	go srv.Start()
	if !srv.ReadyForConnections(20 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(srv.Shutdown)
	return fmt.Sprintf("nats://127.0.0.1:%d", port), port, v
}

func leastPrivilege(t *testing.T, partitions int) {
	url, port, v := permissionServer(t, partitions)
	s := &stack{t: t, dir: t.TempDir(), natsURL: url, workers: map[string]*proc{}, partitions: partitions}
	sys := fmt.Sprintf("nats://sys:spw@127.0.0.1:%d", port)
	// --tenant-rpm: the budgets bucket is read, written and watched (a
	// budget too large to refuse anything) under the documented grants.
	f1 := s.frontend(nil, "--nats-user", "frontend", "--nats-password", "fpw", "--nats-system-url", sys, "--migration-limit", "3", "--tenant-rpm", "1000000")
	f2 := s.frontend(nil, "--nats-user", "frontend", "--nats-password", "fpw", "--nats-system-url", sys, "--migration-limit", "3", "--tenant-rpm", "1000000")
	s.workerEnv = []string{"NATS_USER=worker", "NATS_PASSWORD=wpw"}
	s.worker("w1", "--mock-tokens-per-sec", "150", "--mock-ttft", "10ms")
	s.worker("w2", "--mock-tokens-per-sec", "150", "--mock-ttft", "10ms")
	f1.waitRoutable(t, "w1", "w2")

	// A migration (the serving worker is killed), then a frontend crash and a
	// resume on the other one.
	prompt := "least privilege"
	var once, once2 sync.Once
	first := postStream(t, f1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 120},
		map[string]string{"X-Request-Id": "perm-1", "X-Resumable": "true"}, func(e sseEvent) {
			n := 0
			fmt.Sscan(e.id, &n)
			if n >= 20 {
				once.Do(func() { s.workers[f1.servingWorker(t, "perm-1")].signal(syscall.SIGKILL) })
			}
			if n >= 60 {
				once2.Do(func() { f1.signal(syscall.SIGKILL) })
			}
		})
	rest := resume(t, f2, "perm-1", lastID(first))
	joined(t, first, rest, prompt, 120)
	if st := f2.state(t, "perm-1"); len(st.Migrations) != 1 {
		t.Errorf("migrations = %+v, want one", st.Migrations)
	}
	// A cancel, through the remaining frontend.
	go func() {
		waitFor(t, 10*time.Second, "perm-2 to run", func() bool {
			resp, err := http.Get(f2.url + "/v1/requests/perm-2")
			if err != nil {
				return false
			}
			var st requestState
			_ = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			return resp.StatusCode == 200 && st.TokensGenerated > 5
		})
		cancelRequest(t, f2, "perm-2", "kill")
	}()
	killed := postStream(t, f2.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "cancel me", "max_tokens": 2000},
		map[string]string{"X-Request-Id": "perm-2"}, nil)
	if killed.done || !strings.Contains(killed.errorBody, "cancel") {
		t.Errorf("killed stream: done=%v error=%q", killed.done, killed.errorBody)
	}
	// A worker's graceful shutdown (its lease, load and watchers end) under the set.
	for id, p := range s.workers {
		if !p.Exited() {
			p.signal(syscall.SIGTERM)
			if code := p.wait(30 * time.Second); code != 0 {
				t.Errorf("worker %s exited %d after SIGTERM", id, code)
			}
		}
	}
	if vs := v.all(); len(vs) > 0 {
		t.Errorf("the server logged %d permission violations with the documented sets:\n%s", len(vs), strings.Join(vs, "\n"))
	}
}

// TestBatchedOutputPermissions: with --batched-output, a frontend and a
// worker holding the documented sets ask for, create and list the worker's
// output stream (the lease says writes_batched), the worker stores its
// batches there, a stream is served as before, and a frontend's credential
// deletes a worker's output stream but none of baton's own streams.
func TestBatchedOutputPermissions(t *testing.T) {
	t.Parallel()
	url, _, v := permissionServer(t, 1)
	s := &stack{t: t, dir: t.TempDir(), natsURL: url, workers: map[string]*proc{}}
	f := s.frontend(nil, "--nats-user", "frontend", "--nats-password", "fpw", "--batched-output")
	s.workerEnv = []string{"NATS_USER=worker", "NATS_PASSWORD=wpw"}
	s.worker("w1", "--batched-output", "--mock-tokens-per-sec", "200", "--mock-ttft", "5ms")
	f.waitRoutable(t, "w1")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fe := natstest.JetStream(t, url, nats.UserInfo("frontend", "fpw"), nats.ErrorHandler(expectViolations))
	leases, err := fe.KeyValue(ctx, streams.LeasesBucket)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "w1's lease to say writes_batched", func() bool {
		e, err := leases.Get(ctx, "w1")
		return err == nil && strings.Contains(string(e.Value()), `"writes_batched":true`)
	})
	list, err := streams.WorkerOutputs(ctx, fe)
	if err != nil || len(list) != 1 || list[0].Worker != "w1" {
		t.Fatalf("the worker output streams: %+v, %v; want w1's", list, err)
	}
	res := postStream(t, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "batched perms", "max_tokens": 20}, nil, nil)
	checkComplete(t, res, "batched perms", 20)

	wk := natstest.Connect(t, url, nats.UserInfo("worker", "wpw"), nats.CustomInboxPrefix(streams.WorkerInboxPrefix("w1")))
	wjs, err := jetstream.New(wk)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wjs.Publish(ctx, streams.WorkerOutput("w1", "frontend-1"), []byte("a batch")); err != nil {
		t.Errorf("the worker's batch: %v", err)
	}
	if vs := v.all(); len(vs) > 0 {
		t.Fatalf("the server logged %d permission violations with the documented sets:\n%s", len(vs), strings.Join(vs, "\n"))
	}

	if err := streams.DeleteWorkerOutput(ctx, fe, "w1"); err != nil {
		t.Errorf("the frontend's credential deletes a worker's output stream: %v", err)
	}
	dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
	defer dcancel()
	if err := fe.DeleteStream(dctx, streams.RequestsStream); err == nil {
		t.Error("the frontend's credential deleted the request log")
	}
	if _, err := fe.Stream(ctx, streams.RequestsStream); err != nil {
		t.Errorf("the request log: %v", err)
	}
}

// TestWorkerPermissionsDocumented: the worker permission set that
// `baton nats --worker-users` pins per worker is the one docs/deployment.md
// documents (and TestLeastPrivilegePermissions runs).
func TestWorkerPermissionsDocumented(t *testing.T) {
	_, doc := permissionBlocks(t)
	if strings.TrimSpace(doc) != strings.TrimSpace(natsserver.WorkerPermissions) {
		t.Errorf("natsserver.WorkerPermissions differs from docs/deployment.md:\n%s\n----\n%s", natsserver.WorkerPermissions, doc)
	}
}

// TestWorkerUsersConfined: with `baton nats --worker-users`, each worker
// logs in as its own user, pinned to its own lease and load keys, lifecycle
// subject and dispatch subject. Formerly a worker credential could delete
// another worker's lease, put a lease under its id (locking it out) and
// read its dispatches; now each is a permissions violation and the victim
// keeps serving.
func TestWorkerUsersConfined(t *testing.T) {
	t.Parallel()
	c := confinedStack(t, "w1", "w2")
	f := c.frontend(nil, c.auth...)
	for _, id := range []string{"w1", "w2"} {
		c.worker(id, "--mock-tokens-per-sec", "200", "--mock-ttft", "5ms")
	}
	f.waitRoutable(t, "w1", "w2")
	pinned := func(prompt string) {
		t.Helper()
		res := postStream(t, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 20},
			map[string]string{"X-Worker-Id": "w2"}, nil)
		checkComplete(t, res, prompt, 20)
	}
	pinned("before the attacks")
	if strings.Contains(c.ns.output(), "Violation") {
		t.Fatalf("the workers' own work was refused:\n%s", c.ns.output())
	}

	// w1's credential, used against w2.
	w1, asyncErrs := c.connectAs("w1")
	js, _ := jetstream.New(w1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	leases, err := js.KeyValue(ctx, "baton_leases")
	if err != nil {
		t.Fatal(err)
	}
	before, err := leases.Get(ctx, "w2")
	if err != nil {
		t.Fatalf("w2's lease: %v", err)
	}
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 2*time.Second) }
	c1, done1 := short()
	if err := leases.Delete(c1, "w2"); err == nil {
		t.Error("w1 deleted w2's lease")
	}
	done1()
	c2, done2 := short()
	if _, err := leases.Put(c2, "w2", []byte(`{"worker_id":"w2","lease_id":"squatted"}`)); err == nil {
		t.Error("w1 put a lease under w2's id")
	}
	done2()
	load, err := js.KeyValue(ctx, "baton_load")
	if err != nil {
		t.Fatal(err)
	}
	c3, done3 := short()
	if _, err := load.Put(c3, "w2", []byte(`{}`)); err == nil {
		t.Error("w1 wrote w2's load")
	}
	done3()
	// Nor w2's output subjects, nor its ask for an output stream.
	if err := w1.Publish(streams.WorkerOutput("w2", "fe"), []byte("junk")); err != nil {
		t.Fatal(err)
	}
	if err := w1.Publish(streams.OutputsSubject("w2"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := w1.Subscribe("baton.dispatch.w2", func(*nats.Msg) { t.Error("w1 received a dispatch of w2") }); err != nil {
		t.Fatal(err)
	}
	_ = w1.Flush()
	waitFor(t, 10*time.Second, "the server to refuse w1's subscription to w2's dispatches", func() bool {
		asyncErrs.mu.Lock()
		defer asyncErrs.mu.Unlock()
		for _, e := range asyncErrs.errs {
			if strings.Contains(e, "baton.dispatch.w2") {
				return true
			}
		}
		return false
	})

	// The victim is intact: same lease, still routable, still serving.
	after, err := leases.Get(ctx, "w2")
	if err != nil || after.Revision() < before.Revision() || strings.Contains(string(after.Value()), "squatted") {
		t.Errorf("w2's lease after the attacks: %v %v", after, err)
	}
	f.waitRoutable(t, "w1", "w2")
	pinned("after the attacks")
	c.expectViolation("w1", streams.WorkerOutput("w2", "fe"))
	c.expectViolation("w1", streams.OutputsSubject("w2"))
	for _, subj := range []string{"$KV.baton_leases.w2", "$KV.baton_load.w2", "baton.dispatch.w2"} {
		if !c.violated("w1", subj) {
			t.Errorf("no permissions violation of w1 logged for %s", subj)
		}
	}
}

// TestProvisioningCannotBeHijacked: on an empty server (a new deployment,
// a rebuilt store) w1's credential formerly created KV_baton_frontends with
// the extra subject baton.live.requests.>, the frontends accepted the bucket
// as it was, and every prompt and token reached w1. Now a worker credential
// may create no stream (a permissions violation), a worker waits for the
// log to be provisioned and says so, and a stream or bucket that differs
// from a component's definition (here created with the frontend's
// credential, as an operator's mistake would) makes the frontend and the
// worker exit 2 naming the difference, until the operator removes it and
// `baton provision` creates the log.
func TestProvisioningCannotBeHijacked(t *testing.T) {
	t.Parallel()
	c := confinedStack(t, "w1")
	js := c.jetStreamAs("w1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	capture := streams.Config{}.Definitions(1)[4] // KV_baton_frontends, as baton defines it
	if capture.Name != "KV_"+streams.FrontendsBucket {
		t.Fatalf("definition 4 is %s", capture.Name)
	}
	capture.Subjects = append(capture.Subjects, "baton.live.requests.>")
	cctx, ccancel := context.WithTimeout(ctx, time.Second)
	if _, err := js.CreateStream(cctx, capture); err == nil {
		t.Error("w1 created KV_baton_frontends capturing every request's live subjects")
	}
	ccancel()
	c.expectViolation("w1", "$JS.API.STREAM.CREATE.KV_baton_frontends")

	// A worker on the empty server creates nothing and waits.
	c.worker("w1", "--mock-ttft", "5ms")
	waitFor(t, 20*time.Second, "w1 to say it waits for the log", func() bool {
		return strings.Contains(c.workers["w1"].output(), "waiting for the log to be provisioned")
	})
	fe := c.operator(t)
	if names := streamNamesOf(t, fe); len(names) != 0 {
		t.Fatalf("streams %v exist, want none: a worker created them", names)
	}

	// The capturing bucket, created with a credential that may: refused by
	// the frontend, then by the waiting worker, each naming the field.
	if _, err := fe.CreateStream(ctx, capture); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	f := start(t, "frontend-refused", nil, append([]string{"frontend", "--nats", c.natsURL, "--http-port", strconv.Itoa(port)}, c.auth...)...)
	if code := f.wait(30 * time.Second); code != 2 || !strings.Contains(f.output(), "KV_baton_frontends subjects: the server has [$KV.baton_frontends.> baton.live.requests.>]") {
		t.Errorf("frontend on a capturing bucket: exit %d, want 2 naming the subjects:\n%s", code, f.output())
	}
	if code := c.workers["w1"].wait(30 * time.Second); code != 2 || !strings.Contains(c.workers["w1"].output(), "KV_baton_frontends subjects") {
		t.Errorf("worker on a capturing bucket: exit %d, want 2 naming the subjects", code)
	}

	// The remedy the message names: remove it, provision, start again.
	if err := fe.DeleteStream(ctx, capture.Name); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runTool(t, batonBin, append([]string{"provision", "--nats", c.natsURL}, c.auth...)...)
	if code != 0 || !strings.Contains(out, "provisioned and verified") {
		t.Fatalf("baton provision: exit %d\n%s\n%s", code, out, errOut)
	}
	front := c.frontend(nil, c.auth...)
	c.worker("w1", "--mock-ttft", "5ms")
	front.waitRoutable(t, "w1")
	res := postStream(t, front.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "after the remedy", "max_tokens": 5}, nil, nil)
	checkComplete(t, res, "after the remedy", 5)

	// Components whose flags differ from the log's: a clear refusal, and
	// `baton provision --update` changes the log.
	big := []string{"--stream-max-bytes", "2000000000"}
	port = freePort(t)
	f = start(t, "frontend-bigger", nil, append(append([]string{"frontend", "--nats", c.natsURL, "--http-port", strconv.Itoa(port)}, big...), c.auth...)...)
	if code := f.wait(30 * time.Second); code != 2 || !strings.Contains(f.output(), "BATON_REQUESTS max_bytes: the server has 1073741824, this component 2000000000") ||
		!strings.Contains(f.output(), "baton provision --update") {
		t.Errorf("frontend with another --stream-max-bytes: exit %d, want 2 naming max_bytes and the remedy:\n%s", code, f.output())
	}
	out, errOut, code = runTool(t, batonBin, append(append([]string{"provision", "--update", "--nats", c.natsURL}, big...), c.auth...)...)
	if code != 0 || !strings.Contains(out, "updated BATON_REQUESTS: max_bytes") {
		t.Fatalf("baton provision --update: exit %d\n%s\n%s", code, out, errOut)
	}
	c.frontend(nil, append(big, c.auth...)...).waitRoutable(t, "w1")
}

// operator connects with the frontend's credential, which may provision.
func (c *confined) operator(t *testing.T) jetstream.JetStream {
	t.Helper()
	return natstest.JetStream(t, c.natsURL, nats.UserInfo("frontend", "frontend-password-0123"))
}

func streamNamesOf(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []string
	l := js.StreamNames(ctx)
	for n := range l.Name() {
		out = append(out, n)
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
