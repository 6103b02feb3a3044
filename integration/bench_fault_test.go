package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// Benchmarks of faults: the stall a client sees in a migration, and the
// latency of a resume, of a chat stream's and of a response's.

// percentile returns the p-th percentile (0..1) of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p * float64(len(sorted)-1))
	return sorted[i]
}

// BenchmarkMigrationStall measures the stall a streaming client sees when
// its worker is killed with SIGKILL: from the last token before the kill to
// the first token after it, over 50 kills, for the disconnect-advisory fast
// path and for the lease-TTL path (1 s TTL).
func BenchmarkMigrationStall(b *testing.B) {
	for _, path := range []string{"advisory", "ttl"} {
		b.Run(path, func(b *testing.B) {
			const kills = 50
			s := newStack(b)
			args := []string{"--migration-limit", "100"}
			workerArgs := []string{"--mock-tokens-per-sec", "200", "--mock-ttft", "5ms"}
			if path == "advisory" {
				args = append(args, "--nats-system-url", s.sysURL())
			} else {
				workerArgs = append(workerArgs, "--lease-ttl", "1s")
			}
			fe := s.frontend(nil, args...)
			next := 0
			spawn := func() {
				next++
				s.worker("w"+strconv.Itoa(next), workerArgs...)
			}
			for range 3 {
				spawn()
			}
			fe.waitRoutable(b, "w1", "w2", "w3")
			var stalls []time.Duration
			for b.Loop() {
				stalls = stalls[:0]
				for k := range kills {
					id := fmt.Sprintf("stall-%s-%d-%d", path, b.N, k)
					var (
						mu       sync.Mutex
						lastAt   time.Time
						killedAt time.Time
						stall    time.Duration
						once     sync.Once
					)
					res := postStream(b, fe.url, "/v1/completions", map[string]any{"model": "mock", "prompt": id, "max_tokens": 120},
						map[string]string{"X-Request-Id": id}, func(e sseEvent) {
							now := time.Now()
							mu.Lock()
							defer mu.Unlock()
							if !killedAt.IsZero() && stall == 0 {
								stall = now.Sub(lastAt)
							}
							lastAt = now
							if n, _ := strconv.Atoi(e.id); n >= 20 {
								once.Do(func() {
									w := fe.servingWorker(b, id)
									s.workers[w].signal(syscall.SIGKILL)
									killedAt = time.Now()
								})
							}
						})
					if !res.done {
						b.Fatalf("kill %d: stream did not survive: %s", k, res.errorBody)
					}
					stalls = append(stalls, stall)
					spawn()
				}
			}
			slices.Sort(stalls)
			b.ReportMetric(float64(percentile(stalls, 0.5).Milliseconds()), "p50_stall_ms")
			b.ReportMetric(float64(percentile(stalls, 0.99).Milliseconds()), "p99_stall_ms")
			b.ReportMetric(float64(stalls[len(stalls)-1].Milliseconds()), "max_stall_ms")
		})
	}
}

// resumeStack starts the resume benchmarks' stack: two frontends and a
// worker that answers at once, routable on both.
func resumeStack(b *testing.B) (*stack, *frontend, *frontend) {
	b.Helper()
	s := newStack(b)
	f1 := s.frontend(nil)
	f2 := s.frontend(nil)
	s.worker("w1", "--mock-speedup-ratio", "1e9")
	f1.waitRoutable(b, "w1")
	f2.waitRoutable(b, "w1")
	return s, f1, f2
}

// BenchmarkResume measures resume latency (reconnect to the first replayed
// token) of a request with 4096 tokens of history, on a frontend that has
// never seen it (the history comes from the log by batch direct get), and
// reports the log's cost per request in messages and bytes.
func BenchmarkResume(b *testing.B) {
	const tokens = 4096
	s, f1, f2 := resumeStack(b)
	res := postStream(b, f1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "history", "max_tokens": tokens},
		map[string]string{"X-Request-Id": "hist"}, nil)
	if !res.done {
		b.Fatalf("history request failed: %s", res.errorBody)
	}
	msgs, bytes := logCost(b, s.natsURL, "hist")
	short := postStream(b, f1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "short", "max_tokens": 256},
		map[string]string{"X-Request-Id": "short"}, nil)
	if !short.done {
		b.Fatalf("short request failed: %s", short.errorBody)
	}
	smsgs, sbytes := logCost(b, s.natsURL, "short")

	var lat []time.Duration
	for b.Loop() {
		for _, from := range []string{"0", "2048"} {
			req, _ := http.NewRequest(http.MethodGet, f2.url+"/v1/requests/hist/stream", nil)
			req.Header.Set("Last-Event-ID", from)
			start := time.Now()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			var first time.Duration
			r := readStream(b, resp, func(sseEvent) {
				if first == 0 {
					first = time.Since(start)
				}
			})
			resp.Body.Close()
			if !r.done {
				b.Fatalf("resume failed: %s", r.errorBody)
			}
			lat = append(lat, first)
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(percentile(lat, 0.5).Microseconds())/1000, "p50_resume_ms")
	b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, "p99_resume_ms")
	b.ReportMetric(float64(msgs), "log_msgs_4096tok")
	b.ReportMetric(float64(bytes), "log_bytes_4096tok")
	b.ReportMetric(float64(smsgs), "log_msgs_256tok")
	b.ReportMetric(float64(sbytes), "log_bytes_256tok")
}

// logCost counts the stored messages of request id and their bytes (subject,
// headers and data).
func logCost(b *testing.B, url, id string) (int, int) {
	b.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	parts, err := streams.Discover(ctx, js)
	if err != nil {
		b.Fatal(err)
	}
	it, err := jetstreamext.GetBatch(ctx, js, parts.StreamOf(id), 10000, jetstreamext.GetBatchSubject(streams.RequestAll(id)))
	if err != nil {
		b.Fatal(err)
	}
	n, size := 0, 0
	for m, err := range it {
		if err != nil {
			break
		}
		n++
		size += len(m.Subject) + len(m.Data)
		for k, vs := range m.Header {
			for _, v := range vs {
				size += len(k) + len(v) + 4
			}
		}
	}
	return n, size
}

// BenchmarkResumeResponse measures, in one run, the resume latency of a
// response (GET /v1/responses/{id}?stream=true&starting_after=N) beside a
// chat stream's (GET /v1/requests/{id}/stream with Last-Event-ID): both
// finished with 4096 tokens of history, resumed on a frontend that never
// served them, from the start and from the middle; latency from the
// reconnect to the first replayed event, and to the end of the replay.
func BenchmarkResumeResponse(b *testing.B) {
	const tokens = 4096
	_, f1, f2 := resumeStack(b)
	chat := postStream(b, f1.url, "/v1/chat/completions", map[string]any{"model": "mock", "max_tokens": tokens,
		"messages": []map[string]any{{"role": "user", "content": "history"}}}, map[string]string{"X-Request-Id": "chat-hist"}, nil)
	if !chat.done {
		b.Fatalf("chat request failed: %s", chat.errorBody)
	}
	resp := post(b, f1.url+"/v1/responses", map[string]any{"model": "mock", "input": "history", "max_output_tokens": tokens}, nil)
	var obj struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&obj)
	resp.Body.Close()
	if obj.Status != "incomplete" {
		b.Fatalf("response %s: status %q", obj.ID, obj.Status)
	}
	events := tokens + 4 + 3 + 1 // created, in_progress, two openers, a delta per token, three closers, the end

	type sample struct{ first, all time.Duration }
	measure := func(req *http.Request) sample {
		start := time.Now()
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer r.Body.Close()
		var sm sample
		sc := bufio.NewScanner(r.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if line := sc.Bytes(); bytes.HasPrefix(line, []byte("data: ")) && sm.first == 0 {
				sm.first = time.Since(start)
			}
		}
		sm.all = time.Since(start)
		if r.StatusCode != 200 || sm.first == 0 {
			b.Fatalf("%s: status %d, no event", req.URL, r.StatusCode)
		}
		return sm
	}
	lat := map[string][]time.Duration{}
	for b.Loop() {
		for _, from := range []int{0, tokens / 2} {
			req, _ := http.NewRequest(http.MethodGet, f2.url+"/v1/requests/chat-hist/stream", nil)
			req.Header.Set("Last-Event-ID", strconv.Itoa(from))
			sm := measure(req)
			lat["chat_first"], lat["chat_all"] = append(lat["chat_first"], sm.first), append(lat["chat_all"], sm.all)
			after := from * events / tokens
			req, _ = http.NewRequest(http.MethodGet, f2.url+"/v1/responses/"+obj.ID+"?stream=true&starting_after="+strconv.Itoa(after), nil)
			sm = measure(req)
			lat["resp_first"], lat["resp_all"] = append(lat["resp_first"], sm.first), append(lat["resp_all"], sm.all)
		}
	}
	for _, k := range []string{"chat_first", "chat_all", "resp_first", "resp_all"} {
		slices.Sort(lat[k])
		name := strings.ReplaceAll(k, "_", "_resume_")
		b.ReportMetric(float64(percentile(lat[k], 0.5).Microseconds())/1000, "p50_"+name+"_ms")
		b.ReportMetric(float64(percentile(lat[k], 0.99).Microseconds())/1000, "p99_"+name+"_ms")
	}
}
