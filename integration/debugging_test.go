package integration

import (
	"bytes"
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
)

// docs/debugging.md run as written: its walk-through and every example
// command must print what the doc shows.

// docExample is one example of a doc: the commands after its `$ ` and the
// lines it shows them printing.
type docExample struct {
	cmds []string
	want []string
}

// docExamples are the ``` blocks of text (no language) that start with
// `$ `, each split at its `$ ` lines into commands and what they print.
func docExamples(text string) []docExample {
	var out []docExample
	for _, m := range regexp.MustCompile("(?s)\n```\n(\\$ .*?)```").FindAllStringSubmatch(text, -1) {
		var ex *docExample
		for _, line := range strings.Split(m[1], "\n") {
			if cmd, ok := strings.CutPrefix(line, "$ "); ok {
				out = append(out, docExample{cmds: []string{cmd}})
				ex = &out[len(out)-1]
				continue
			}
			if strings.TrimSpace(line) != "" && strings.TrimSpace(line) != "…" {
				ex.want = append(ex.want, line)
			}
		}
	}
	return out
}

// docLine is the pattern an example line stands for: any number where it
// shows one (any size or duration, in any unit, where it shows one),
// anything where it shows `…`, any run of spaces where it shows one, and
// this machine's host name where it shows the doc machine's (vm).
func docLine(line, host string) *regexp.Regexp {
	var b strings.Builder
	line = strings.TrimSpace(line)
	last := 0
	for _, m := range docTokens.FindAllStringIndex(line, -1) {
		b.WriteString(regexp.QuoteMeta(line[last:m[0]]))
		switch tok := line[m[0]:m[1]]; {
		case tok == "…":
			b.WriteString(".*")
		case tok == "vm":
			b.WriteString(regexp.QuoteMeta(host))
		case tok[0] == ' ':
			b.WriteString(" +")
		case docQuantity.MatchString(tok):
			b.WriteString(docQuantity.String())
		default:
			b.WriteString(`\d[\d.,]*`)
		}
		last = m[1]
	}
	b.WriteString(regexp.QuoteMeta(line[last:]))
	return regexp.MustCompile(b.String())
}

// docTokens are the parts of an example line that stand for more than
// themselves; docQuantity is a size or a duration (the nats CLI's tables),
// which may come in any unit.
var (
	docQuantity = regexp.MustCompile(`\d[\d.,]* ?(?:[KMG]iB|B|[µmn]?s)\b`)
	docTokens   = regexp.MustCompile(docQuantity.String() + `|…|\bvm\b| +|\d[\d.,]*`)
)

// missing is the first line of want that does not match a line of got, or
// "". ordered: each must match after the previous one's match (want is a
// subsequence of got, line by line); else anywhere (the nats CLI prints a
// message's headers in any order).
func missing(got string, want []string, host string, ordered bool) string {
	lines := strings.Split(got, "\n")
	i := 0
	for _, w := range want {
		re := docLine(w, host)
		if !ordered {
			i = 0
		}
		for i < len(lines) && !re.MatchString(lines[i]) {
			i++
		}
		if i == len(lines) {
			return w
		}
		i++
	}
	return ""
}

// TestDocsDebugging runs docs/debugging.md's walk-through as it says (its
// stack, with free ports and a private store; the request, the worker's and
// then the frontend's kill -9, the resume on the other frontend) and then
// every example command: each must print the lines its example shows, in
// order for baton's commands and in any order for the nats CLI's (numbers,
// times and ids may differ, and `…` stands for anything).
func TestDocsDebugging(t *testing.T) {
	t.Parallel() // a walk-through's commands, with no timing bound of their own
	doc := readDoc(t, "docs/debugging.md")
	setup := shBlocks(doc)
	if len(setup) == 0 || len(setup[0]) != 2 || !strings.HasPrefix(setup[0][0], "baton up ") || !strings.HasPrefix(setup[0][1], "baton frontend ") {
		t.Fatalf("docs/debugging.md: the first sh block is not the walk-through's baton up and baton frontend, update this test: %q", setup)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	portA, portB, natsPort := freePort(t), freePort(t), freePort(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	natsURL := "nats://127.0.0.1:" + strconv.Itoa(natsPort)
	subst := strings.NewReplacer("nats://127.0.0.1:4222", natsURL, "127.0.0.1:4222", "127.0.0.1:"+strconv.Itoa(natsPort),
		"--http-port 8001", "--http-port "+strconv.Itoa(portB), ".baton/", dataDir+"/")
	// The workers hold a request at token 160 until the test opens the gate
	// (below, once fe-a has taken the story's request over).
	args := append(strings.Fields(strings.TrimPrefix(setup[0][0], "baton ")),
		"--http-port", strconv.Itoa(portA), "--nats-port", strconv.Itoa(natsPort), "--data-dir", dataDir,
		"--mock-hold-at-token", "160")
	up := start(t, "up", nil, args...)
	feA := &frontend{proc: up, url: "http://127.0.0.1:" + strconv.Itoa(portA)}
	feA.waitRoutable(t, "up-w1", "up-w2")
	env := []string{"NATS_SERVER=" + natsURL, "NATS_URL=" + natsURL}
	feBProc := startBin(t, "bash", "fe-b", env, "-c", "exec "+strings.Replace(subst.Replace(setup[0][1]), "baton ", batonBin+" ", 1))
	feB := &frontend{proc: feBProc, url: "http://127.0.0.1:" + strconv.Itoa(portB)}
	feB.waitRoutable(t, "up-w1", "up-w2")

	// The story: on fe-b, the worker killed at 40 tokens, fe-b at 120, the
	// rest on fe-a. The surviving worker holds the request at token 160
	// until fe-a owns it: with 0.8 s of tokens left after fe-b's kill, a
	// loaded machine could end the request before the takeover, which the
	// doc's examples show.
	const id, prompt, maxTokens = "story-1", "tell me a story about a river", 200
	killed := ""
	first := streamFaults(t, feB, id, prompt, maxTokens, true,
		faultAt{40, func() {
			killed = feB.servingWorker(t, id)
			ws, err := feB.workers()
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range ws {
				if w.ID == killed {
					if err := syscall.Kill(w.PID, syscall.SIGKILL); err != nil {
						t.Fatal(err)
					}
				}
			}
		}},
		faultAt{120, func() { feB.signal(syscall.SIGKILL) }})
	if first.done || killed == "" {
		t.Fatalf("the first stream completed (%v) or no worker was killed (%q): the kills came too late", first.done, killed)
	}
	ws, err := feA.workers()
	if err != nil {
		t.Fatal(err)
	}
	survivor := 0
	for _, w := range ws {
		if w.ID != killed && w.State == "ready" {
			survivor = w.PID
		}
	}
	if survivor == 0 {
		t.Fatalf("no worker but %s is ready on fe-a: %+v", killed, ws)
	}
	releaseWhenOwned(feA, id, "fe-a", survivor)
	rest := resume(t, feA, id, lastID(first))
	joined(t, first, rest, prompt, maxTokens)

	// The doc kills up-w2 and keeps up-w1; here it may be the other way round.
	swap := strings.NewReplacer("up-w1", "up-w2", "up-w2", "up-w1")
	nats, live := "", 0
	for _, ex := range docExamples(doc) {
		for _, cmd := range ex.cmds {
			line := subst.Replace(cmd)
			if killed != "up-w2" {
				line = swap.Replace(line)
			}
			switch {
			case strings.HasPrefix(line, "baton "):
				line = batonBin + line[len("baton"):]
			case strings.HasPrefix(line, "nats "):
				if nats == "" {
					nats = natsCLI(t)
				}
				line = nats + line[len("nats"):]
			default:
				t.Fatalf("docs/debugging.md: %q is neither a baton nor a nats command", cmd)
			}
			if strings.Contains(line, "| jq") {
				if _, err := exec.LookPath("jq"); err != nil {
					t.Logf("jq not installed: skipping %s", cmd)
					continue
				}
			}
			ordered := strings.HasPrefix(cmd, "baton ")
			out := runExample(t, feA, cmd, line, env, ex.want, host, &live)
			if w := missing(out, ex.want, host, ordered); w != "" {
				t.Errorf("docs/debugging.md: %s prints no line like\n\t%s\n(after the lines before it in the example); it printed:\n%s", cmd, w, out)
			}
		}
	}
}

// runExample runs one command of an example and returns what it printed:
// to completion (exit 0); or, for a watch, until its output has every line
// wanted; or, for a live subscription, while f serves requests until it
// exits (requests live-1, live-2, … with the prompt "live traffic", *live
// counting them); or `nats stream view`, which needs a terminal, under
// script(1).
func runExample(t *testing.T, f *frontend, cmd, line string, env, want []string, host string, live *int) string {
	t.Helper()
	switch {
	case strings.Contains(line, " stream view "):
		script, err := exec.LookPath("script")
		if err != nil {
			t.Logf("script(1) not installed: skipping %s", cmd)
			return strings.Join(want, "\n")
		}
		line = script + " -qec " + strconv.Quote(line) + " /dev/null"
	case strings.Contains(line, " kv watch "), strings.Contains(line, "baton.live."):
		var mu sync.Mutex
		var out bytes.Buffer
		c := exec.Command("bash", "-c", "exec "+line)
		c.Env = append(os.Environ(), env...)
		c.Stdout, c.Stderr = syncWriter{mu: &mu, b: &out}, syncWriter{mu: &mu, b: &out}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		defer func() { _ = c.Process.Kill(); <-done }()
		text := func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
		if strings.Contains(line, " kv watch ") {
			// Until it shows the example or 20 s have passed; the caller
			// says what is missing.
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			deadline := time.After(20 * time.Second)
			for missing(text(), want, host, false) != "" {
				select {
				case <-tick.C:
				case <-deadline:
					return text()
				}
			}
			return text()
		}
		waitFor(t, 20*time.Second, cmd+" to subscribe", func() bool { return strings.Contains(text(), "Subscribing on") })
		for n := 1; ; n++ {
			*live++
			resp := post(t, f.url+"/v1/completions", map[string]any{"model": "mock", "prompt": "live traffic", "max_tokens": 30},
				map[string]string{"X-Request-Id": "live-" + strconv.Itoa(*live)})
			resp.Body.Close()
			select {
			case err := <-done:
				done <- err
				if err != nil {
					t.Errorf("%s: %v", cmd, err)
				}
				return text()
			case <-time.After(time.Second):
			}
			if n == 30 {
				t.Fatalf("%s: still running after 30 requests:\n%s", cmd, text())
			}
		}
	}
	out, code := shell(t, line, env)
	if code != 0 {
		t.Errorf("%s: exit %d:\n%s", cmd, code, out)
	}
	return out
}

// TestDocLine: what an example line may and may not stand for.
func TestDocLine(t *testing.T) {
	tests := []struct {
		name, example, got string
		want               bool
	}{
		{"other numbers", "  +0.056s  #3-42       tokens.0.up-w2 tokens", "  +1.5s  #30-420   tokens.0.up-w1 tokens", true},
		{"other units", "│ 382 B │ 2      │ 929ms       │", "│ 1.1 KiB │ 12 │ 2.5s │", true},
		{"ellipsis", `{"worker_id":"up-w1","lease_id":"…","model":"mock"`, `{"worker_id":"up-w1","lease_id":"9d0be493-7c3d","model":"mock"`, true},
		{"host", "pid 11980 on vm, lease ttl 10s", "pid 7 on ci-runner-3, lease ttl 10s", true},
		{"words differ", "attempt 0 (worker up-w2) fenced by frontend fe-b", "attempt 0 (worker up-w2) failed, reported by worker up-w2", false},
		{"a stale subject", "#3-42  tokens.0  tokens", "#3-42  tokens.0.up-w1 tokens", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := docLine(tt.example, "ci-runner-3").MatchString(tt.got); got != tt.want {
				t.Errorf("%q stands for %q: got %v, want %v", tt.example, tt.got, got, tt.want)
			}
		})
	}
}
