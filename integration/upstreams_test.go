package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
)

// The OpenAI engine against its upstreams. Issue 22: real upstreams as they
// are. Each test is one of its numbered failures, against the vLLM simulator
// set up as the upstream that showed it. Last, an upstream that is another
// baton.

// healthOf is GET /health's status code and body.
func healthOf(t testing.TB, fe *frontend) (int, map[string]any) {
	t.Helper()
	var body map[string]any
	return getDecoded(t, fe.url+"/health", &body), body
}

// listedModels are the ids GET /v1/models lists.
func listedModels(t testing.TB, fe *frontend) []string {
	t.Helper()
	var out struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	getJSON(t, fe.url+"/v1/models", 200, &out)
	var ids []string
	for _, m := range out.Data {
		ids = append(ids, m.ID)
	}
	return ids
}

// TestUpstreamListingIsAdvisory (failure 1): an upstream that lists
// "tiny:latest" while serving "tiny" (Ollama) serves; one that does not
// serve the model at all leaves its worker not ready in the server's words,
// and /health says 503 while every worker is not ready.
func TestUpstreamListingIsAdvisory(t *testing.T) {
	ollama := startSim(t, "ollama-like", "--model", "tiny", "--listed-model", "tiny:latest", "--greedy")
	s := newStack(t)
	fe := s.frontend(nil)
	s.worker("wrong", "--engine", "openai", "--openai-url", ollama.url, "--openai-model", "huge", "--model", "tiny")
	waitFor(t, 20*time.Second, "worker wrong not ready", func() bool {
		ws, err := fe.workers()
		return err == nil && len(ws) == 1 && ws[0].State == "not_ready"
	})
	ws, _ := fe.workers()
	if r := ws[0].Reason; !strings.Contains(r, "404") || !strings.Contains(r, "huge") {
		t.Errorf("reason %q, want the server's 404 for model huge", r)
	}
	if code, body := healthOf(t, fe); code != http.StatusServiceUnavailable || body["reason"] != "no_routable_workers" {
		t.Errorf("/health with every worker not ready: %d %v, want 503 no_routable_workers", code, body)
	}
	if got := listedModels(t, fe); len(got) != 0 {
		t.Errorf("/v1/models with no ready worker lists %v, want nothing (failure 12)", got)
	}

	s.worker("tiny", "--engine", "openai", "--openai-url", ollama.url, "--openai-model", "tiny", "--model", "tiny")
	fe.waitRoutable(t, "tiny")
	if code, body := healthOf(t, fe); code != http.StatusOK {
		t.Errorf("/health with a ready worker: %d %v, want 200", code, body)
	}
	if got := listedModels(t, fe); len(got) != 1 || got[0] != "tiny" {
		t.Errorf("/v1/models with tiny ready lists %v, want [tiny]", got)
	}
	body := chatRequest("hello there", 5, map[string]any{"model": "tiny"})
	res := postStream(t, fe.url, "/v1/chat/completions", body, nil, nil)
	if !res.done || res.header.Get("X-Worker-Id") != "tiny" {
		t.Errorf("request: done %v on %q, want done on tiny", res.done, res.header.Get("X-Worker-Id"))
	}
}

// TestUpstreamPoisonedRequest (failure 2): a request that every upstream
// answers with 500 before any token (Ollama's answer to an invalid JSON
// schema) fails with the upstream's status and message after two workers
// gave the same answer; no worker is inhibited, so every other client keeps
// getting 200 in the inhibition window that follows.
func TestUpstreamPoisonedRequest(t *testing.T) {
	t.Parallel()
	simA := startSim(t, "sim-a", "--greedy")
	simB := startSim(t, "sim-b", "--greedy")
	s := newStack(t)
	fe := s.frontend(nil, "--migration-limit", "3")
	s.openaiWorker("a", simA)
	s.openaiWorker("b", simB)
	fe.waitRoutable(t, "a", "b")

	for _, stream := range []bool{true, false} {
		id := fmt.Sprintf("poisoned-%v", stream)
		body := chatRequest("a schema nobody can follow", 8, map[string]any{
			"vllmsim_fault": map[string]any{"spec": "500", "key": id}})
		var status int
		var errBody string
		if stream {
			res := postStream(t, fe.url, "/v1/chat/completions", body, map[string]string{"X-Request-Id": id}, nil)
			status, errBody = res.status, res.errorBody
		} else {
			resp := post(t, fe.url+"/v1/chat/completions", body, map[string]string{"X-Request-Id": id})
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			status, errBody = resp.StatusCode, string(raw)
		}
		if status != http.StatusInternalServerError || !strings.Contains(errBody, "simulated 500") {
			t.Errorf("stream %v: poisoned request got %d %s, want the upstream's 500 and its message", stream, status, errBody)
		}
		st := fe.state(t, id)
		if st.Status != "failed" || len(st.Attempts) != 2 || st.Attempts[0].WorkerID == st.Attempts[1].WorkerID {
			t.Errorf("stream %v: state %+v, want failed after one attempt on each worker", stream, st)
		}

		// Within the inhibition window (5 s by default) every other client
		// is served, by both workers.
		var wg sync.WaitGroup
		errs := make(chan string, 8)
		for i := range 8 {
			wg.Go(func() {
				res := postStream(t, fe.url, "/v1/chat/completions", chatRequest(fmt.Sprintf("an ordinary question %d", i), 4, nil), nil, nil)
				if res.status != http.StatusOK || !res.done {
					errs <- fmt.Sprintf("request %d: status %d done %v %s", i, res.status, res.done, res.errorBody)
				}
			})
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Errorf("stream %v: after a poisoned request, %s; want 200", stream, e)
		}
		if ws, err := fe.workers(); err != nil || len(ws) != 2 || ws[0].State != "ready" || ws[1].State != "ready" {
			t.Errorf("workers %+v, %v: want both ready (their servers pass the probe)", ws, err)
		}
	}
}

// TestUpstreamQueueIsNotAStall (failure 3): an engine with one slot queues
// the others and sends nothing while they wait. With a stall timeout shorter
// than the queue time, no request is fenced as stalled, the pinned one
// included: before an attempt's first token only the worker's first-token
// deadline applies.
func TestUpstreamQueueIsNotAStall(t *testing.T) {
	t.Parallel()
	sim := startSim(t, "sim-queue", "--greedy", "--slots", "1", "--token-delay", "40ms")
	s := newStack(t)
	fe := s.frontend(nil, "--migration-limit", "3", "--stall-timeout", "1s")
	s.openaiWorker("q", sim, "--first-token-timeout", "30s")
	fe.waitRoutable(t, "q")

	var wg sync.WaitGroup
	results := make([]sseResult, 4)
	for i := range results {
		header := map[string]string{"X-Request-Id": fmt.Sprintf("queued-%d", i)}
		if i == len(results)-1 {
			header["X-Worker-Id"] = "q" // pinned: never migrated, so a stall fence would fail it
		}
		wg.Go(func() {
			results[i] = postStream(t, fe.url, "/v1/chat/completions", chatRequest(fmt.Sprintf("wait your turn %d", i), 25, nil), header, nil)
		})
	}
	wg.Wait()
	for i, res := range results {
		id := fmt.Sprintf("queued-%d", i)
		if res.status != http.StatusOK || !res.done {
			t.Errorf("%s: status %d done %v %s; want a whole answer", id, res.status, res.done, res.errorBody)
			continue
		}
		if st := fe.state(t, id); len(st.Attempts) != 1 || len(st.Migrations) != 0 {
			t.Errorf("%s: %d attempts, migrations %+v; want one attempt: queue time is not a stall", id, len(st.Attempts), st.Migrations)
		}
	}
}

// TestUpstreamFirstTokenTimeoutFires (failure 3): a silent upstream is
// failed by the worker's own first-token deadline, not by the frontend's
// shorter stall timeout, and the request continues on the other worker.
func TestUpstreamFirstTokenTimeoutFires(t *testing.T) {
	t.Parallel()
	sim := startSim(t, "sim-silent", "--greedy")
	s := newStack(t)
	fe := s.frontend(nil, "--migration-limit", "3", "--stall-timeout", "1s")
	s.openaiWorker("s1", sim, "--first-token-timeout", "3s")
	s.openaiWorker("s2", sim, "--first-token-timeout", "3s")
	fe.waitRoutable(t, "s1", "s2")
	body := chatRequest("say nothing at first", 6, map[string]any{"vllmsim_fault": map[string]any{"spec": "stall", "key": "silent"}})
	res := postStream(t, fe.url, "/v1/chat/completions", body, map[string]string{"X-Request-Id": "silent"}, nil)
	if res.status != http.StatusOK || !res.done {
		t.Fatalf("status %d done %v %s; want the answer from the other worker", res.status, res.done, res.errorBody)
	}
	st := fe.state(t, "silent")
	if len(st.Attempts) != 2 || !strings.Contains(st.Attempts[0].CloseMessage, "first token") || st.Attempts[0].CloseReason == "stalled" {
		t.Errorf("attempts %+v; want the first closed by the worker's first-token timeout, not as stalled", st.Attempts)
	}
}

// TestUpstreamStallAfterFirstToken (failure 3): once an attempt has its first
// token, the stall timeout applies between tokens at once, however long the
// worker's first-token deadline.
func TestUpstreamStallAfterFirstToken(t *testing.T) {
	sim := startSim(t, "sim-stall", "--greedy")
	s := newStack(t)
	fe := s.frontend(nil, "--migration-limit", "3", "--stall-timeout", "1s")
	s.openaiWorker("t1", sim, "--first-token-timeout", "60s")
	s.openaiWorker("t2", sim, "--first-token-timeout", "60s")
	fe.waitRoutable(t, "t1", "t2")
	body := chatRequest("stop after two", 6, map[string]any{"vllmsim_fault": map[string]any{"spec": "stall@2", "key": "stall2"}})
	start := time.Now()
	res := postStream(t, fe.url, "/v1/chat/completions", body, map[string]string{"X-Request-Id": "stall2"}, nil)
	took := time.Since(start)
	if res.status != http.StatusOK || !res.done {
		t.Fatalf("status %d done %v %s; want the answer continued elsewhere", res.status, res.done, res.errorBody)
	}
	st := fe.state(t, "stall2")
	if len(st.Attempts) != 2 || st.Attempts[0].CloseReason != "stalled" {
		t.Errorf("attempts %+v; want the first fenced as stalled", st.Attempts)
	}
	if took > 20*time.Second {
		t.Errorf("took %v: the stall timeout (1s) must start at the first token, not after the first-token deadline (60s)", took)
	}
}

// startSimOn starts a simulator on port, as startSim does.
func startSimOn(t testing.TB, name string, port int, args ...string) *simProc {
	t.Helper()
	all := append([]string{"--port", strconv.Itoa(port), "--model", "sim"}, args...)
	s := &simProc{proc: startBin(t, vllmsimBin, name, nil, all...), url: "http://127.0.0.1:" + strconv.Itoa(port)}
	waitFor(t, 20*time.Second, name+" to serve", func() bool { return answers200(http.DefaultClient, s.url+"/health") })
	return s
}

// simsAB starts a stack with one frontend (--migration-limit 3) and the
// OpenAI workers a, in front of simA, and b, in front of simB.
func simsAB(t *testing.T, simA, simB *simProc) *frontend {
	t.Helper()
	s := newStack(t)
	fe := s.frontend(nil, "--migration-limit", "3")
	s.openaiWorker("a", simA)
	s.openaiWorker("b", simB)
	fe.waitRoutable(t, "a", "b")
	return fe
}

// loadB pins a chat answer of n tokens, long-on-b, to worker b, and returns
// once the frontend counts it against b; its result comes on the channel.
func loadB(t *testing.T, fe *frontend, n int) <-chan sseResult {
	t.Helper()
	long := make(chan sseResult, 1)
	go func() {
		long <- postStream(t, fe.url, "/v1/chat/completions", chatRequest("a long story", n, nil), map[string]string{"X-Worker-Id": "b", "X-Request-Id": "long-on-b"}, nil)
	}()
	waitFor(t, 10*time.Second, "b loaded", func() bool {
		w, ok := fe.workerNamed("b")
		return ok && w.Load.ActiveRequests == 1
	})
	return long
}

func workerState(t testing.TB, fe *frontend, id string) string {
	w, _ := fe.workerNamed(id)
	return w.State
}

// TestUpstreamDeadAndRecovered (failures 7 and 9): a worker whose upstream
// dies is noticed at once (the failed request makes it probe its server,
// and it turns not ready) instead of costing every request routed there a
// failed attempt; once the upstream is back, the worker is ready within a
// probe interval and gets traffic again within one inhibition period.
func TestUpstreamDeadAndRecovered(t *testing.T) {
	port := freePort(t)
	simA := startSimOn(t, "sim-a", port, "--greedy")
	simB := startSim(t, "sim-b", "--greedy", "--token-delay", "20ms")
	fe := simsAB(t, simA, simB)
	// A long answer pinned to b keeps it loaded, so that a, once routable,
	// is the least loaded worker.
	long := loadB(t, fe, 1000)

	simA.signal(syscall.SIGKILL)
	res := postStream(t, fe.url, "/v1/chat/completions", chatRequest("while a is down", 4, nil), map[string]string{"X-Request-Id": "down-1"}, nil)
	if res.status != http.StatusOK || !res.done || res.header.Get("X-Worker-Id") != "b" {
		t.Fatalf("request while a's upstream is down: status %d done %v on %q, want 200 from b", res.status, res.done, res.header.Get("X-Worker-Id"))
	}
	waitFor(t, 10*time.Second, "a not ready after its upstream failed", func() bool { return workerState(t, fe, "a") == "not_ready" })

	startSimOn(t, "sim-a-again", port, "--greedy")
	back := time.Now()
	waitFor(t, 15*time.Second, "a ready again", func() bool { return workerState(t, fe, "a") == "ready" })
	readyAfter := time.Since(back)
	var servedAfter time.Duration
	for i := 0; ; i++ {
		res := postStream(t, fe.url, "/v1/chat/completions", chatRequest(fmt.Sprintf("after the outage %d", i), 2, nil), nil, nil)
		if res.status != http.StatusOK || !res.done {
			t.Fatalf("request %d after the outage: status %d %s", i, res.status, res.errorBody)
		}
		if res.header.Get("X-Worker-Id") == "a" {
			servedAfter = time.Since(back)
			break
		}
		if time.Since(back) > 20*time.Second {
			t.Fatalf("a not used again within 20 s of its upstream's return (%d requests to b)", i+1)
		}
	}
	t.Logf("upstream back: a ready after %v, served a request after %v", readyAfter, servedAfter)
	if servedAfter > readyAfter+6*time.Second {
		t.Errorf("a served again %v after its upstream returned, ready after %v: want within one inhibition period (5 s) of ready", servedAfter, readyAfter)
	}
	post(t, fe.url+"/v1/requests/long-on-b/cancel", map[string]any{"mode": "stop"}, nil).Body.Close()
	if r := <-long; !r.done {
		t.Errorf("the long answer on b did not complete: %s", r.errorBody)
	}
}

// simChunks is the content of each streamed chunk of a direct chat request.
func simChunks(t *testing.T, sim *simProc, body map[string]any) []string {
	t.Helper()
	b := maps.Clone(body)
	b["stream"] = true
	resp := post(t, sim.url+"/v1/chat/completions", b, nil)
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(data), &c) == nil && len(c.Choices) > 0 && c.Choices[0].Delta.Content != "" {
			out = append(out, c.Choices[0].Delta.Content)
		}
	}
	return out
}

// usageOf is the completion_tokens of a non-streaming answer's usage, or of
// a stream's usage chunk.
func usageOf(t *testing.T, data []string) int {
	t.Helper()
	for _, d := range data {
		var c struct {
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(d), &c) == nil && c.Usage != nil {
			return c.Usage.CompletionTokens
		}
	}
	t.Fatalf("no usage in %q", data)
	return 0
}

// TestUpstreamUsageIsTheServers (failure 6): a server that hides a matched
// stop sequence streams one event fewer than it counts tokens; the usage a
// client gets through baton is the server's count, streaming or not.
func TestUpstreamUsageIsTheServers(t *testing.T) {
	sim := startSim(t, "sim-usage", "--greedy", "--no-token-ids")
	s := newStack(t)
	fe := s.frontend(nil)
	s.openaiWorker("u", sim)
	fe.waitRoutable(t, "u")

	base := chatRequest("count my words please", 10, nil)
	chunks := simChunks(t, sim, base)
	k := -1 // a chunk whose text first occurs where it starts: the stop there hides that whole token
	for i := 2; i < len(chunks); i++ {
		before := strings.Join(chunks[:i], "")
		if strings.TrimSpace(chunks[i]) != "" && strings.Index(before+chunks[i], chunks[i]) == len(before) {
			k = i
			break
		}
	}
	if k < 0 {
		t.Fatalf("no usable stop in %q", chunks)
	}
	body := chatRequest("count my words please", 10, map[string]any{"stop": chunks[k]})
	resp := post(t, sim.url+"/v1/chat/completions", body, nil)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := usageOf(t, []string{string(raw)})
	if want != k+1 {
		t.Fatalf("the server counts %d tokens for %d streamed: the test needs it to count the hidden stop token", want, k)
	}

	resp = post(t, fe.url+"/v1/chat/completions", body, nil)
	raw, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if got := usageOf(t, []string{string(raw)}); got != want {
		t.Errorf("non-streaming usage through baton: %d completion tokens, want the server's %d", got, want)
	}
	sb := maps.Clone(body)
	sb["stream_options"] = map[string]any{"include_usage": true}
	res := postStream(t, fe.url, "/v1/chat/completions", sb, nil, nil)
	var data []string
	for _, e := range res.events {
		data = append(data, e.data)
	}
	if got := usageOf(t, data); got != want || res.text != strings.Join(chunks[:k], "") {
		t.Errorf("streaming through baton: usage %d text %q, want the server's %d and %q", got, res.text, want, strings.Join(chunks[:k], ""))
	}
}

// modelsOf are the "model" fields of an answer's chunks (or of its body).
func modelsOf(data []string) map[string]bool {
	out := map[string]bool{}
	for _, d := range data {
		var c struct {
			Model *string `json:"model"`
		}
		if json.Unmarshal([]byte(d), &c) == nil && c.Model != nil {
			out[*c.Model] = true
		}
	}
	return out
}

// TestUpstreamModelInTheAnswer (failure 10): an answer names the model the
// upstream server streamed, not the client's alias; a frontend with
// --client-model names the alias. The choice is recorded with the request,
// so a resume on another frontend says the same.
func TestUpstreamModelInTheAnswer(t *testing.T) {
	sim := startSim(t, "sim-model", "--greedy", "--model", "org/served-7b")
	s := newStack(t)
	fe := s.frontend(nil)
	alias := s.frontend(nil, "--client-model")
	s.worker("m", "--engine", "openai", "--openai-url", sim.url, "--openai-model", "org/served-7b", "--model", "tiny")
	fe.waitRoutable(t, "m")
	alias.waitRoutable(t, "m")

	for _, tc := range []struct {
		fe   *frontend
		want string
	}{{fe, "org/served-7b"}, {alias, "tiny"}} {
		body := chatRequest("name yourself", 4, map[string]any{"model": "tiny"})
		res := postStream(t, tc.fe.url, "/v1/chat/completions", body, map[string]string{"X-Request-Id": "model-" + tc.want[:3]}, nil)
		var data []string
		for _, e := range res.events {
			data = append(data, e.data)
		}
		if got := modelsOf(data); !res.done || len(got) != 1 || !got[tc.want] {
			t.Errorf("%s: streamed models %v, want only %q", tc.fe.Name, got, tc.want)
		}
		resp := post(t, tc.fe.url+"/v1/chat/completions", chatRequest("name yourself", 4, map[string]any{"model": "tiny", "stream": false}), nil)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if got := modelsOf([]string{string(raw)}); len(got) != 1 || !got[tc.want] {
			t.Errorf("%s: non-streaming model %v, want %q: %s", tc.fe.Name, got, tc.want, raw)
		}
	}
	// The request accepted on fe, replayed on the --client-model frontend,
	// names what fe recorded: the upstream's model.
	resp, err := http.Get(alias.url + "/v1/requests/model-org/stream")
	if err != nil {
		t.Fatal(err)
	}
	res := readStream(t, resp, nil)
	var data []string
	for _, e := range res.events {
		data = append(data, e.data)
	}
	if got := modelsOf(data); len(got) != 1 || !got["org/served-7b"] {
		t.Errorf("resumed elsewhere: models %v, want the recorded org/served-7b", got)
	}
}

// TestUpstreamTemplatedCompletionsFailCleanly (failure 4): a server that
// wraps completions prompts in a chat template (Ollama) is probed as unable
// to continue completions by prefill; a completions request whose worker
// dies mid-answer then fails cleanly (an error event, no [DONE]) instead of
// continuing with an answer to another prompt presented as a success.
func TestUpstreamTemplatedCompletionsFailCleanly(t *testing.T) {
	t.Parallel()
	simA := startSim(t, "sim-tmpl-a", "--greedy", "--templated-completions", "--no-token-ids", "--token-delay", "40ms")
	simB := startSim(t, "sim-tmpl-b", "--greedy", "--templated-completions", "--no-token-ids", "--token-delay", "40ms")
	s := newStack(t)
	fe := s.frontend(nil, "--migration-limit", "3")
	s.openaiWorker("t1", simA)
	s.openaiWorker("t2", simB)
	fe.waitRoutable(t, "t1", "t2")
	for _, w := range []string{"t1", "t2"} {
		for _, d := range fe.listWorkers(t) {
			if d.ID == w && !d.Capabilities["completions_not_continuable"] {
				t.Errorf("%s capabilities %v: want completions_not_continuable", w, d.Capabilities)
			}
		}
	}
	var once sync.Once
	body := map[string]any{"model": "sim", "prompt": "tell me a long story about rivers", "max_tokens": 30}
	res := postStream(t, fe.url, "/v1/completions", body, map[string]string{"X-Request-Id": "tmpl"}, func(e sseEvent) {
		if n, err := strconv.Atoi(e.id); err == nil && n >= 5 {
			once.Do(func() { s.workers[fe.servingWorker(t, "tmpl")].signal(syscall.SIGKILL) })
		}
	})
	if res.done || !strings.Contains(res.errorBody, "continue") {
		t.Fatalf("done %v, error %q; want an error event about continuing and no [DONE]", res.done, res.errorBody)
	}
}

// TestUpstreamSlowFirstTokenNamesNoWorker (item 12): when a stream's headers
// go out before its first token (after the 10 s wait: here it queues behind
// a long answer in a one-slot engine), X-Worker-Id is absent rather than
// naming a worker that may never produce a token.
func TestUpstreamSlowFirstTokenNamesNoWorker(t *testing.T) {
	t.Parallel()
	sim := startSim(t, "sim-slow", "--greedy", "--slots", "1", "--token-delay", "50ms")
	s := newStack(t)
	fe := s.frontend(nil)
	s.openaiWorker("slow", sim)
	fe.waitRoutable(t, "slow")
	long := make(chan sseResult, 1)
	go func() {
		long <- postStream(t, fe.url, "/v1/chat/completions", chatRequest("hold the slot", 240, nil), map[string]string{"X-Request-Id": "holder"}, nil)
	}()
	waitFor(t, 10*time.Second, "the slot taken", func() bool {
		var st struct {
			Running int `json:"running"`
		}
		getJSON(t, sim.url+"/sim/status", 200, &st)
		return st.Running == 1
	})
	res := postStream(t, fe.url, "/v1/chat/completions", chatRequest("take your time", 2, nil), nil, nil)
	if res.status != http.StatusOK || !res.done {
		t.Fatalf("status %d done %v %s", res.status, res.done, res.errorBody)
	}
	if got := res.header.Get("X-Worker-Id"); got != "" {
		t.Errorf("X-Worker-Id %q on headers sent before the first token, want none", got)
	}
	if r := <-long; !r.done || r.header.Get("X-Worker-Id") != "slow" {
		t.Errorf("the holder: done %v, X-Worker-Id %q; want done and named", r.done, r.header.Get("X-Worker-Id"))
	}
}

// TestOpenAIEngineThroughAnotherBaton runs a worker with --engine openai
// whose OpenAI-compatible server is another baton frontend (backed by mock
// workers): a request through the first frontend reaches the mock engine
// through two hops and its text comes back byte for byte. The OpenAI engine
// counts one token per streamed event of its server, so the relay's token
// offsets follow the upstream's events, not the mock's words.
func TestOpenAIEngineThroughAnotherBaton(t *testing.T) {
	_, upstream := startBasic(t)
	s := newStack(t)
	fe := s.frontend(nil)
	s.worker("oa1", "--engine", "openai", "--openai-url", upstream.url, "--openai-model", "mock", "--model", "relay")
	fe.waitRoutable(t, "oa1")
	prompt := "relayed through two frontends"
	res := postStream(t, fe.url, "/v1/completions", map[string]any{"model": "relay", "prompt": prompt, "max_tokens": 40},
		map[string]string{"X-Request-Id": "relay-1"}, nil)
	if !res.done || res.finish != "length" {
		t.Fatalf("done=%v finish=%q error=%s", res.done, res.finish, res.errorBody)
	}
	if want := engine.MockText(prompt, 0, 40); res.text != want {
		t.Fatalf("relayed text differs:\n got %q\nwant %q", res.text, want)
	}
	prev := 0
	for _, e := range res.events {
		n, err := strconv.Atoi(e.id)
		if err != nil || n < prev {
			t.Fatalf("bad id sequence at %q after %d", e.id, prev)
		}
		prev = n
	}
	if st := fe.state(t, "relay-1"); st.TokensGenerated != prev || st.Status != "completed" {
		t.Errorf("state %+v, want completed with %d tokens (the last SSE id)", st, prev)
	}
}
