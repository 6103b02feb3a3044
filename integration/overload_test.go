package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
)

// Overload rejection and worker capacity, proven against real processes.

// busyMessage is CONTRACT.md's body message of a 503 when every worker is busy.
const busyMessage = "Service temporarily unavailable: All workers are busy, please retry later"

func decodeJSON(r io.Reader, v any) error { return json.NewDecoder(r).Decode(v) }

func stringsReader(s string) io.Reader { return strings.NewReader(s) }

// apiErrorOf parses an OpenAI error body {"error":{"message","type","code"}}.
func apiErrorOf(body []byte) (apiErrorBody, error) {
	var e struct {
		Error *apiErrorBody `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		return apiErrorBody{}, fmt.Errorf("not JSON: %w: %s", err, body)
	}
	if e.Error == nil || e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == "" {
		return apiErrorBody{}, fmt.Errorf("not an OpenAI error body: %s", body)
	}
	return *e.Error, nil
}

// reply is one client's complete response to a completion request.
type reply struct {
	prompt     string
	max        int
	stream     bool
	status     int
	retryAfter string
	body       []byte    // non-streaming, or a refusal
	res        sseResult // streaming with status 200
	err        error
}

// send posts one completion and reads all of its response; it may run off
// the test goroutine.
func send(t *testing.T, url, prompt string, max int, stream bool, header map[string]string) reply {
	r := reply{prompt: prompt, max: max, stream: stream}
	body := completion(prompt, max)
	body["stream"] = stream
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := tryPost(ctx, url+"/v1/completions", body, header)
	if err != nil {
		r.err = err
		return r
	}
	defer resp.Body.Close()
	r.status, r.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
	if stream && resp.StatusCode == 200 {
		r.res = readStream(t, resp, nil)
		return r
	}
	r.body, r.err = io.ReadAll(resp.Body)
	return r
}

// checkServed checks a 200 reply: the exact fault-free text, and for a
// stream [DONE] and contiguous ids.
func checkServed(t *testing.T, r reply) {
	t.Helper()
	want := engine.MockText(r.prompt, 0, r.max)
	if r.stream {
		if !r.res.done || r.res.errorBody != "" || r.res.text != want {
			t.Errorf("%q: stream done=%v error=%q text ok=%v", r.prompt, r.res.done, r.res.errorBody, r.res.text == want)
		}
		if err := idsError(r.res); err != nil {
			t.Errorf("%q: %v", r.prompt, err)
		}
		return
	}
	var out struct {
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(r.body, &out); err != nil || len(out.Choices) != 1 || out.Choices[0].Text != want {
		t.Errorf("%q: unary body %.200s, want the exact text (%v)", r.prompt, r.body, err)
	}
}

// checkBusy checks a refusal: 503, Retry-After, and CONTRACT.md's busy
// message in OpenAI's error shape.
func checkBusy(t *testing.T, r reply) {
	t.Helper()
	e, err := apiErrorOf(r.body)
	if r.status != http.StatusServiceUnavailable || r.retryAfter == "" || err != nil || e.Message != busyMessage {
		t.Errorf("%q: status %d Retry-After %q body %s (%v); want 503, Retry-After and %q",
			r.prompt, r.status, r.retryAfter, r.body, err, busyMessage)
	}
}

// TestOverloadRejection: with --active-decode-blocks-threshold 0.5 and two
// workers of 4 KV blocks (busy from three running requests on), a flood of
// 40 requests arriving within 0.6 s makes every worker busy. Every request is either served with the exact text or
// refused with 503, Retry-After and the CONTRACT message; a burst sent
// once discovery shows both workers busy is refused entirely; and
// dynamo_frontend_model_rejection_total equals the refusals the clients saw,
// however the flood raced the load reports.
func TestOverloadRejection(t *testing.T) {
	t.Parallel()
	_, fe, _ := faultStack(t, faultOpts{workers: 2,
		workerArgs:   []string{"--mock-kv-blocks", "4", "--mock-block-size", "16"},
		frontendArgs: []string{"--migration-limit", "3", "--active-decode-blocks-threshold", "0.5"}})
	const flood, burst, max = 40, 10, 300 // 3 s per request at 100 tokens/s
	replies := make(chan reply, flood+burst)
	var wg sync.WaitGroup
	for i := range flood {
		wg.Go(func() {
			// Arrivals spread over 0.6 s (the scenario, not a
			// synchronisation): the load reports (at most every 100 ms)
			// turn the workers busy in the middle of the flood, so it
			// meets admission before, during and after that change.
			time.Sleep(time.Duration(i) * 15 * time.Millisecond)
			replies <- send(t, fe.url, fmt.Sprintf("flood %d", i), max, i%2 == 0, nil)
		})
	}
	// Every accepted request holds a KV block at least, and each worker
	// got some: both go over half of their 4 blocks and stay there while
	// their requests run (3 s).
	waitFor(t, 10*time.Second, "both workers busy in discovery", func() bool {
		ls, err := fe.workers()
		busy := 0
		for _, l := range ls {
			if l.Load.KVBlocksTotal > 0 && float64(l.Load.KVBlocksUsed)/float64(l.Load.KVBlocksTotal) > 0.5 {
				busy++
			}
		}
		return err == nil && busy == 2
	})
	burstReplies := make(chan reply, burst)
	var bwg sync.WaitGroup
	for i := range burst {
		bwg.Go(func() { burstReplies <- send(t, fe.url, fmt.Sprintf("burst %d", i), max, i%2 == 1, nil) })
	}
	bwg.Wait()
	close(burstReplies)
	wg.Wait()
	close(replies)

	refused, served := 0, 0
	for r := range burstReplies {
		if r.err != nil {
			t.Fatalf("%q: %v", r.prompt, r.err)
		}
		refused++
		checkBusy(t, r)
	}
	for r := range replies {
		switch {
		case r.err != nil:
			t.Errorf("%q: %v", r.prompt, r.err)
		case r.status == http.StatusOK:
			served++
			checkServed(t, r)
		default:
			refused++
			checkBusy(t, r)
		}
	}
	t.Logf("flood of %d + burst of %d: %d served, %d refused", flood, burst, served, refused)
	if served == 0 || refused == burst {
		t.Errorf("%d of the flood served, %d refused: want both (the flood must cross the threshold)", served, refused-burst)
	}
	got := fe.metric(t, "dynamo_frontend_model_rejection_total", "model", "mock", "endpoint", "completions")
	if got != float64(refused) {
		t.Errorf("rejection_total = %v, want %d (the 503s the clients saw)", got, refused)
	}
	if got := fe.metric(t, "dynamo_frontend_model_rejection_total"); got != float64(refused) {
		t.Errorf("rejection_total over all labels = %v, want %d", got, refused)
	}
	// Once the load is gone, requests are admitted again.
	workersIdle(t, fe)
	waitFor(t, 10*time.Second, "workers below the threshold", func() bool {
		ls, err := fe.workers()
		for _, l := range ls {
			if l.Load.KVBlocksUsed != 0 {
				return false
			}
		}
		return err == nil
	})
	checkServed(t, send(t, fe.url, "after the flood", 20, true, nil))
}

// pinStream keeps a long stream pinned to worker id (X-Worker-Id) open
// until the returned release is called; release kills it (the client goes
// away) and waits for the client to finish.
func pinStream(t *testing.T, fe *frontend, id string) (release func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		body := completion("pinned to "+id, 20000)
		body["stream"] = true
		resp, err := tryPost(ctx, fe.url+"/v1/completions", body, map[string]string{"X-Worker-Id": id})
		if err != nil {
			first <- err
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			first <- fmt.Errorf("status %d: %s", resp.StatusCode, b)
			return
		}
		buf := make([]byte, 4096)
		_, err = resp.Body.Read(buf)
		first <- err
		for err == nil {
			_, err = resp.Body.Read(buf)
		}
	}()
	var once sync.Once
	release = func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	t.Cleanup(release)
	select {
	case err := <-first:
		if err != nil {
			t.Fatalf("pin a stream to %s: %v", id, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("pin a stream to %s: no first event", id)
	}
	return release
}

// waitActive waits until discovery shows worker id with exactly n active requests.
func waitActive(t *testing.T, fe *frontend, id string, n int) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("%s to report %d active requests", id, n), func() bool {
		w, ok := fe.workerNamed(id)
		return ok && w.Load.ActiveRequests == n
	})
}

// TestMaxConcurrentRequests: w1 runs at most one request and already runs
// one; w2 is more loaded (four), so the router tries w1 first for each of three
// concurrent requests. w1 refuses each (busy), the frontend moves on to w2,
// and all three complete with the exact text. The refusals are neither
// migrations nor failures: the migration counter stays 0, and w1 is not
// inhibited: once its slot is free, the next request runs on it.
func TestMaxConcurrentRequests(t *testing.T) {
	t.Parallel()
	sysPort := freePort(t)
	_, fe, _ := faultStack(t, faultOpts{workers: 2,
		perWorker:    map[string][]string{"w1": {"--max-concurrent-requests", "1", "--system-port", strconv.Itoa(sysPort)}},
		frontendArgs: []string{"--migration-limit", "3"}})
	w1Status := &frontend{url: "http://127.0.0.1:" + strconv.Itoa(sysPort)}
	releaseW1 := pinStream(t, fe, "w1")
	waitActive(t, fe, "w1", 1)
	// Four on w2: even with the other two requests' dispatches to w1 in
	// flight (1 + 2), w1 stays the less loaded, so each request tries it.
	for range 4 {
		pinStream(t, fe, "w2")
	}
	waitActive(t, fe, "w2", 4)

	var wg sync.WaitGroup
	replies := make([]reply, 3)
	for i := range replies {
		wg.Go(func() {
			replies[i] = send(t, fe.url, fmt.Sprintf("capped %d", i), 50, i != 1, map[string]string{"X-Request-Id": fmt.Sprintf("capped-%d", i)})
		})
	}
	wg.Wait()
	for i, r := range replies {
		if r.err != nil || r.status != 200 {
			t.Fatalf("capped-%d: status %d %v %s", i, r.status, r.err, r.body)
		}
		checkServed(t, r)
		st := fe.state(t, fmt.Sprintf("capped-%d", i))
		if st.Worker != "w2" || len(st.Migrations) != 0 {
			t.Errorf("capped-%d: worker %s, migrations %+v; want w2 without a migration", i, st.Worker, st.Migrations)
		}
	}
	if got := w1Status.metric(t, "baton_worker_dispatch_refused_total", "reason", "busy"); got != 3 {
		t.Errorf("w1 refused %v dispatches as busy, want 3 (the router must have tried it first)", got)
	}
	if got := fe.metric(t, "dynamo_frontend_model_migration_total"); got != 0 {
		t.Errorf("migration_total = %v after refusals, want 0", got)
	}
	if got := fe.metric(t, "dynamo_frontend_requests_total", "status", "error"); got != 0 {
		t.Errorf("requests_total{status=error} = %v, want 0", got)
	}

	// Free w1's slot: within the 5 s inhibition window, the next request
	// must still go to w1 (the least loaded), so w1 was not inhibited.
	releaseW1()
	waitActive(t, fe, "w1", 0)
	r := send(t, fe.url, "after the refusals", 30, true, map[string]string{"X-Request-Id": "capped-after"})
	checkServed(t, r)
	if w := fe.state(t, "capped-after").Worker; w != "w1" {
		t.Errorf("the request after the refusals ran on %s, want w1 (refusals must not inhibit)", w)
	}
}

// TestNoWorkerForKnownModel: once the only worker of a model has left, a
// request for the model is refused with 503, Retry-After and a message of
// its own (not the busy one, and not counted as a busy rejection), and
// /health is 503; a model no worker ever served is a 404.
func TestNoWorkerForKnownModel(t *testing.T) {
	t.Parallel()
	s, fe, _ := faultStack(t, faultOpts{workers: 1})
	checkServed(t, send(t, fe.url, "while w1 serves", 10, false, nil))
	s.workers["w1"].signal(syscall.SIGTERM)
	if code := s.workers["w1"].wait(10 * time.Second); code != 0 {
		t.Fatalf("w1 exited %d", code)
	}
	waitFor(t, 10*time.Second, "discovery to be empty", func() bool {
		ws, err := fe.workers()
		return err == nil && len(ws) == 0
	})
	for _, stream := range []bool{false, true} {
		r := send(t, fe.url, "nobody home", 10, stream, nil)
		e, err := apiErrorOf(r.body)
		if r.status != http.StatusServiceUnavailable || r.retryAfter == "" || err != nil {
			t.Fatalf("stream=%v: status %d Retry-After %q body %s (%v); want 503 with Retry-After", stream, r.status, r.retryAfter, r.body, err)
		}
		if e.Message == busyMessage || !strings.Contains(e.Message, "mock") || e.Code == "all_workers_busy" {
			t.Errorf("stream=%v: error %+v; want a no-worker message naming the model, not the busy one", stream, e)
		}
	}
	if got := fe.metric(t, "dynamo_frontend_model_rejection_total"); got != 0 {
		t.Errorf("rejection_total = %v with no worker at all, want 0 (it counts busy rejections)", got)
	}
	if code, b := httpGet(t, fe.url+"/health"); code != http.StatusServiceUnavailable || !strings.Contains(string(b), "not_ready") {
		t.Errorf("/health with no worker: %d %s, want 503 not_ready", code, b)
	}
	body := completion("unknown model", 5)
	body["model"] = "no-such-model"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := tryPost(ctx, fe.url+"/v1/completions", body, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if e, err := apiErrorOf(b); r.StatusCode != http.StatusNotFound || err != nil || e.Code != "model_not_found" {
		t.Errorf("unknown model: %d %s, want 404 model_not_found", r.StatusCode, b)
	}
}
