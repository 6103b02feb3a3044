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

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/streams"
)

// The log read after the fact: `baton replay` of migrated and resumed
// requests and of what each client got, events of a newer build in a live
// request (the compatibility rule: skipped, with the reason), and the tools
// on a log of several partitions.

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
	t.Parallel() // no timing bound of its own
	s, f1, f2 := twoFrontendsWorkers(t, []string{"--mock-hold-at-token", "100"})
	const id, maxTokens = "replayed", 150
	prompt := "replay a request that migrated and resumed"
	killed := ""
	first := streamFaults(t, f1, id, prompt, maxTokens, true,
		faultAt{20, func() {
			killed = f1.servingWorker(t, id)
			s.workers[killed].signal(syscall.SIGKILL)
		}},
		faultAt{60, func() { f1.signal(syscall.SIGKILL) }})
	survivor := map[string]string{"w1": "w2", "w2": "w1"}[killed]
	if survivor == "" {
		t.Fatalf("killed worker %q, want w1 or w2", killed)
	}
	releaseWhenOwned(f2, id, "frontend-2", s.workers[survivor].Pid())
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
		replayed
		Stream   string `json:"stream"`
		Timeline []struct {
			Seq  uint64 `json:"seq"`
			Type string `json:"type"`
		} `json:"timeline"`
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
	s, f := oneWorker(t, []string{"--mock-speedup-ratio", "20"}, "--log-compaction=false")
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

// TestFutureEventsInALiveRequest holds the compatibility rule
// (docs/compatibility.md) against real processes: while a request streams,
// events of a newer build are appended to its log (an unknown fact and a
// newer version of a known type on its events subject), as a newer
// frontend beside this one would. The owning frontend streams on; then it
// and the serving worker are killed, and the other frontend, which learns
// the request from the log alone, resumes it and migrates it, deciding with
// expected-sequence appends past the unreadable events: the client gets the
// fault-free text, and `baton replay` shows each unreadable event as
// skipped, with its reason.
func TestFutureEventsInALiveRequest(t *testing.T) {
	t.Parallel()
	s, f1, f2 := twoFrontendsWorkers(t, []string{"--mock-hold-at-token", "100"}) // held there until the kills
	js := s.jetStream(t)
	const id, prompt, maxTokens = "future-live", "a newer build writes here too", 200
	appendFuture := func(typ string, ev events.Event) {
		m, err := streams.NewMsg(streams.RequestEvents(id), events.Envelope{ID: id + "." + typ, Source: "baton/frontend/fe-next",
			Subject: id, Time: time.Now(), Event: ev})
		if err != nil {
			t.Fatal(err)
		}
		m.Header.Set(events.HeaderType, typ)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatalf("append %s: %v", typ, err)
		}
	}
	var once, twice sync.Once
	first := postStream(t, f1.url, "/v1/completions", completion(prompt, maxTokens),
		map[string]string{"X-Request-Id": id, "X-Resumable": "true"}, func(e sseEvent) {
			n, _ := strconv.Atoi(e.id)
			if n >= 20 {
				once.Do(func() {
					appendFuture("baton.request.paused.v1", events.RequestAttached{RequestID: id, Frontend: "fe-next"})
					appendFuture("baton.request.migrated.v2", events.RequestMigrated{RequestID: id, FromAttempt: 0, Cut: n, Frontend: "fe-next"})
				})
			}
			if n >= 60 {
				twice.Do(func() {
					w := f1.servingWorker(t, id)
					f1.signal(syscall.SIGKILL)
					s.workers[w].signal(syscall.SIGKILL)
					s.release(w)
				})
			}
		})
	if first.done {
		t.Fatal("the first stream completed: the kill came too late")
	}
	if n, _ := strconv.Atoi(lastID(first)); n < 60 {
		t.Fatalf("the owner streamed only to %d past the future events, want 60", n)
	}
	rest := resume(t, f2, id, lastID(first))
	joined(t, first, rest, prompt, maxTokens)
	st := f2.state(t, id)
	if st.Status != "completed" || len(st.Migrations) != 1 || st.Migrations[0].Offset < 60 {
		t.Errorf("state %+v: want completed after one migration past token 60 (the v2 migrated event is not read)", st)
	}

	out, errOut, code := runTool(t, batonBin, "replay", id, "--nats", s.natsURL)
	if code != 0 {
		t.Fatalf("baton replay: exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"skipped (unknown event type",
		"skipped (newer version v2 of baton.request.migrated (this build reads up to v1))",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("baton replay does not say %q:\n%s", want, out)
		}
	}
}

// TestPartitionedLogTools runs a request log of three partitions, asked for
// only by the frontend's BATON_REQUEST_PARTITIONS (the worker adopts it), with
// requests in every partition. The tools find each request from its id
// alone; `baton events` merges every partition; the console lists requests
// of all of them; a component that asks for another number of partitions
// exits 2 with the reason.
func TestPartitionedLogTools(t *testing.T) {
	t.Parallel() // no timing bound of its own
	s := newStack(t)
	fe := s.frontend([]string{"BATON_REQUEST_PARTITIONS=3"})
	s.worker("w1", "--mock-tokens-per-sec", "1000", "--mock-ttft", "1ms")
	fe.waitRoutable(t, "w1")
	s.checkPartitions(t, 3)
	parts := streams.Partitions(3)
	var ids []string
	for i := range parts.Count() {
		id := partitionedID(parts, "part", i)
		ids = append(ids, id)
		prompt := "partition " + id
		res := postStream(t, fe.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 8},
			map[string]string{"X-Request-Id": id}, nil)
		checkComplete(t, res, prompt, 8)
	}
	for _, id := range ids {
		out, errOut, code := runTool(t, batonBin, "replay", "--json", "--nats", s.natsURL, id)
		var doc struct {
			Stream string `json:"stream"`
			Output string `json:"output"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &doc) != nil {
			t.Fatalf("baton replay %s: exit %d: %s\n%s", id, code, errOut, out)
		}
		if doc.Stream != parts.StreamOf(id) || doc.Output != engine.MockText("partition "+id, 0, 8) {
			t.Errorf("replay %s: stream %q output %q; want %s and the mock's text", id, doc.Stream, doc.Output, parts.StreamOf(id))
		}
		out, errOut, code = runTool(t, batonBin, "events", "--request", id, "--nats", s.natsURL)
		short := "req." + strings.TrimPrefix(parts.StreamOf(id), "BATON_REQUESTS_")
		if code != 0 || !strings.Contains(out, short) || !strings.Contains(out, streams.RequestEvents(id)) {
			t.Errorf("baton events --request %s: exit %d, stderr %q, want lines of %s:\n%s", id, code, errOut, short, out)
		}
	}
	// The nats CLI finds a request's partition from its slot, as docs/internals.md says.
	nats := natsCLI(t)
	for _, id := range ids {
		out, errOut, code := runTool(t, nats, "--server", s.natsURL, "stream", "ls", "--names", "--subject", "baton.requests."+strconv.Itoa(streams.Slot(id))+".>")
		if code != 0 || strings.TrimSpace(out) != parts.StreamOf(id) {
			t.Errorf("nats stream ls --subject for %s: exit %d, stderr %q, got %q, want %s", id, code, errOut, out, parts.StreamOf(id))
		}
	}
	out, errOut, code := runTool(t, batonBin, "events", "--nats", s.natsURL)
	for _, id := range append(ids, "baton.workers.w1.events") {
		if code != 0 || !strings.Contains(out, id) {
			t.Errorf("baton events: exit %d, stderr %q, want %s in:\n%s", code, errOut, id, out)
		}
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	getJSON(t, fe.url+"/v1/console/requests", 200, &list)
	listed := map[string]bool{}
	for _, r := range list.Data {
		listed[r.ID] = true
	}
	for _, id := range ids {
		if !listed[id] {
			t.Errorf("the console lists %v, want %s (in %s) too", list.Data, id, parts.StreamOf(id))
		}
	}

	// Another number of partitions than the log's: exit 2, with the reason.
	// (A worker reads no request stream, not even its info, which would list
	// every request id: the frontends check the layout, issue 23.)
	for _, args := range [][]string{
		{"frontend", "--nats", s.natsURL, "--http-port", "0", "--request-partitions", "2"},
		{"frontend", "--nats", s.natsURL, "--http-port", "0", "--request-partitions", "1"},
	} {
		_, errOut, code := runTool(t, batonBin, args...)
		if code != 2 || !strings.Contains(errOut, "the request log on this server has 3 partition(s)") {
			t.Errorf("baton %s with %s: exit %d, stderr %q; want 2 and the layout", args[0], args[len(args)-1], code, errOut)
		}
	}
}
