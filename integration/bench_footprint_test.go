package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkLogFootprint measures what a token costs the request log: in
// flight (every delta stored, as while a request runs) and finished (after
// compaction), for 4 requests of 500 tokens, at decode rates (200 tokens/s,
// a delta per token) and at full speed (deltas of up to 16 tokens). The
// baseline is the same run's uncompacted log. Targets (issue 19): in
// flight at most about 240 bytes a token; finished at most 16 bytes a token
// plus 1.5 KB a request.
func BenchmarkLogFootprint(b *testing.B) {
	for _, rate := range []int{200, 0} {
		name := fmt.Sprintf("tokens_per_sec=%d", rate)
		if rate == 0 {
			name = "full_speed"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				footprint(b, rate)
			}
		})
	}
}

func footprint(b *testing.B, rate int) {
	const requests, tokens = 4, 500
	s := newStack(b)
	f := s.frontend(nil, "--log-compaction=false")
	args := []string{"--mock-ttft", "5ms"}
	if rate > 0 {
		args = append(args, "--mock-tokens-per-sec", fmt.Sprint(rate))
	} else {
		args = append(args, "--mock-speedup-ratio", "1000")
	}
	s.worker("w1", args...)
	s.worker("w2", args...)
	f.waitRoutable(b, "w1", "w2")
	nc, err := nats.Connect(s.natsURL)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	usage := func() streams.Usage {
		u, err := streams.ReadUsage(context.Background(), js, streams.RequestsStream)
		if err != nil {
			b.Fatal(err)
		}
		return u
	}
	base := usage()
	var wg sync.WaitGroup
	ids := make([]string, requests)
	for i := range requests {
		ids[i] = fmt.Sprintf("fp-%d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := postStream(b, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": fmt.Sprintf("footprint %d", i), "max_tokens": tokens},
				map[string]string{"X-Request-Id": ids[i]}, nil)
			if !r.done || len(strings.Fields(r.text)) != tokens {
				b.Errorf("request %d: done %v, %d tokens", i, r.done, len(strings.Fields(r.text)))
			}
		}()
	}
	wg.Wait()
	hot := usage()
	if _, errOut, code := runTool(b, batonBin, append([]string{"compact", "--nats", s.natsURL}, ids...)...); code != 0 {
		b.Fatalf("baton compact: %s", errOut)
	}
	cold := usage()
	n := float64(requests * tokens)
	hotBytes, coldBytes := float64(hot.Bytes-base.Bytes), float64(cold.Bytes-base.Bytes)
	b.ReportMetric(hotBytes/n, "B/token_in_flight")
	b.ReportMetric(float64(hot.Msgs-base.Msgs)/n, "msgs/token_in_flight")
	b.ReportMetric(coldBytes/requests, "B/request_finished")
	b.ReportMetric((coldBytes/requests-1536)/tokens, "B/token_finished_over_1.5KB")
	b.ReportMetric(hotBytes/coldBytes, "x_compaction")
}
