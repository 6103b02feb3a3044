package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkResumeResponse measures, in one run, the resume latency of a
// response (GET /v1/responses/{id}?stream=true&starting_after=N) beside a
// chat stream's (GET /v1/requests/{id}/stream with Last-Event-ID): both
// finished with 4096 tokens of history, resumed on a frontend that never
// served them, from the start and from the middle; latency from the
// reconnect to the first replayed event, and to the end of the replay.
func BenchmarkResumeResponse(b *testing.B) {
	const tokens = 4096
	s := newStack(b)
	f1 := s.frontend(nil)
	f2 := s.frontend(nil)
	s.worker("w1", "--mock-speedup-ratio", "1e9")
	f1.waitRoutable(b, "w1")
	f2.waitRoutable(b, "w1")
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
