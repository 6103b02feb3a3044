package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/faultcheck"
	"github.com/baton-dev/baton/internal/freeport"
	"github.com/baton-dev/baton/internal/promtext"
)

// batonBin is the binary under test and vllmsimBin the vLLM simulator,
// built once by TestMain.
var batonBin, vllmsimBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "baton-it-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	batonBin = filepath.Join(dir, "baton")
	if bin := os.Getenv("BATON_BENCH_BIN"); bin != "" {
		// A baton built elsewhere (another commit of this tree), so that
		// benchmarks of two builds can alternate in one session.
		batonBin = bin
	} else {
		args := []string{"build", "-o", batonBin}
		if raceEnabled {
			args = append(args, "-race")
		}
		build := exec.Command("go", append(args, "../cmd/baton")...)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build baton:", err)
			os.Exit(1)
		}
	}
	vllmsimBin = filepath.Join(dir, "vllmsim")
	build := exec.Command("go", "build", "-o", vllmsimBin, "../cmd/vllmsim")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build vllmsim:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running baton process (or another program a test starts) and
// its output.
type proc struct {
	*faultcheck.Process
	t   testing.TB
	log *bytes.Buffer
	mu  *sync.Mutex
}

// syncWriter writes to b under mu: a process's stdout and stderr into one
// buffer that the test reads while it runs.
type syncWriter struct {
	mu *sync.Mutex
	b  io.Writer
}

func (w syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// start runs baton with args; the process is killed when the test ends, and
// its output is shown if the test failed.
func start(t testing.TB, name string, env []string, args ...string) *proc {
	t.Helper()
	return startBin(t, batonBin, name, env, args...)
}

// startBin runs bin with args, as start does.
func startBin(t testing.TB, bin, name string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, log: &bytes.Buffer{}, mu: &sync.Mutex{}}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	w := syncWriter{mu: p.mu, b: p.log}
	cmd.Stdout, cmd.Stderr = w, w
	var err error
	if p.Process, err = faultcheck.Start(name, cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("---- %s (pid %d) output ----\n%s", p.Name, p.Pid(), p.output())
		}
	})
	return p
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// signal sends sig and checks that it took effect, failing the test loudly
// if not: after SIGSTOP the process is in state T, after SIGCONT it is not,
// after SIGKILL it is gone and its exit status says SIGKILL. (A fault that
// silently did nothing would let a fault test pass without testing
// anything.) Other signals are not checked: their effect is the process's
// own behaviour, which the tests check. Unlike Signal, it fails the test
// when the process has exited.
func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.Cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v to %s: %v", sig, p.Name, err)
	}
	var err error
	switch sig {
	case syscall.SIGSTOP:
		_, err = faultcheck.Stopped(p.Pid(), 5*time.Second)
	case syscall.SIGCONT:
		_, err = faultcheck.Resumed(p.Pid(), 5*time.Second)
	case syscall.SIGKILL:
		err = p.Killed(10 * time.Second)
	}
	if err != nil {
		p.t.Fatalf("%s: %v", p.Name, err)
	}
}

// wait waits for the process to exit and returns its exit code (ExitCode).
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	if !p.WaitFor(timeout) {
		p.t.Fatalf("%s did not exit within %v", p.Name, timeout)
	}
	return p.ExitCode()
}

// freePort returns a TCP port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	p, err := freeport.Get()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stack is a set of baton processes sharing one NATS server.
type stack struct {
	t         testing.TB
	dir       string
	natsURL   string
	nats      *proc
	fronts    []*frontend
	workers   map[string]*proc
	workerEnv []string
	// partitions, when set, is passed to every frontend and worker as
	// --request-partitions.
	partitions int
}

type frontend struct {
	*proc
	url string
}

// newStack starts a NATS server.
func newStack(t testing.TB) *stack {
	t.Helper()
	return newStackArgs(t)
}

// newStackArgs starts a NATS server with extra args to `baton nats`.
func newStackArgs(t testing.TB, natsArgs ...string) *stack {
	t.Helper()
	s := &stack{t: t, dir: t.TempDir(), workers: map[string]*proc{}}
	// A port free a moment ago may be taken before the server binds it
	// (by another test's process, or an outgoing connection's ephemeral
	// port): the server's own log says which, and another port is tried.
	// (A dial would find the other process listening there.)
	for try := 1; ; try++ {
		port := strconv.Itoa(freePort(t))
		p := start(t, "nats", nil, append([]string{"nats", "--port", port, "--store-dir", filepath.Join(s.dir, "nats")}, natsArgs...)...)
		listening := "Listening for client connections on 127.0.0.1:" + port
		waitFor(t, 20*time.Second, "nats to listen", func() bool {
			out := p.output()
			return strings.Contains(out, listening) || strings.Contains(out, "address already in use")
		})
		if strings.Contains(p.output(), listening) {
			s.nats, s.natsURL = p, "nats://127.0.0.1:"+port
			return s
		}
		p.Stop()
		if try == 3 {
			t.Fatalf("nats could not listen on a free port in %d tries:\n%s", try, p.output())
		}
	}
}

// frontend starts a frontend with extra args and env.
func (s *stack) frontend(env []string, args ...string) *frontend {
	s.t.Helper()
	port := freePort(s.t)
	name := fmt.Sprintf("frontend-%d", len(s.fronts)+1)
	all := append(append([]string{"frontend", "--nats", s.natsURL, "--http-port", strconv.Itoa(port), "--frontend-id", name}, s.partitionArgs()...), args...)
	f := &frontend{proc: start(s.t, name, env, all...), url: "http://127.0.0.1:" + strconv.Itoa(port)}
	waitFor(s.t, 20*time.Second, name+" to serve", func() bool { return answers200(http.DefaultClient, f.url+"/live") })
	s.fronts = append(s.fronts, f)
	return f
}

// worker starts a mock worker with the given id and extra args.
func (s *stack) worker(id string, args ...string) *proc {
	s.t.Helper()
	all := append(append([]string{"worker", "--nats", s.natsURL, "--worker-id", id}, s.partitionArgs()...), args...)
	p := start(s.t, "worker-"+id, s.workerEnv, all...)
	s.workers[id] = p
	return p
}

func (s *stack) partitionArgs() []string {
	if s.partitions == 0 {
		return nil
	}
	return []string{"--request-partitions", strconv.Itoa(s.partitions)}
}

// waitErrorEnd waits up to 10 s for the stream whose result comes on ch,
// and checks that it ended with an error event, not [DONE]; what names the
// stream.
func waitErrorEnd(t *testing.T, ch <-chan sseResult, what string) {
	t.Helper()
	select {
	case r := <-ch:
		if r.done || r.errorBody == "" {
			t.Errorf("%s ended with done=%v error=%q, want an error event", what, r.done, r.errorBody)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not end", what)
	}
}

// release opens the hold (--mock-hold-at-token) of every worker of the
// stack still running but the one named except: they go on with the
// requests they hold, and hold no more.
func (s *stack) release(except string) {
	for id, w := range s.workers {
		if id != except && !w.Exited() {
			w.signal(syscall.SIGUSR1)
		}
	}
}

// waitRoutable waits until frontend f sees exactly the given workers ready.
func (f *frontend) waitRoutable(t testing.TB, ids ...string) {
	t.Helper()
	waitFor(t, 20*time.Second, fmt.Sprintf("workers %v routable on %s", ids, f.Name), func() bool {
		ws, err := f.workers()
		if err != nil {
			return false
		}
		ready := map[string]bool{}
		for _, w := range ws {
			if w.State == "ready" {
				ready[w.ID] = true
			}
		}
		for _, id := range ids {
			if !ready[id] {
				return false
			}
		}
		return true
	})
}

// answers200 reports whether GET url with c answers 200 (an error is a
// no), for waitFor.
func answers200(c *http.Client, url string) bool {
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// workerInfo is a worker as GET /v1/workers lists it, with what the tests
// read of it.
type workerInfo struct {
	ID    string `json:"id"`
	State string `json:"state"`
	Model string `json:"model"`
	PID   int    `json:"pid"`
	// Reason says why a not_ready worker is not ready.
	Reason string `json:"reason"`
	Load   struct {
		ActiveRequests int  `json:"active_requests"`
		KVBlocksUsed   int  `json:"kv_blocks_used"`
		KVBlocksTotal  int  `json:"kv_blocks_total"`
		Busy           bool `json:"busy"`
	} `json:"load"`
	Priority     *int            `json:"priority"`     // nil when the list omits it
	Capabilities map[string]bool `json:"capabilities"` // nil until probed
}

// listWorkers is f's GET /v1/workers, failing t when it cannot be read.
func (f *frontend) listWorkers(t testing.TB) []workerInfo {
	t.Helper()
	var out struct {
		Data []workerInfo `json:"data"`
	}
	getJSON(t, f.url+"/v1/workers", 200, &out)
	return out.Data
}

// listedWorker is worker id as f lists it at /v1/workers (false when it
// does not), failing t when the list cannot be read.
func (f *frontend) listedWorker(t testing.TB, id string) (workerInfo, bool) {
	t.Helper()
	for _, w := range f.listWorkers(t) {
		if w.ID == id {
			return w, true
		}
	}
	return workerInfo{}, false
}

func (f *frontend) workers() ([]workerInfo, error) {
	resp, err := http.Get(f.url + "/v1/workers")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Data []workerInfo `json:"data"`
	}
	return out.Data, json.NewDecoder(resp.Body).Decode(&out)
}

// workerNamed is worker id as the frontend lists it at /v1/workers; false
// when it does not list it (or cannot be asked).
func (f *frontend) workerNamed(id string) (workerInfo, bool) {
	ws, err := f.workers()
	if err != nil {
		return workerInfo{}, false
	}
	for _, w := range ws {
		if w.ID == id {
			return w, true
		}
	}
	return workerInfo{}, false
}

// metric returns the sum of the samples of a metric whose labels contain
// every given label pair.
func (f *frontend) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get(f.url + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	sum, err := promtext.Sum(resp.Body, name, labels...)
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	return sum
}

// sseEvent is one server-sent event.
type sseEvent struct {
	id   string
	data string
}

// sseResult is a whole stream as a client saw it.
type sseResult struct {
	status    int
	requestID string
	events    []sseEvent
	text      string // concatenated content
	done      bool   // ended with [DONE]
	errorBody string // data of an error event, if any
	finish    string
	header    http.Header
}

// postStream sends a streaming request and reads the whole stream. onEvent,
// if set, is called after each event (to inject faults mid-stream).
func postStream(t testing.TB, url, path string, body map[string]any, header map[string]string, onEvent func(sseEvent)) sseResult {
	t.Helper()
	body["stream"] = true
	resp := post(t, url+path, body, header)
	defer resp.Body.Close()
	return readStream(t, resp, onEvent)
}

// streamPast starts a streaming request in the background and returns,
// once the client has read the event of token offset from (from 0: its
// first event), the channel its whole result comes on. It fails the test
// if the stream gets no further within 30 s.
func streamPast(t *testing.T, url, path string, body map[string]any, header map[string]string, from int) <-chan sseResult {
	t.Helper()
	started := make(chan struct{})
	var once sync.Once
	result := make(chan sseResult, 1)
	go func() {
		result <- postStream(t, url, path, body, header, func(e sseEvent) {
			if n, _ := strconv.Atoi(e.id); n >= from {
				once.Do(func() { close(started) })
			}
		})
	}()
	select {
	case <-started:
	case r := <-result:
		t.Fatalf("the stream ended before token %d: %d %s", from, r.status, r.errorBody)
	case <-time.After(30 * time.Second):
		t.Fatalf("the stream did not reach token %d within 30 s", from)
	}
	return result
}

func post(t testing.TB, url string, body map[string]any, header map[string]string) *http.Response {
	t.Helper()
	return postContext(context.Background(), t, url, body, header)
}

// postContext is post with ctx: the request ends when ctx does.
func postContext(ctx context.Context, t testing.TB, url string, body map[string]any, header map[string]string) *http.Response {
	t.Helper()
	data, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return resp
}

// leaveAfter streams body to url+path with header as a client that goes
// away once it has read the event of token offset n, and returns what it
// read.
func leaveAfter(t testing.TB, url, path string, body map[string]any, header map[string]string, n int) sseResult {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body["stream"] = true
	resp := postContext(ctx, t, url+path, body, header)
	defer resp.Body.Close()
	return readStream(t, resp, func(e sseEvent) {
		if off, _ := strconv.Atoi(e.id); off >= n {
			cancel()
		}
	})
}

func readStream(t testing.TB, resp *http.Response, onEvent func(sseEvent)) sseResult {
	t.Helper()
	res := sseResult{status: resp.StatusCode, requestID: resp.Header.Get("X-Request-Id"), header: resp.Header}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		res.errorBody = string(b)
		return res
	}
	rd := bufio.NewReader(resp.Body)
	var cur sseEvent
	var text strings.Builder
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			break
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case strings.HasPrefix(line, "id: "):
			cur.id = line[4:]
		case strings.HasPrefix(line, "data: "):
			cur.data = line[6:]
		case line == "":
			if cur.data == "" {
				continue
			}
			res.events = append(res.events, cur)
			switch {
			case cur.data == "[DONE]":
				res.done = true
			case strings.HasPrefix(cur.data, `{"error"`):
				res.errorBody = cur.data
			default:
				var chunk struct {
					Choices []struct {
						Text  string `json:"text"`
						Delta struct {
							Content string `json:"content"`
						} `json:"delta"`
						FinishReason *string `json:"finish_reason"`
					} `json:"choices"`
				}
				if err := json.Unmarshal([]byte(cur.data), &chunk); err != nil {
					t.Errorf("bad chunk %q: %v", cur.data, err)
				}
				for _, c := range chunk.Choices {
					text.WriteString(c.Text)
					text.WriteString(c.Delta.Content)
					if c.FinishReason != nil {
						res.finish = *c.FinishReason
					}
				}
			}
			if onEvent != nil {
				onEvent(cur)
			}
			cur = sseEvent{}
		}
	}
	res.text = text.String()
	return res
}

// checkContiguous checks the stream's ids: non-decreasing token offsets that
// advance by exactly the tokens each event carried, starting after from.
func checkIDs(t testing.TB, res sseResult, from int) {
	t.Helper()
	prev := from
	for _, e := range res.events {
		n, err := strconv.Atoi(e.id)
		if err != nil {
			t.Fatalf("event without a numeric id: %+v", e)
		}
		if n < prev {
			t.Fatalf("ids go backwards: %d after %d", n, prev)
		}
		prev = n
	}
	if got, want := prev-from, len(strings.Fields(res.text)); got != want {
		t.Fatalf("ids advance by %d tokens, but %d tokens arrived", got, want)
	}
}

func jsonBody(v any) *bytes.Reader {
	data, _ := json.Marshal(v)
	return bytes.NewReader(data)
}
