package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/natsserver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

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
	for _, subj := range []string{"$KV.baton_leases.w2", "$KV.baton_load.w2", "baton.dispatch.w2"} {
		if !c.violated("w1", subj) {
			t.Errorf("no permissions violation of w1 logged for %s", subj)
		}
	}
}
