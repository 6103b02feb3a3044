package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
)

// The doc tests run the commands of README.md and docs/ as written, apart
// from the ports (the tests pick free ones), the binary (the one under test
// instead of `go run ./cmd/baton`) and the placeholders a reader fills in.

// readDoc returns a file of the repository.
func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// section is the text of doc from the line that starts with heading to the
// next heading of any level.
func section(t *testing.T, doc, heading string) string {
	t.Helper()
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("no section %q", heading)
	}
	var b strings.Builder
	fenced := false
	for _, line := range strings.Split(doc[i+len(heading)+2:], "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
		} else if !fenced && strings.HasPrefix(line, "#") {
			break
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// shBlocks are the ```sh code blocks of text, each as its commands:
// continuation lines joined, blank lines dropped.
func shBlocks(text string) [][]string {
	var blocks [][]string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(text, -1) {
		var cmds []string
		cur := ""
		for _, line := range strings.Split(m[1], "\n") {
			if strings.HasSuffix(line, "\\") {
				cur += strings.TrimSuffix(line, "\\")
				continue
			}
			cur += line
			if strings.TrimSpace(cur) != "" {
				cmds = append(cmds, cur)
			}
			cur = ""
		}
		blocks = append(blocks, cmds)
	}
	return blocks
}

// shell runs one command line with bash, no terminal, and a deadline.
func shell(t *testing.T, line string, env []string) (string, int) {
	t.Helper()
	return shellWithin(t, line, env, 60*time.Second)
}

// shellWithin is shell with a bound of its own: the Go program's commands
// compile openai-go, which takes minutes on a loaded two-core machine.
func shellWithin(t *testing.T, line string, env []string, bound time.Duration) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", line)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s: still running after %v:\n%s", line, bound, out)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	return string(out), code
}

// TestReadmeQuickStart runs the quick start's `baton up` (plus free ports and
// a private store) and "Ask it something" as written: the curl, then the Go
// program in a module of its own with the commands the README gives.
func TestReadmeQuickStart(t *testing.T) {
	t.Parallel() // a walk-through's commands (and a Go build), with no timing bound of their own
	readme := readDoc(t, "README.md")
	quick := shBlocks(section(t, readme, "## Quick start (a fresh machine with Go 1.26)"))
	askText := section(t, readme, "### Ask it something")
	ask := shBlocks(askText)
	if len(quick) == 0 || len(quick[0]) != 1 || len(ask) != 2 || len(ask[0]) != 1 || len(ask[1]) != 2 {
		t.Fatalf("the quick start's blocks changed shape, update this test: %q %q", quick, ask)
	}
	upLine, ok := strings.CutPrefix(quick[0][0], "go run ./cmd/baton ")
	if !ok {
		t.Fatalf("the quick start %q does not start with go run ./cmd/baton", quick[0][0])
	}
	port := freePort(t)
	args := append(strings.Fields(upLine), "--http-port", strconv.Itoa(port), "--nats-port", strconv.Itoa(freePort(t)),
		"--data-dir", filepath.Join(t.TempDir(), "data"))
	up := start(t, "up", nil, args...)
	f := &frontend{proc: up, url: "http://127.0.0.1:" + strconv.Itoa(port)}
	f.waitRoutable(t, "up-w1", "up-w2")
	// The banner comes once up has seen its workers ready, which may be a
	// moment after this client saw them routable.
	waitFor(t, 20*time.Second, "the banner to say the frontend listens on 127.0.0.1:"+strconv.Itoa(port), func() bool {
		return strings.Contains(up.output(), "listening on 127.0.0.1:"+strconv.Itoa(port))
	})
	line := strings.ReplaceAll(ask[0][0], "127.0.0.1:8000", "127.0.0.1:"+strconv.Itoa(port))
	out, code := shell(t, line, nil)
	var last string
	for _, l := range strings.Split(out, "\n") {
		if d, ok := strings.CutPrefix(l, "data: "); ok {
			last = d
		}
	}
	if code != 0 || last != "[DONE]" || !strings.Contains(out, "id: 20\n") {
		t.Errorf("%s: exit %d, want 0, 20 tokens and [DONE]:\n%s", ask[0][0], code, out)
	}
	readmeGoProgram(t, askText, ask[1], port)
}

// readmeGoProgram writes the Go program of "Ask it something" to a directory
// of its own (aimed at port) and runs the README's commands there: the
// module's `go get` must name the openai-go version of baton's go.mod, and
// the program must print the mock's answer. The modules come from the local
// module cache when it has them all (GOPROXY=off, and GOSUMDB=off: the cache
// verified them when they came in), else as they do for a reader, through
// the module proxy.
func readmeGoProgram(t *testing.T, askText string, cmds []string, port int) {
	m := regexp.MustCompile("(?s)```go\n(package main\n.*?)```").FindStringSubmatch(askText)
	if m == nil {
		t.Fatal("README.md: no Go program (a ```go block starting with package main) in Ask it something")
	}
	want := regexp.MustCompile(`(?m)^\s*github\.com/openai/openai-go/v3 (v\S+)$`).FindStringSubmatch(readDoc(t, "go.mod"))
	if want == nil {
		t.Fatal("go.mod does not require github.com/openai/openai-go/v3")
	}
	if get := "go get github.com/openai/openai-go/v3@" + want[1]; !strings.Contains(cmds[0], get) {
		t.Errorf("README.md: %q does not %s, the version in go.mod", cmds[0], get)
	}
	dir := t.TempDir()
	program := strings.ReplaceAll(m[1], "127.0.0.1:8000", "127.0.0.1:"+strconv.Itoa(port))
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(program), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"GOFLAGS=", "GOWORK=off", "GOTOOLCHAIN=local"}
	const compiling = 5 * time.Minute
	if out, code := shellWithin(t, "cd "+dir+" && "+cmds[0], append(env, "GOPROXY=off", "GOSUMDB=off"), compiling); code != 0 {
		t.Logf("%s: not from the module cache alone (exit %d), now through the module proxy:\n%s", cmds[0], code, out)
		for _, f := range []string{"go.mod", "go.sum"} {
			if err := os.Remove(filepath.Join(dir, f)); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
		}
		if out, code := shellWithin(t, "cd "+dir+" && "+cmds[0], env, compiling); code != 0 {
			t.Fatalf("%s: exit %d:\n%s", cmds[0], code, out)
		}
	}
	out, code := shellWithin(t, "cd "+dir+" && "+cmds[1], env, compiling)
	if want := engine.MockText("user: hello", 0, 50) + "\n"; code != 0 || out != want {
		t.Errorf("%s: exit %d, want 0 and the mock's answer:\n got %q\nwant %q", cmds[1], code, out, want)
	}
}

// TestReadmeDemo runs "Watch a migration happen" from README.md: `baton up`
// as written (plus free ports and a private store, and a mock 3 times faster
// so the test takes 10 s, not 30), the stream, the lookups and the kill of
// the serving worker, then the metrics, state and replay commands; and then
// the `nats` commands of docs/internals.md, which look at the demo's stack,
// against the same stack, without a terminal.
func TestReadmeDemo(t *testing.T) {
	t.Parallel() // a walk-through's commands, with no timing bound of their own
	readme := readDoc(t, "README.md")
	blocks := shBlocks(section(t, readme, "### Watch a migration happen"))
	if len(blocks) != 3 || len(blocks[0]) != 1 || len(blocks[1]) != 4 || len(blocks[2]) != 4 {
		t.Fatalf("the demo's blocks changed shape (want 1, 4 and 4 commands), update this test: %q", blocks)
	}
	upLine, ok := strings.CutPrefix(blocks[0][0], "go run ./cmd/baton ")
	if !ok {
		t.Fatalf("the demo's first command %q does not start with go run ./cmd/baton", blocks[0][0])
	}
	port, natsPort := freePort(t), freePort(t)
	args := append(strings.Fields(upLine), "--http-port", strconv.Itoa(port), "--nats-port", strconv.Itoa(natsPort),
		"--data-dir", filepath.Join(t.TempDir(), "data"), "--mock-speedup-ratio", "3")
	up := start(t, "up", nil, args...)
	f := &frontend{proc: up, url: "http://127.0.0.1:" + strconv.Itoa(port)}
	f.waitRoutable(t, "up-w1", "up-w2")
	natsURL := "nats://127.0.0.1:" + strconv.Itoa(natsPort)
	env := []string{"NATS_SERVER=" + natsURL}
	subst := func(line string) string {
		line = strings.ReplaceAll(line, "127.0.0.1:8000", "127.0.0.1:"+strconv.Itoa(port))
		return strings.ReplaceAll(line, "go run ./cmd/baton", batonBin)
	}

	// The stream, in the background as written.
	streamLine, ok := strings.CutSuffix(strings.TrimSpace(blocks[1][0]), "&")
	if !ok {
		t.Fatalf("the demo's stream %q does not run in the background", blocks[1][0])
	}
	var streamOut bytes.Buffer
	stream := exec.Command("bash", "-c", subst(streamLine))
	stream.Stdout = &streamOut
	if err := stream.Start(); err != nil {
		t.Fatal(err)
	}
	streamDone := make(chan error, 1)
	go func() { streamDone <- stream.Wait() }()
	t.Cleanup(func() { _ = stream.Process.Kill() })
	var st struct {
		Worker string `json:"worker"`
		Tokens int    `json:"tokens_generated"`
		Status string `json:"status"`
	}
	waitFor(t, 20*time.Second, "demo-1 to stream", func() bool {
		resp, err := http.Get(f.url + "/v1/requests/demo-1")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == 200 && json.NewDecoder(resp.Body).Decode(&st) == nil && st.Tokens >= 20
	})
	if out, code := shell(t, subst(blocks[1][1]), env); code != 0 || !strings.Contains(out, `"worker":"up-w`) {
		t.Errorf("%s: exit %d, want 0 and the worker:\n%s", blocks[1][1], code, out)
	}
	if out, code := shell(t, subst(blocks[1][2]), env); code != 0 || !strings.Contains(out, `"pid":`) {
		t.Errorf("%s: exit %d, want 0 and pids:\n%s", blocks[1][2], code, out)
	}
	ws, err := f.workers()
	if err != nil {
		t.Fatal(err)
	}
	pid := 0
	for _, w := range ws {
		if w.ID == st.Worker {
			pid = w.PID
		}
	}
	if pid == 0 {
		t.Fatalf("serving worker %q not in /v1/workers %+v", st.Worker, ws)
	}
	kill := strings.ReplaceAll(blocks[1][3], "<pid of up-w1>", strconv.Itoa(pid))
	if out, code := shell(t, kill, env); code != 0 {
		t.Fatalf("%s: exit %d:\n%s", kill, code, out)
	}
	select {
	case err := <-streamDone:
		if err != nil {
			t.Fatalf("the stream's curl: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the stream did not end within 60s")
	}
	var text strings.Builder
	var last string
	sc := bufio.NewScanner(&streamOut)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		last = data
		var chunk struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(data), &chunk) == nil && len(chunk.Choices) > 0 {
			text.WriteString(chunk.Choices[0].Text)
		}
	}
	if last != "[DONE]" {
		t.Errorf("the stream ended with %q, want [DONE]", last)
	}
	if want := engine.MockText("watch me survive", 0, 300); text.String() != want {
		t.Errorf("the stream's text:\n got %q\nwant %q", text.String(), want)
	}

	// What the README says the metrics show, then the state and the replay.
	want, ok := strings.CutPrefix(blocks[2][1], "# ")
	if !ok {
		t.Fatalf("the demo's expected metric line %q is not a comment", blocks[2][1])
	}
	if out, code := shell(t, subst(blocks[2][0]), env); code != 0 || !strings.Contains(out, want+"\n") {
		t.Errorf("%s: exit %d, want 0 and %q:\n%s", blocks[2][0], code, want, out)
	}
	if out, code := shell(t, subst(blocks[2][2]), env); code != 0 || !strings.Contains(out, `"migration_type":"ongoing_request"`) {
		t.Errorf("%s: exit %d, want 0 and the migration:\n%s", blocks[2][2], code, out)
	}
	if out, code := shell(t, subst(blocks[2][3]), env); code != 0 || !strings.Contains(out, "ongoing_request migration") {
		t.Errorf("%s: exit %d, want 0 and the migration:\n%s", blocks[2][3], code, out)
	}

	docsNATS(t, f, natsURL)
}

// docsNATS runs the `nats` commands of docs/internals.md ("Looking at the
// log with the `nats` CLI") against the demo's stack, with no terminal
// (stdin is /dev/null): each must exit 0 and show what it is for.
func docsNATS(t *testing.T, f *frontend, natsURL string) {
	nats := natsCLI(t)
	internals := readDoc(t, "docs/internals.md")
	var cmds []string
	for _, b := range shBlocks(section(t, internals, "## Looking at the log with the `nats` CLI")) {
		cmds = append(cmds, b...)
	}
	if len(cmds) != 6 {
		t.Fatalf("the nats commands of docs/internals.md changed (want 6), update this test: %q", cmds)
	}
	wants := []string{"BATON_REQUESTS", "ce-type: baton.request.compacted.v1", "ce-type: baton.request.accepted.v1",
		"Subject baton.requests.16.demo-1.events", "up-w", "Nats-Stream: BATON_REQUESTS"}
	for i, line := range cmds {
		line = strings.Replace(line, "nats --server nats://127.0.0.1:4222", nats+" --server "+natsURL, 1)
		if !strings.HasPrefix(line, nats+" ") {
			t.Fatalf("docs/internals.md: %q is not a nats command on nats://127.0.0.1:4222", cmds[i])
		}
		if !strings.Contains(line, "baton.live.") {
			if out, code := shell(t, line, nil); code != 0 || !strings.Contains(out, wants[i]) {
				t.Errorf("%s: exit %d, want 0 and %q in:\n%s", cmds[i], code, wants[i], out)
			}
			continue
		}
		// A live subscription: it needs traffic to end.
		var out bytes.Buffer
		sub := exec.Command("bash", "-c", line)
		sub.Stdout, sub.Stderr = &out, &out
		if err := sub.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- sub.Wait() }()
		t.Cleanup(func() { _ = sub.Process.Kill() })
		for n := 0; ; n++ {
			resp := post(t, f.url+"/v1/completions", map[string]any{"model": "mock", "prompt": "live " + strconv.Itoa(n), "max_tokens": 30}, nil)
			resp.Body.Close()
			select {
			case err := <-done:
				if err != nil || !strings.Contains(out.String(), wants[i]) {
					t.Errorf("%s: %v, want exit 0 and %q in:\n%s", cmds[i], err, wants[i], out.String())
				}
				return
			case <-time.After(time.Second):
			}
			if n == 30 {
				t.Fatalf("%s: still running after 30 requests:\n%s", cmds[i], out.String())
			}
		}
	}
}

// TestDemoScript runs scripts/demo (faster than its defaults): it must see
// the migration, the pause and the undisturbed text, and exit 0.
func TestDemoScript(t *testing.T) {
	t.Parallel() // a walk-through's commands, with no timing bound of their own
	demo := filepath.Join(t.TempDir(), "demo")
	if out, err := exec.Command("go", "build", "-o", demo, "../scripts/demo").CombinedOutput(); err != nil {
		t.Fatalf("build scripts/demo: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, demo, "-baton", batonBin, "-tokens-per-sec", "40", "-max-tokens", "120", "-kill-at", "40")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/demo: %v\n%s", err, out)
	}
	for _, want := range []string{
		"runs on up-w", "from the kill to the next token",
		"finished with [DONE]: true; 120 tokens; identical to an undisturbed run: true",
		`dynamo_frontend_model_migration_total{migration_type="ongoing_request",model="mock"} 1`,
		"migrations  1: ongoing_request",
	} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("scripts/demo's output lacks %q:\n%s", want, out)
		}
	}
}

// TestDocsSayHowToInstall: docs/debugging.md and docs/deployment.md call a
// bare `baton`, and so may any other page of docs/; each page that does must
// say how to build it before the first such command.
func TestDocsSayHowToInstall(t *testing.T) {
	bare := regexp.MustCompile("(?m)^(\\$ )?baton [a-z]")
	pages, err := filepath.Glob(filepath.Join("..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range pages {
		name := filepath.ToSlash(strings.TrimPrefix(page, ".."+string(filepath.Separator)))
		doc := readDoc(t, name)
		first := bare.FindStringIndex(doc)
		if first == nil {
			if name == "docs/debugging.md" || name == "docs/deployment.md" {
				t.Errorf("%s: no bare baton command; update this test", name)
			}
			continue
		}
		install := strings.Index(doc, "go install ./cmd/baton")
		if install < 0 || install > first[0] {
			t.Errorf("%s: `go install ./cmd/baton` (at %d) does not come before the first bare baton command (at %d)", name, install, first[0])
		}
	}
}
