package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/streams"
)

// runTool runs a short-lived command to completion and returns its stdout,
// stderr and exit code.
func runTool(t testing.TB, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("%s %v: %v", filepath.Base(bin), args, err)
	}
	return out.String(), errb.String(), code
}

// natsCLI finds the natscli binary (scripts/test installs it). Under CI a
// missing binary is a failure; elsewhere the check is skipped with a hint.
func natsCLI(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("nats"); err == nil {
		return p
	}
	if gopath, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(gopath)), "bin", "nats")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("natscli not installed: scripts/test installs it with go install github.com/nats-io/natscli/nats@v0.5.0")
	}
	t.Skip("natscli not installed: go install github.com/nats-io/natscli/nats@v0.5.0 (scripts/test does)")
	return ""
}

// TestReplayMigratedAndResumed: a request migrates (its worker is killed),
// then its frontend is killed and the client resumes on the other frontend.
// `baton replay` rebuilds both facts and the exact output from the log alone;
// `baton events` and the nats CLI show the same events. The workers hold the
// request at token 100 until frontend-2 has taken it over (it had 0.9 s to
// do so, a thin margin on a loaded machine: a request that ends first is
// not taken over).
func TestReplayMigratedAndResumed(t *testing.T) {
	s, f1, f2 := twoFrontendsWorkers(t, []string{"--mock-hold-at-token", "100"})
	const id, maxTokens = "replayed", 150
	prompt := "replay a request that migrated and resumed"
	var killWorker, killFrontend sync.Once
	killed := ""
	first := postStream(t, f1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": maxTokens},
		map[string]string{"X-Request-Id": id, "X-Resumable": "true"}, func(e sseEvent) {
			n, _ := strconv.Atoi(e.id)
			if n >= 20 {
				killWorker.Do(func() {
					killed = f1.servingWorker(t, id)
					s.workers[killed].signal(syscall.SIGKILL)
				})
			}
			if n >= 60 {
				killFrontend.Do(func() { f1.signal(syscall.SIGKILL) })
			}
		})
	survivor := map[string]string{"w1": "w2", "w2": "w1"}[killed]
	if survivor == "" {
		t.Fatalf("killed worker %q, want w1 or w2", killed)
	}
	releaseWhenOwned(f2, id, "frontend-2", s.workers[survivor].pid())
	rest := resume(t, f2, id, lastID(first))
	joined(t, first, rest, prompt, maxTokens)
	want := engine.MockText(prompt, 0, maxTokens)

	// The text timeline.
	out, errOut, code := runTool(t, batonBin, "replay", id, "--nats", s.natsURL)
	if code != 0 {
		t.Fatalf("baton replay: exit %d: %s", code, errOut)
	}
	var migrated, attached bool
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		switch f[3] {
		case "migrated":
			migrated = migrated || strings.Contains(line, "ongoing_request")
		case "attached":
			attached = attached || strings.Contains(line, "attached to frontend frontend-2")
		}
	}
	if !migrated || !attached {
		t.Errorf("replay shows migrated=%v (ongoing_request) attached=%v (frontend-2), want both:\n%s", migrated, attached, out)
	}
	_, text, ok := strings.Cut(out, "output ("+strconv.Itoa(maxTokens)+" tokens):\n")
	if !ok || text != want+"\n" {
		t.Errorf("replay output:\n got %q\nwant %q", text, want+"\n")
	}

	// The JSON document.
	out, errOut, code = runTool(t, batonBin, "replay", "--json", "--nats", s.natsURL, id)
	if code != 0 {
		t.Fatalf("baton replay --json: exit %d: %s", code, errOut)
	}
	var doc struct {
		Stream  string `json:"stream"`
		Request struct {
			Status     string `json:"status"`
			Owner      string `json:"owner"`
			Migrations []struct {
				MigrationType string `json:"migration_type"`
			} `json:"migrations"`
		} `json:"request"`
		Timeline []struct {
			Seq  uint64 `json:"seq"`
			Type string `json:"type"`
		} `json:"timeline"`
		Output string `json:"output"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("baton replay --json: %v\n%s", err, out)
	}
	if doc.Output != want {
		t.Errorf("replay --json output:\n got %q\nwant %q", doc.Output, want)
	}
	// The request's partition, as the docs find it for the nats CLI.
	if wantStream := streams.Partitions(testPartitions).StreamOf(id); doc.Stream != wantStream {
		t.Errorf("replay --json stream %q, want %q", doc.Stream, wantStream)
	}
	if doc.Request.Status != "completed" || doc.Request.Owner != "frontend-2" ||
		len(doc.Request.Migrations) != 1 || doc.Request.Migrations[0].MigrationType != "ongoing_request" {
		t.Errorf("replay --json request = %+v", doc.Request)
	}

	// baton events lists every stored event of the request, in order.
	out, errOut, code = runTool(t, batonBin, "events", "--request", id, "--nats", s.natsURL)
	if code != 0 {
		t.Fatalf("baton events: exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != len(doc.Timeline) {
		t.Errorf("baton events --request: %d lines, replay timeline: %d events", len(lines), len(doc.Timeline))
	}
	for i, line := range lines {
		if i < len(doc.Timeline) && !strings.Contains(line, " "+strconv.FormatUint(doc.Timeline[i].Seq, 10)+" ") ||
			i < len(doc.Timeline) && !strings.Contains(line, doc.Timeline[i].Type) {
			t.Errorf("events line %d %q, want seq %d type %s", i, line, doc.Timeline[i].Seq, doc.Timeline[i].Type)
			break
		}
	}

	// An unknown id.
	_, errOut, code = runTool(t, batonBin, "replay", "no-such-request", "--nats", s.natsURL)
	if code != 1 || !strings.Contains(errOut, "request no-such-request not found in the log (never accepted, or past retention)") {
		t.Errorf("unknown id: exit %d, stderr %q", code, errOut)
	}

	// The nats CLI shows the same messages with readable ce-type headers.
	nats := natsCLI(t)
	out, errOut, code = runTool(t, nats, "--server", s.natsURL, "sub", streams.RequestAll(id),
		"--stream", doc.Stream, "--all", "--terminate-at-end", "--headers-only")
	if code != 0 || !strings.Contains(out, "ce-type: baton.request.accepted.v1") || !strings.Contains(out, "ce-type: baton.request.migrated.v1") {
		t.Errorf("nats sub --stream: exit %d, stderr %q, stdout:\n%s", code, errOut, out)
	}
	// nats stream view (v0.5.0) pages interactively and insists on a
	// terminal: run it under script(1); the events subject fits one page.
	script, err := exec.LookPath("script")
	if err != nil {
		t.Log("script(1) not installed: skipping nats stream view")
		return
	}
	view := nats + " --server " + s.natsURL + " stream view " + doc.Stream + " 25 --subject " + streams.RequestEvents(id)
	out, errOut, code = runTool(t, script, "-qec", view, "/dev/null")
	if code != 0 || !strings.Contains(out, "ce-type: baton.request.accepted.v1") || !strings.Contains(out, "ce-type: baton.request.attached.v1") {
		t.Errorf("nats stream view: exit %d, stderr %q, stdout:\n%s", code, errOut, out)
	}
}
