package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
)

// The request log's lifecycle: finished requests compacted (every
// rendering kept, and held back beside earlier frontends), the soak of the
// whole cycle under faults, and live traffic only where it is read.

// renderings is everything a client or an operator can read of one request:
// the state, SSE resumes from the start, the middle and the end, a re-POST
// of the same body (an idempotent retry: the answer again), and baton
// replay's state and output.
type renderings map[string]string

func readRenderings(t *testing.T, s *stack, f *frontend, id string, body map[string]any, mid int) renderings {
	t.Helper()
	r := renderings{}
	get := func(name, path string) {
		resp, err := http.Get(f.url + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		r[name] = fmt.Sprintf("%d %s", resp.StatusCode, b)
	}
	get("state", "/v1/requests/"+id)
	for _, from := range []int{0, mid, 1 << 20} {
		get(fmt.Sprintf("resume after %d", from), fmt.Sprintf("/v1/requests/%s/stream?starting_after=%d", id, from))
	}
	data, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, f.url+body["_path"].(string), bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	r["re-POST"] = fmt.Sprintf("%d %s", resp.StatusCode, b)
	out, errOut, code := runTool(t, batonBin, "replay", "--json", "--nats", s.natsURL, id)
	if code != 0 {
		t.Fatalf("replay %s: exit %d: %s", id, code, errOut)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("replay --json: %v", err)
	}
	r["replay state"], r["replay output"] = string(doc["request"]), string(doc["output"])
	r["timeline"] = string(doc["timeline"])
	return r
}

// TestCompactionKeepsEveryRendering: a finished request reads the same,
// byte for byte, before and after its deltas are folded into its compact
// record: a plain stream, one migrated after its worker was killed, a
// non-streaming chat and the choices of an n=2 request. A frontend that
// does not compact (--log-compaction=false) serves them first; `baton
// compact` then compacts them by hand, as the owner does at the end.
func TestCompactionKeepsEveryRendering(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	f := s.frontend(nil, "--log-compaction=false", "--migration-limit", "3")
	s.worker("w1", "--mock-tokens-per-sec", "300", "--mock-ttft", "5ms")
	s.worker("w2", "--mock-tokens-per-sec", "300", "--mock-ttft", "5ms")
	f.waitRoutable(t, "w1", "w2")

	type req struct {
		id   string
		body map[string]any
		mid  int
	}
	reqs := []req{
		{"lc-plain", map[string]any{"_path": "/v1/completions", "model": "mock", "prompt": "the plain one", "max_tokens": 30, "stream": true}, 7},
		{"lc-migrated", map[string]any{"_path": "/v1/chat/completions", "model": "mock", "max_tokens": 80, "stream": true,
			"messages": []map[string]string{{"role": "user", "content": "migrated half way"}}}, 40},
		{"lc-unary", map[string]any{"_path": "/v1/chat/completions", "model": "mock", "max_tokens": 20,
			"messages": []map[string]string{{"role": "user", "content": "no stream"}}}, 3},
		{"lc-n", map[string]any{"_path": "/v1/completions", "model": "mock", "prompt": "two choices", "max_tokens": 12, "n": 2}, 4},
	}
	for _, r := range reqs {
		body := map[string]any{}
		for k, v := range r.body {
			if k != "_path" {
				body[k] = v
			}
		}
		hdr := map[string]string{"X-Request-Id": r.id}
		if r.id == "lc-migrated" {
			var once sync.Once
			res := postStream(t, f.url, r.body["_path"].(string), body, hdr, func(e sseEvent) {
				n := 0
				fmt.Sscan(e.id, &n)
				if n >= 20 {
					once.Do(func() { s.workers[f.servingWorker(t, r.id)].signal(syscall.SIGKILL) })
				}
			})
			if !res.done || len(strings.Fields(res.text)) != 80 {
				t.Fatalf("migrated stream: done %v, %d tokens: %s", res.done, len(strings.Fields(res.text)), res.errorBody)
			}
			continue
		}
		resp := post(t, f.url+r.body["_path"].(string), body, hdr)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", r.id, resp.StatusCode)
		}
	}
	ids := []string{"lc-plain", "lc-migrated", "lc-unary", "lc-n-0", "lc-n-1"}
	bodyOf := func(id string) (map[string]any, int) {
		for _, r := range reqs {
			if strings.HasPrefix(id, r.id) {
				return r.body, r.mid
			}
		}
		t.Fatalf("no body for %s", id)
		return nil, 0
	}
	before := map[string]renderings{}
	for _, id := range ids {
		body, mid := bodyOf(id)
		if id == "lc-n-0" || id == "lc-n-1" {
			body = nil // a choice is re-read through its parent
		}
		if body == nil {
			b, m := bodyOf("lc-n")
			body, mid = b, m
		}
		before[id] = readRenderings(t, s, f, id, body, mid)
		if workerDeltas(t, before[id]["timeline"]) == 0 {
			t.Fatalf("%s: the log holds no deltas before compaction (was it compacted already?)", id)
		}
	}

	out, errOut, code := runTool(t, batonBin, append([]string{"compact", "--nats", s.natsURL}, ids...)...)
	if code != 0 {
		t.Fatalf("baton compact: exit %d\n%s%s", code, out, errOut)
	}
	for _, id := range ids {
		body, mid := bodyOf(id)
		if strings.HasPrefix(id, "lc-n-") {
			body, mid = bodyOf("lc-n")
		}
		after := readRenderings(t, s, f, id, body, mid)
		if workerDeltas(t, after["timeline"]) != 0 || !strings.Contains(after["timeline"], `"baton.request.compacted.v1"`) {
			t.Fatalf("%s: after baton compact the timeline still has deltas, or no compact record:\n%s", id, after["timeline"])
		}
		for name, want := range before[id] {
			if name == "timeline" {
				continue // the deltas are gone from it: that is the point
			}
			if got := after[name]; got != want {
				t.Errorf("%s: %s changed by compaction\n got %s\nwant %s", id, name, got, want)
			}
		}
	}
	// Compacting again is harmless; a request still running is refused.
	if _, errOut, code := runTool(t, batonBin, "compact", "--nats", s.natsURL, "lc-plain"); code != 0 {
		t.Fatalf("second baton compact: exit %d: %s", code, errOut)
	}
	if _, errOut, code := runTool(t, batonBin, "compact", "--nats", s.natsURL, "lc-none"); code == 0 || !strings.Contains(errOut, "not found") {
		t.Fatalf("compact of an unknown id: exit %d: %s", code, errOut)
	}
}

// TestFinishedRequestsAreCompacted: with the defaults, the owner compacts a
// request once it ends: the log keeps its lifecycle events and one record,
// and no delta.
func TestFinishedRequestsAreCompacted(t *testing.T) {
	t.Parallel()
	s, f := oneWorker(t, []string{"--mock-tokens-per-sec", "500", "--mock-ttft", "5ms"})
	res := postStream(t, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "compact me", "max_tokens": 50},
		map[string]string{"X-Request-Id": "auto-1"}, nil)
	if !res.done {
		t.Fatalf("stream: %+v", res)
	}
	var timeline string
	waitFor(t, 20*time.Second, "the request to be compacted", func() bool {
		out, _, code := runTool(t, batonBin, "replay", "--json", "--nats", s.natsURL, "auto-1")
		timeline = out
		return code == 0 && strings.Contains(out, `"baton.request.compacted.v1"`) && workerDeltas(t, out) == 0
	})
	var doc struct {
		Output string `json:"output"`
	}
	if err := json.Unmarshal([]byte(timeline), &doc); err != nil || doc.Output != res.text {
		t.Fatalf("replay output after compaction %q (%v), want the streamed %q", doc.Output, err, res.text)
	}
}

// workerDeltas counts the token deltas a worker wrote in a replay's JSON
// (its whole document, or its timeline): after compaction none is left,
// only the compact record and the frontend's carry of the answer for
// readers that predate compact records.
func workerDeltas(t *testing.T, replayJSON string) int {
	t.Helper()
	var entries []struct {
		Type   string `json:"type"`
		Source string `json:"source"`
	}
	var doc struct {
		Timeline json.RawMessage `json:"timeline"`
	}
	raw := []byte(replayJSON)
	if json.Unmarshal(raw, &doc) == nil && doc.Timeline != nil {
		raw = doc.Timeline
	}
	if err := json.Unmarshal(raw, &entries); err != nil {
		t.Fatalf("replay's timeline: %v", err)
	}
	n := 0
	for _, e := range entries {
		if e.Type == events.TypeTokensGenerated && strings.HasPrefix(e.Source, "baton/worker/") {
			n++
		}
	}
	return n
}

// soakDuration is how long TestLogLifecycleSoak runs: BATON_LOG_SOAK (a
// duration), 20 s by default (the suite's short profile: four worker kills,
// the traffic several times the cap; .ci/run runs it for 60 s).
func soakDuration(t *testing.T) time.Duration {
	if v := os.Getenv("BATON_LOG_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("BATON_LOG_SOAK=%q: %v", v, err)
		}
		return d
	}
	return 20 * time.Second
}

// TestLogLifecycleSoak streams continuously into a request log capped far
// below what the traffic writes uncompacted (4 MiB), while a worker is
// killed (kill -9) every few seconds and comes back: compaction, eviction
// and migration together. No request hangs or gets a 500, at least 99% of
// them answer 200 (in the last 15 s too), every answer equals every other
// answer to the same prompt, every 503 carries Retry-After, and the log
// stays under its cap.
func TestLogLifecycleSoak(t *testing.T) {
	const capBytes, clients, maxTokens = 4 << 20, 12, 40
	dur := soakDuration(t)
	s := newStack(t)
	f := s.frontend(nil, "--stream-max-bytes", strconv.Itoa(capBytes), "--migration-limit", "5")
	workerArgs := []string{"--mock-tokens-per-sec", "400", "--mock-ttft", "5ms", "--lease-ttl", "3s"}
	ids := []string{"w1", "w2", "w3"}
	for _, id := range ids {
		s.worker(id, workerArgs...)
	}
	f.waitRoutable(t, ids...)

	type outcome struct {
		at       time.Time
		status   int
		done     bool
		prompt   int
		text     string
		retry    string
		errorMsg string
	}
	var mu sync.Mutex
	var outs []outcome
	var maxRatio float64
	deadline := time.Now().Add(dur)
	client := &http.Client{Timeout: 30 * time.Second} // a request slower than this hung
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				p := (c*7 + i) % 8
				data, _ := json.Marshal(map[string]any{"model": "mock", "prompt": fmt.Sprintf("soak prompt %d", p), "max_tokens": maxTokens, "stream": true})
				req, _ := http.NewRequest(http.MethodPost, f.url+"/v1/completions", bytes.NewReader(data))
				req.Header.Set("Content-Type", "application/json")
				o := outcome{prompt: p}
				resp, err := client.Do(req)
				if err != nil {
					o.errorMsg = err.Error()
				} else {
					r := readStream(t, resp, nil)
					resp.Body.Close()
					o.status, o.done, o.text, o.retry, o.errorMsg = r.status, r.done, r.text, resp.Header.Get("Retry-After"), r.errorBody
				}
				o.at = time.Now()
				mu.Lock()
				outs = append(outs, o)
				mu.Unlock()
				if o.status == 503 {
					time.Sleep(100 * time.Millisecond) // as Retry-After asks, shorter
				}
			}
		}()
	}
	// Faults: every 4 s one worker is killed and started again.
	kills := 0
	for k := 0; time.Now().Add(4 * time.Second).Before(deadline); k++ {
		waitUntil(time.Now().Add(4 * time.Second))
		id := ids[k%len(ids)]
		s.workers[id].signal(syscall.SIGKILL)
		s.workers[id].wait(10 * time.Second)
		kills++
		s.worker(id, workerArgs...)
		if v := f.metric(t, "baton_log_used_ratio", "stream", "BATON_REQUESTS"); v > maxRatio {
			maxRatio = v
		}
	}
	wg.Wait()

	want := map[int]string{}
	codes := map[string]int{}
	var ok, ok15, last15, fiveHundreds, hung, unavailable int
	tokens := 0
	for _, o := range outs {
		recent := o.at.After(deadline.Add(-15 * time.Second))
		if recent {
			last15++
		}
		switch {
		case o.status == 0:
			hung++
			t.Errorf("a request did not answer: %s", o.errorMsg)
		case o.status >= 500 && o.status != 503:
			fiveHundreds++
			t.Errorf("status %d: %s", o.status, o.errorMsg)
		case o.status == 503:
			unavailable++
			codes[jsonCode(o.errorMsg)]++
			if o.retry == "" {
				t.Errorf("503 without Retry-After: %s", o.errorMsg)
			}
		case o.status == 200 && o.done:
			ok++
			if recent {
				ok15++
			}
			tokens += len(strings.Fields(o.text))
			if w, seen := want[o.prompt]; !seen {
				want[o.prompt] = o.text
			} else if o.text != w {
				t.Errorf("prompt %d answered %q, and %q before", o.prompt, o.text, w)
			}
		default:
			t.Errorf("status %d, done %v: %s", o.status, o.done, o.errorMsg)
		}
	}
	written := float64(tokens) * 480 // what the deltas cost uncompacted, about
	t.Logf("%d requests in %v (%d ok, %d 503 %v, %d 5xx, %d hung), %d worker kills; %d tokens, about %.0f MiB uncompacted = %.1fx the %d MiB cap; highest log use %.2f",
		len(outs), dur, ok, unavailable, codes, fiveHundreds, hung, kills, tokens, written/(1<<20), written/capBytes, capBytes>>20, maxRatio)
	if len(outs) == 0 || float64(ok) < 0.99*float64(len(outs)) {
		t.Errorf("%d of %d requests answered 200, want at least 99%%", ok, len(outs))
	}
	if last15 == 0 || float64(ok15) < 0.99*float64(last15) {
		t.Errorf("in the last 15 s, %d of %d requests answered 200, want at least 99%%", ok15, last15)
	}
	// The run must have written several times the cap: otherwise nothing
	// here needed compaction or eviction (about 17x in 60 s on CI's machine).
	if want := 4 * float64(capBytes) * dur.Seconds() / 60; written < want {
		t.Errorf("the run wrote about %.0f MiB, want at least %.0f MiB to exercise the cap", written/(1<<20), want/(1<<20))
	}
	if maxRatio > 1 {
		t.Errorf("the log went past its cap: %.2f", maxRatio)
	}
}

// jsonCode is the error code of an OpenAI error body.
func jsonCode(body string) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal([]byte(body), &e)
	return e.Error.Code
}

// waitUntil blocks until t (the soak's fault clock).
func waitUntil(t time.Time) { <-time.After(time.Until(t)) }

// TestCompactionWaitsForEarlierFrontends: while a live frontend of an
// earlier release (its presence without reads_compacted) shares the log, a
// finished request keeps its deltas, since that frontend would see a
// compacted one without its tokens; once it is gone, requests are
// compacted again.
func TestCompactionWaitsForEarlierFrontends(t *testing.T) {
	t.Parallel()
	s, f := oneWorker(t, []string{"--mock-tokens-per-sec", "500", "--mock-ttft", "5ms"})
	js := s.jetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, streams.FrontendsBucket)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := json.Marshal(events.FrontendPresence{FrontendID: "fe-old", Addr: "127.0.0.1:1"})
	if _, err := kv.Put(ctx, "fe-old", old); err != nil {
		t.Fatal(err)
	}
	compacted := func(id string) (yes, known bool) {
		out, _, code := runTool(t, batonBin, "replay", "--json", "--nats", s.natsURL, id)
		return strings.Contains(out, `"baton.request.compacted.v1"`), code == 0 && strings.Contains(out, `"status": "completed"`)
	}
	listed := func() bool {
		resp, err := http.Get(f.url + "/v1/console/frontends")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), "fe-old")
	}
	waitFor(t, 20*time.Second, "the frontend to see the earlier release's frontend", listed)
	res := postStream(t, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "beside an old one", "max_tokens": 20},
		map[string]string{"X-Request-Id": "mixed-1"}, nil)
	if !res.done {
		t.Fatalf("stream: %+v", res)
	}
	waitFor(t, 20*time.Second, "mixed-1 to be completed in the log", func() bool { _, known := compacted("mixed-1"); return known })
	waitFor(t, 20*time.Second, "the frontend to say why it holds compaction back", func() bool {
		return strings.Contains(f.output(), "not compacting finished requests")
	})
	if yes, _ := compacted("mixed-1"); yes {
		t.Fatal("mixed-1 was compacted while a frontend of an earlier release was live")
	}
	if err := kv.Delete(ctx, "fe-old"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the earlier release's frontend to be gone", func() bool { return !listed() })
	res = postStream(t, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "alone again", "max_tokens": 5},
		map[string]string{"X-Request-Id": "mixed-2"}, nil)
	if !res.done {
		t.Fatalf("stream: %+v", res)
	}
	waitFor(t, 20*time.Second, "mixed-2 to be compacted", func() bool { yes, _ := compacted("mixed-2"); return yes })
}

// TestLiveTrafficOnlyWhereRead: with three frontends and every request sent
// through one, the idle two receive almost none of the requests' traffic
// (a frontend subscribes only to the hash slots of the requests it
// follows), and a resume on an idle one still works at once.
func TestLiveTrafficOnlyWhereRead(t *testing.T) {
	s := newStack(t)
	fes := []*frontend{s.frontend(nil), s.frontend(nil), s.frontend(nil)}
	s.worker("w1", "--mock-tokens-per-sec", "400", "--mock-ttft", "5ms")
	s.worker("w2", "--mock-tokens-per-sec", "400", "--mock-ttft", "5ms")
	for _, f := range fes {
		f.waitRoutable(t, "w1", "w2")
	}
	received := func() []float64 {
		out := make([]float64, len(fes))
		for i, f := range fes {
			out[i] = f.metric(t, "baton_frontend_nats_received_bytes_total")
		}
		return out
	}
	before := received()
	const n, tokens = 24, 100
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := postStream(t, fes[0].url, "/v1/completions", map[string]any{"model": "mock", "prompt": fmt.Sprintf("where read %d", i), "max_tokens": tokens}, nil, nil)
			if !r.done {
				t.Errorf("request %d: %+v", i, r)
			}
		}()
	}
	wg.Wait()
	after := received()
	serving := after[0] - before[0]
	// Its message count counts too: at least the n requests' tokens came.
	if msgs := fes[0].metric(t, "baton_frontend_nats_received_messages_total"); msgs < n*tokens/16 {
		t.Errorf("the serving frontend counts %.0f messages received, want at least %d (%d tokens, at most 16 a delta)", msgs, n*tokens/16, n*tokens)
	}
	for i := 1; i < len(fes); i++ {
		idle := after[i] - before[i]
		t.Logf("frontend %d received %.0f bytes while the serving one received %.0f (%.1f%%)", i+1, idle, serving, 100*idle/serving)
		if idle > 0.05*serving {
			t.Errorf("idle frontend %d received %.0f bytes, %.1f%% of the serving one's %.0f: want at most 5%%", i+1, idle, 100*idle/serving, serving)
		}
	}
	// A resume on an idle frontend, mid-stream: it subscribes to the slot,
	// reads the history, and follows live.
	// An event's id is the offset of its last token, and one event may
	// carry several tokens (those that came together): resume after the
	// first id of 20 or more.
	var once sync.Once
	var resumeAt atomic.Int64
	resumed := make(chan sseResult, 1)
	first := postStream(t, fes[0].url, "/v1/completions", map[string]any{"model": "mock", "prompt": "resume me elsewhere", "max_tokens": 300},
		map[string]string{"X-Request-Id": "where-resume", "X-Resumable": "true"}, func(e sseEvent) {
			if id, err := strconv.Atoi(e.id); err == nil && id >= 20 {
				once.Do(func() {
					resumeAt.Store(int64(id))
					go func() {
						resp, err := http.Get(fmt.Sprintf("%s/v1/requests/where-resume/stream?starting_after=%d", fes[1].url, id))
						if err != nil {
							t.Error(err)
							resumed <- sseResult{}
							return
						}
						defer resp.Body.Close()
						resumed <- readStream(t, resp, nil)
					}()
				})
			}
		})
	var r sseResult
	select {
	case r = <-resumed:
	case <-time.After(30 * time.Second):
		// The first stream ended without event 20 (the resume never
		// started), or the resumed one never ended.
		t.Fatalf("resume on an idle frontend: nothing after 30 s (first stream: done %v, %d tokens, status %d, error %s)",
			first.done, len(strings.Fields(first.text)), first.status, first.errorBody)
	}
	if !first.done || !r.done || first.text[len(first.text)-len(r.text):] != r.text || len(strings.Fields(r.text)) != 300-int(resumeAt.Load()) {
		t.Fatalf("resume on an idle frontend after %d: done %v with %d tokens (first done %v)", resumeAt.Load(), r.done, len(strings.Fields(r.text)), first.done)
	}
}
