package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"
)

// What baton adds to a token: BenchmarkOverhead (its rate search is in
// bench_overhead_rate_test.go) and TestServerTimingAndAddedTTFT,
// BenchmarkEngineOverhead through each engine, and the tests of the
// benchmark mode's flags (--bench-emit-time, --bench-log-off).

// timedStream is one streamed answer as a client saw it: time to first
// token and the gaps between tokens.
type timedStream struct {
	ttft   time.Duration
	itl    []time.Duration
	timing string // the durations of the Server-Timing header, by name ("" if none)
	err    error
}

// streamTimed posts a streaming chat of max tokens and times its content
// events.
func streamTimed(client *http.Client, url, prompt string, max int) timedStream {
	return streamTimedFrom(client, url, prompt, max, time.Now())
}

// streamTimedFrom is streamTimed with the time to first token counted from
// start, the moment the request was due: an open-loop client that starts a
// request late counts the delay against the answer.
func streamTimedFrom(client *http.Client, url, prompt string, max int, start time.Time) timedStream {
	body, _ := json.Marshal(map[string]any{"model": "sim", "max_tokens": max, "stream": true, "temperature": 0,
		"messages": []map[string]string{{"role": "user", "content": prompt}}})
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return timedStream{err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return timedStream{err: fmt.Errorf("status %d", resp.StatusCode)}
	}
	out := timedStream{timing: serverTimings(resp.Header.Get("Server-Timing"))}
	last := time.Time{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: {") || !strings.Contains(line, `"content":"`) {
			continue
		}
		now := time.Now()
		if last.IsZero() {
			out.ttft = now.Sub(start)
		} else {
			out.itl = append(out.itl, now.Sub(last))
		}
		last = now
	}
	if last.IsZero() {
		out.err = fmt.Errorf("no token")
	}
	return out
}

// serverTimings is a Server-Timing header's metrics in few words: each
// one's name and duration ("log 0.31, dispatch 0.12"), without the
// descriptions.
func serverTimings(h string) string {
	var parts []string
	for m := range strings.SplitSeq(h, ",") {
		fields := strings.Split(strings.TrimSpace(m), ";")
		for _, f := range fields[1:] {
			if d, ok := strings.CutPrefix(f, "dur="); ok {
				parts = append(parts, fields[0]+" "+d)
			}
		}
	}
	return strings.Join(parts, ", ")
}

// quantiles are p50, p99 and p999 of d.
func quantiles(d []time.Duration) [3]time.Duration {
	if len(d) == 0 {
		return [3]time.Duration{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return [3]time.Duration{q(0.50), q(0.99), q(0.999)}
}

// BenchmarkOverhead measures what baton adds to a streamed answer, against
// calling the engine directly, in one run with the two interleaved request
// by request: the vLLM simulator (no delay before the first token, 2 ms
// between tokens) streamed to the client directly, and the same simulator
// behind one frontend and one OpenAI-engine worker, log on. Chats of 16
// tokens, at concurrency 1 and 64. Figures: time to first token and
// inter-token latency at p50, p99 and p999, the added time (through baton
// minus direct) and the ratio. The third sub-benchmark, rate=max, does the
// same at the highest open-loop request rate baton sustains on the machine
// (see benchOverheadMaxRate).
func BenchmarkOverhead(b *testing.B) {
	const tokens = 16
	// BATON_BENCH_TRACE=dir or BATON_BENCH_PROFILE=dir: each server serves
	// pprof, and rate=max's measurements save an execution trace, or a CPU
	// profile, of each in dir (see saveProfiles).
	traces := map[string]string{}
	var natsArgs, feArgs, wArgs, simArgs []string
	if os.Getenv("BATON_BENCH_TRACE") != "" || os.Getenv("BATON_BENCH_PROFILE") != "" {
		for name, args := range map[string]*[]string{"nats": &natsArgs, "frontend": &feArgs, "worker": &wArgs, "sim": &simArgs} {
			traces[name] = fmt.Sprintf("127.0.0.1:%d", freePort(b))
			*args = []string{"--pprof-addr", traces[name]}
		}
	}
	sim := startSim(b, "sim", append([]string{"--token-delay", "2ms", "--greedy"}, simArgs...)...)
	s := newStackArgs(b, natsArgs...)
	fe := s.frontend(nil, feArgs...)
	s.openaiWorker("oa1", sim, wArgs...)
	fe.waitRoutable(b, "oa1")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	for _, conc := range []int{1, 64} {
		b.Run(fmt.Sprintf("concurrency=%d", conc), func(b *testing.B) {
			perClient := max(400/conc, 20)
			var mu sync.Mutex
			var dTTFT, bTTFT, dITL, bITL []time.Duration
			for b.Loop() {
				var wg sync.WaitGroup
				for c := range conc {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := range perClient {
							prompt := fmt.Sprintf("overhead %d %d", c, i)
							d := streamTimed(client, sim.url, prompt, tokens)
							t := streamTimed(client, fe.url, prompt, tokens)
							if d.err != nil || t.err != nil {
								b.Errorf("direct: %v, through baton: %v", d.err, t.err)
								return
							}
							mu.Lock()
							dTTFT, bTTFT = append(dTTFT, d.ttft), append(bTTFT, t.ttft)
							dITL, bITL = append(dITL, d.itl...), append(bITL, t.itl...)
							mu.Unlock()
						}
					}()
				}
				wg.Wait()
			}
			reportOverhead(b, "ttft", dTTFT, bTTFT)
			reportOverhead(b, "itl", dITL, bITL)
			b.ReportMetric(float64(len(bTTFT)), "requests_each")
		})
	}
	pids := map[string]int{"nats": s.nats.Pid(), "frontend": fe.Pid(), "worker": s.workers["oa1"].Pid(), "sim": sim.Pid()}
	b.Run("rate=max", func(b *testing.B) { benchOverheadMaxRate(b, client, sim.url, fe.url, tokens, traces, pids) })
}

// reportOverhead reports the p50, p99 and p999 of durations measured direct
// and through baton, the time baton adds at each, and the ratio at p50.
func reportOverhead(b *testing.B, name string, direct, through []time.Duration) {
	dq, tq := quantiles(direct), quantiles(through)
	for i, p := range []string{"p50", "p99", "p999"} {
		b.ReportMetric(float64(dq[i].Microseconds())/1000, name+"_direct_"+p+"_ms")
		b.ReportMetric(float64(tq[i].Microseconds())/1000, name+"_baton_"+p+"_ms")
		b.ReportMetric(float64((tq[i]-dq[i]).Microseconds())/1000, name+"_added_"+p+"_ms")
	}
	if dq[0] > 0 {
		b.ReportMetric(float64(tq[0])/float64(dq[0]), name+"_p50_ratio")
	}
}

// TestServerTimingAndAddedTTFT: every answer says where its time went
// (Server-Timing: the log append, routing and dispatch, and, once known,
// the engine's own time to first token), and the frontend's histogram of
// added time to first token counts each stream, below the time to first
// token the client saw.
func TestServerTimingAndAddedTTFT(t *testing.T) {
	_, f := oneWorker(t, []string{"--mock-tokens-per-sec", "200", "--mock-ttft", "30ms"})
	res := postStream(t, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "timed", "max_tokens": 5}, nil, nil)
	if !res.done {
		t.Fatalf("stream: %+v", res)
	}
	st := res.header.Get("Server-Timing")
	if !strings.Contains(st, "log;") || !strings.Contains(st, "dispatch;") {
		t.Errorf("a stream's Server-Timing %q, want the log append and the dispatch", st)
	}
	resp := post(t, f.url+"/v1/completions", map[string]any{"model": "mock", "prompt": "timed unary", "max_tokens": 5}, nil)
	resp.Body.Close()
	st = resp.Header.Get("Server-Timing")
	var up float64
	for _, part := range strings.Split(st, ",") {
		if strings.HasPrefix(strings.TrimSpace(part), "upstream;") {
			fmt.Sscanf(part[strings.Index(part, "dur=")+4:], "%f", &up)
		}
	}
	if !strings.Contains(st, "log;") || up < 30 || up > 5000 {
		t.Errorf("a unary answer's Server-Timing %q, want the log append and the engine's own 30 ms or more", st)
	}
	n := f.metric(t, "baton_frontend_added_ttft_seconds_count", "model", "mock")
	sum := f.metric(t, "baton_frontend_added_ttft_seconds_sum", "model", "mock")
	ttft := f.metric(t, "dynamo_frontend_time_to_first_token_seconds_sum", "model", "mock")
	if n != 1 || sum <= 0 || sum >= ttft {
		t.Errorf("added time to first token: %v observations summing %vs (time to first token %vs), want 1, below it", n, sum, ttft)
	}
	// What the process holds, beside the heap in use (docs/reference.md).
	// (0 until the process's first collection.)
	if _, ok := scrape(f.url+"/metrics", "go_gc_heap_live_bytes")["go_gc_heap_live_bytes"]; !ok {
		t.Error("no go_gc_heap_live_bytes on /metrics")
	}
}

// BenchmarkEngineOverhead measures what a token costs through each engine:
// concurrent streams through one frontend, pinned to a mock worker at full
// speed, or to an OpenAI-engine worker in front of a vLLM simulator with no
// delays; beside it the simulator's own rate, streamed to a client
// directly. The time per token through the OpenAI worker minus the
// simulator's own is what the adapter and baton add per token.
func BenchmarkEngineOverhead(b *testing.B) {
	const streams, tokens = 20, 256
	sim := startSim(b, "sim")
	s := newStack(b)
	fe := s.frontend(nil)
	s.worker("mock1", "--model", "sim", "--mock-speedup-ratio", "1e9")
	s.openaiWorker("oa1", sim)
	fe.waitRoutable(b, "mock1", "oa1")

	rate := func(url, path string, header map[string]string, i int) float64 {
		var wg sync.WaitGroup
		start := time.Now()
		for c := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res := postStream(b, url, path, map[string]any{"model": "sim", "prompt": fmt.Sprintf("bench %d %d", i, c),
					"max_tokens": tokens, "temperature": 0}, header, nil)
				if res.status != 200 || res.errorBody != "" {
					b.Errorf("stream failed: %d %s", res.status, res.errorBody)
				}
			}()
		}
		wg.Wait()
		return float64(streams*tokens) / time.Since(start).Seconds()
	}
	var mock, oa, direct float64
	n := 0
	for i := 0; b.Loop(); i++ {
		mock += rate(fe.url, "/v1/completions", map[string]string{"X-Worker-Id": "mock1"}, i)
		oa += rate(fe.url, "/v1/completions", map[string]string{"X-Worker-Id": "oa1"}, i)
		direct += rate(sim.url, "/v1/completions", nil, i)
		n++
	}
	mock, oa, direct = mock/float64(n), oa/float64(n), direct/float64(n)
	b.ReportMetric(mock, "mock_tokens/s")
	b.ReportMetric(oa, "openai_tokens/s")
	b.ReportMetric(direct, "sim_direct_tokens/s")
	b.ReportMetric(1e6/mock, "mock_us/token")
	b.ReportMetric(1e6/oa, "openai_us/token")
	b.ReportMetric(1e6/oa-1e6/direct, "openai_added_us/token")
}

// TestBenchEmitTime checks the benchmark's latency probe, measured at the
// ends: a worker run with --bench-emit-time has its mock engine write each
// token's emit time as its text, which reaches the client as any text does;
// a worker without the flag answers the mock's deterministic text.
func TestBenchEmitTime(t *testing.T) {
	s := newStack(t)
	fe := s.frontend(nil)
	s.worker("stamped", "--bench-emit-time", "--mock-tokens-per-sec", "500")
	s.worker("plain", "--mock-tokens-per-sec", "500")
	fe.waitRoutable(t, "stamped", "plain")
	const n = 40
	for _, worker := range []string{"stamped", "plain"} {
		t.Run(worker, func(t *testing.T) {
			prompt := "emit " + worker
			before := time.Now().UnixNano()
			res := postStream(t, fe.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": n},
				map[string]string{"X-Worker-Id": worker}, nil)
			after := time.Now().UnixNano()
			if !res.done {
				t.Fatalf("stream did not end with [DONE]: %q", res.errorBody)
			}
			checkIDs(t, res, 0)
			emits := engine.EmitTimes(nil, res.text)
			if worker == "plain" {
				if want := engine.MockText(prompt, 0, n); res.text != want || len(emits) != 0 {
					t.Errorf("got %q (%d emit times), want the mock's text %q", res.text, len(emits), want)
				}
				return
			}
			if len(emits) != n {
				t.Errorf("%d emit times in the text, want %d: %q", len(emits), n, res.text)
			}
			for _, v := range emits {
				if v < before || v > after {
					t.Errorf("emit time %d: want a Unix ns time within the request (%d..%d)", v, before, after)
				}
			}
			if !slices.IsSorted(emits) {
				t.Errorf("emit times out of order: %v", emits)
			}
		})
	}
}

// TestBenchLogOff checks the benchmark's log-off baseline: a worker run with
// --bench-log-off streams the whole answer to the client through a frontend,
// and the log stores none of its tokens.
func TestBenchLogOff(t *testing.T) {
	s := newStack(t)
	// Nothing of a log-off request is stored: nothing to compact either.
	fe := s.frontend(nil, "--log-compaction=false")
	s.worker("w1", "--bench-log-off", "--mock-tokens-per-sec", "500")
	fe.waitRoutable(t, "w1")
	const prompt, n = "log off", 50
	res := postStream(t, fe.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": n}, map[string]string{"X-Request-Id": "logoff-1"}, nil)
	if want := engine.MockText(prompt, 0, n); !res.done || res.text != want {
		t.Fatalf("done=%v error=%q\n got %q\nwant %q", res.done, res.errorBody, res.text, want)
	}
	checkIDs(t, res, 0)
	js := s.jetStream(t)
	if stored, deltas, _ := storedTokens(t, js, "logoff-1"); stored != 0 {
		t.Errorf("the log stores %d tokens in %d deltas; want none with the log off", stored, deltas)
	}
}
