package integration

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

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
