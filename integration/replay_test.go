package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
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

// TestReplayRendersWhatTheClientGot: `baton replay --json` of a response of
// the Responses API shows the response object its client got, and of a chat
// its chat completion, each equal to what the HTTP API answered, before and
// after the request's compaction (the record and the carry for older
// readers, which the text timeline labels as such). Formerly a response's
// replay showed a text_completion named cmpl-….
//
// No field is ignored: the frontend and the replay render the same fold of
// the same events with one renderer (openai.Response), so even the times
// (created, created_at, completed_at) come from the log, not the clock.
func TestReplayRendersWhatTheClientGot(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	f := s.frontend(nil, "--log-compaction=false")
	s.worker("w1", "--mock-speedup-ratio", "20")
	f.waitRoutable(t, "w1")
	api := apiClient{url: f.url}
	decode := func(what string, b []byte) map[string]any {
		t.Helper()
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v: %s", what, err, b)
		}
		return v
	}

	resp := api.do(t, "POST", "/v1/responses", []byte(`{"model":"mock","input":"replay what the client got","instructions":"be brief"}`), nil)
	resp.want(t, "POST /v1/responses", 200, "")
	respGot := decode("the response", resp.body)
	respID, _ := respGot["id"].(string)
	if respGot["object"] != "response" || respGot["status"] != "completed" || !strings.HasPrefix(respID, "resp_") {
		t.Fatalf("POST /v1/responses answered %s", resp.body)
	}
	if get := decode("GET", api.get(t, "/v1/responses/"+respID).body); !reflect.DeepEqual(get, respGot) {
		t.Fatalf("GET /v1/responses/%s differs from the create's answer:\n got %v\nwant %v", respID, get, respGot)
	}
	const chatID = "replay-chat"
	chat := api.do(t, "POST", "/v1/chat/completions", []byte(`{"model":"mock","max_tokens":30,"messages":[{"role":"user","content":"replay what the client got"}]}`),
		map[string]string{"X-Request-Id": chatID})
	chat.want(t, "POST /v1/chat/completions", 200, "")
	chatGot := decode("the chat completion", chat.body)
	if chatGot["object"] != "chat.completion" {
		t.Fatalf("POST /v1/chat/completions answered %s", chat.body)
	}

	check := func(when string) {
		t.Helper()
		for _, c := range []struct {
			id   string
			want map[string]any
		}{{respID, respGot}, {chatID, chatGot}} {
			out, errOut, code := runTool(t, batonBin, "replay", "--json", c.id, "--nats", s.natsURL)
			if code != 0 {
				t.Fatalf("%s: baton replay --json %s: exit %d: %s", when, c.id, code, errOut)
			}
			var doc struct {
				Response map[string]any `json:"response"`
			}
			if err := json.Unmarshal([]byte(out), &doc); err != nil {
				t.Fatalf("%s: baton replay --json %s: %v\n%s", when, c.id, err, out)
			}
			if !reflect.DeepEqual(doc.Response, c.want) {
				got, _ := json.Marshal(doc.Response)
				want, _ := json.Marshal(c.want)
				t.Errorf("%s: baton replay --json %s shows\n %s\nwant what its client got\n %s", when, c.id, got, want)
			}
		}
	}
	check("with every delta")
	if out, errOut, code := runTool(t, batonBin, "compact", "--nats", s.natsURL, respID, chatID); code != 0 {
		t.Fatalf("baton compact: exit %d\n%s%s", code, out, errOut)
	}
	check("compacted")
	out, errOut, code := runTool(t, batonBin, "replay", respID, "--nats", s.natsURL)
	if code != 0 || !strings.Contains(out, "carry for older readers: tokens 0-") || !strings.Contains(out, "in one record: attempt 0: tokens 0-") {
		t.Errorf("the compacted response's replay (exit %d) does not tell the carry from the attempt's work:\n%s%s", code, out, errOut)
	}
}
