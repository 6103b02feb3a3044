package integration

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

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
	nc, _ := c.connectAs("w1")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
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
	nc, err := nats.Connect(c.natsURL, nats.UserInfo("frontend", "frontend-password-0123"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
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
