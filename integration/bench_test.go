package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/engine"

	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkStreams measures tokens per second delivered to clients by 100
// concurrent streams through a real stack (NATS, one frontend, two mock
// workers at full speed, all separate processes), beside the raw JetStream
// async publish rate of the same server measured in the same run. The ratio
// is the figure to compare across machines.
func BenchmarkStreams(b *testing.B) {
	const streams, tokens = 100, 256
	s := newStack(b)
	fe := s.frontend(nil)
	s.worker("w1", "--mock-speedup-ratio", "1e9")
	s.worker("w2", "--mock-speedup-ratio", "1e9")
	fe.waitRoutable(b, "w1", "w2")

	raw := rawPublishRate(b, s.natsURL)
	pass := passthroughRate(b, streams, tokens)
	b.ResetTimer()
	start := time.Now()
	var delivered int
	for i := 0; b.Loop(); i++ {
		var wg sync.WaitGroup
		counts := make([]int, streams)
		for c := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res := postStream(b, fe.url, "/v1/completions", map[string]any{
					"model": "mock", "prompt": fmt.Sprintf("bench %d %d", i, c), "max_tokens": tokens,
				}, nil, nil)
				if !res.done {
					b.Errorf("stream failed: %d %s", res.status, res.errorBody)
				}
				counts[c] = tokens
			}()
		}
		wg.Wait()
		for _, n := range counts {
			delivered += n
		}
	}
	elapsed := time.Since(start).Seconds()
	tps := float64(delivered) / elapsed
	b.ReportMetric(tps, "tokens/s")
	b.ReportMetric(raw, "raw_js_msgs/s")
	b.ReportMetric(tps/raw, "tokens_per_raw_msg")
	b.ReportMetric(pass, "passthrough_tokens/s")
	b.ReportMetric(tps/pass, "vs_passthrough")
}

// passthroughRate is the second baseline: the same mock engine streaming the
// same token volume straight to HTTP clients as SSE, with the same
// coalescing, and no NATS or log in between: what durability costs.
func passthroughRate(b *testing.B, streams, tokens int) float64 {
	b.Helper()
	eng, err := engine.NewMock(engine.MockConfig{SpeedupRatio: 1e9})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		prompt := r.URL.Query().Get("p")
		w.Header().Set("Content-Type", "text/event-stream")
		flusher := w.(http.Flusher)
		var buf []string
		off := 0
		flush := func() {
			data, _ := json.Marshal(map[string]any{"choices": []map[string]any{{"index": 0, "text": strings.Join(buf, "")}}})
			off += len(buf)
			fmt.Fprintf(w, "id: %d\ndata: %s\n\n", off, data)
			flusher.Flush()
			buf = buf[:0]
		}
		_, _ = eng.Generate(r.Context(), engine.Request{Prompt: prompt, MaxTokens: tokens}, func(tok engine.Token) error {
			if buf = append(buf, tok.Text); len(buf) == 16 {
				flush()
			}
			return nil
		})
		if len(buf) > 0 {
			flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()
	const rounds = 5
	start := time.Now()
	for i := range rounds {
		var wg sync.WaitGroup
		for c := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := http.Get(fmt.Sprintf("%s/?p=pass+%d+%d", srv.URL, i, c))
				if err != nil {
					b.Error(err)
					return
				}
				res := readStream(b, resp, nil)
				resp.Body.Close()
				if !res.done {
					b.Error("passthrough stream did not finish")
				}
			}()
		}
		wg.Wait()
	}
	return float64(rounds*streams*tokens) / time.Since(start).Seconds()
}

// rawPublishRate is the baseline: JetStream async publishes per second of
// small messages (the size of a token delta) to a file stream on the same
// server, with a window of 4096 pending acks.
func rawPublishRate(b *testing.B, url string) float64 {
	b.Helper()
	js := asyncPublisher(b, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH_RAW", Subjects: []string{"bench.raw.>"}}); err != nil {
		b.Fatal(err)
	}
	defer js.DeleteStream(context.Background(), "BENCH_RAW")
	payload := make([]byte, 300)
	const n = 100_000
	start := time.Now()
	for i := range n {
		// A shared, loaded machine may stall the window for longer than
		// nats.go's default 200 ms: that is a slow rate, not a failure.
		if _, err := js.PublishAsync(fmt.Sprintf("bench.raw.%d", i%100), payload, jetstream.WithStallWait(10*time.Second)); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		b.Fatal("raw publishes not acknowledged in time")
	}
	return n / time.Since(start).Seconds()
}
