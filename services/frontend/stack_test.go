package frontend_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/services/frontend"
	"github.com/baton-dev/baton/services/worker"
	"github.com/baton-dev/baton/streams"
	"github.com/prometheus/client_golang/prometheus"
)

// inProcess runs a frontend and a worker in this process on an embedded
// JetStream, for package tests and profiling (the integration tests run the
// same parts as separate processes).
func inProcess(tb testing.TB, mock engine.MockConfig) string {
	tb.Helper()
	return inProcessWith(tb, mock, frontend.Config{})
}

// inProcessWith is inProcess with a frontend configured as cfg (its
// address and streams are the stack's).
func inProcessWith(tb testing.TB, mock engine.MockConfig, cfg frontend.Config) string {
	tb.Helper()
	eng, err := engine.NewMock(mock)
	if err != nil {
		tb.Fatal(err)
	}
	return inProcessOn(tb, eng, cfg)
}

// inProcessOn is inProcessWith with the worker's engine given, for a test
// that holds its generations (engine.MockConfig.HoldAtToken, Mock.Release).
func inProcessOn(tb testing.TB, eng *engine.Mock, cfg frontend.Config) string {
	tb.Helper()
	s := natstest.Start(tb)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	tb.Cleanup(func() { cancel(); wg.Wait() })
	sc := streams.Config{MemoryStorage: true}
	w, err := worker.New(s.Connect(tb), eng, nil, prometheus.NewRegistry(), worker.Config{ID: "w1", Streams: sc})
	if err != nil {
		tb.Fatal(err)
	}
	cfg.HTTPAddr, cfg.Runtime.Streams = "127.0.0.1:0", sc
	fe, err := frontend.New(s.Connect(tb), nil, prometheus.NewRegistry(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	addr, err := fe.Listen()
	if err != nil {
		tb.Fatal(err)
	}
	wg.Add(2)
	go func() { defer wg.Done(); _ = w.Run(ctx) }()
	go func() { defer wg.Done(); _ = fe.Run(ctx) }()
	url := "http://" + addr.String()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return url
			}
		}
		if time.Now().After(deadline) {
			tb.Fatal("in-process stack not healthy")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stream posts a streaming completion and returns the text and event count.
func stream(tb testing.TB, url, prompt string, maxTokens int) (string, int) {
	body := fmt.Sprintf(`{"model":"mock","prompt":%q,"max_tokens":%d,"stream":true}`, prompt, maxTokens)
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		tb.Error(err)
		return "", 0
	}
	defer resp.Body.Close()
	var text strings.Builder
	n := 0
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, `data: {"choices":[{"finish_reason":null,"index":0,"logprobs":null,"text":`); ok {
			q := rest[:strings.Index(rest, `"}]`)+1]
			text.WriteString(strings.Trim(q, `"`))
			n++
		}
		done = done || line == "data: [DONE]"
	}
	if !done {
		tb.Errorf("stream for %q did not end with [DONE]", prompt)
	}
	return text.String(), n
}

func TestInProcessStream(t *testing.T) {
	url := inProcess(t, engine.MockConfig{SpeedupRatio: 1e9})
	got, _ := stream(t, url, "in process", 100)
	if want := engine.MockText("in process", 0, 100); got != want {
		t.Errorf("text %q, want %q", got, want)
	}
}

// BenchmarkInProcessStreams is BenchmarkStreams (integration) in one process,
// for profiling the hot path: go test -bench InProcess -cpuprofile cpu.out.
func BenchmarkInProcessStreams(b *testing.B) {
	const streamsPerRound, tokens = 100, 256
	// Every stream comes from loopback: no per-address cap.
	url := inProcessWith(b, engine.MockConfig{SpeedupRatio: 1e9}, frontend.Config{MaxConnectionsPerAddress: -1})
	start := time.Now()
	total := 0
	for i := 0; b.Loop(); i++ {
		var wg sync.WaitGroup
		for c := range streamsPerRound {
			wg.Add(1)
			go func() {
				defer wg.Done()
				stream(b, url, fmt.Sprintf("bench %d %d", i, c), tokens)
			}()
		}
		wg.Wait()
		total += streamsPerRound * tokens
	}
	b.ReportMetric(float64(total)/time.Since(start).Seconds(), "tokens/s")
}
