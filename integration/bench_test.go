package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
}

// rawPublishRate is the baseline: JetStream async publishes per second of
// small messages (the size of a token delta) to a file stream on the same
// server, with a window of 4096 pending acks.
func rawPublishRate(b *testing.B, url string) float64 {
	b.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
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
		if _, err := js.PublishAsync(fmt.Sprintf("bench.raw.%d", i%100), payload); err != nil {
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
