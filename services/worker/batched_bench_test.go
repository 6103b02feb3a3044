package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/internal/notify"
	"github.com/baton-dev/baton/internal/waitfor"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/services/worker"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkBatchedWriter: one worker serving n attempts at once at a decode
// rate (the mock at 50 tokens/s, 50 tokens each), its output per token on
// the partition against batched in its own stream, on an embedded server
// with file storage. An op is one round of n attempts. It reports the
// messages stored per token (the partition's or the worker stream's), and
// the process's CPU per token: the server's (store, ack, republish), the
// worker's, and a reader's that counts the ends on the live copies (a
// message decoded, or a batch read through streams.BatchEntries).
//
//	go test -run '^$' -bench BenchmarkBatchedWriter -benchtime 3x ./services/worker/
func BenchmarkBatchedWriter(b *testing.B) {
	for _, n := range []int{50, 200} {
		for _, batched := range []bool{false, true} {
			b.Run(fmt.Sprintf("n=%d/batched=%v", n, batched), func(b *testing.B) { batchedWriter(b, n, batched) })
		}
	}
}

func batchedWriter(b *testing.B, n int, batched bool) {
	const tokens = 50
	srv := natstest.Start(b)
	js := srv.JetStream(b)
	ctx := context.Background()
	if _, err := streams.Provision(ctx, js, streams.Config{}); err != nil {
		b.Fatal(err)
	}
	nc := srv.Connect(b)
	if _, err := nc.Subscribe(streams.OutputsSubjects, func(m *nats.Msg) {
		w, _ := streams.OutputsWorker(m.Subject)
		sc := streams.Config{}.WorkerOutputConfig(w, 0, time.Minute, time.Now())
		r := streams.OutputsReply{Stream: sc.Name, MaxBytes: sc.MaxBytes}
		if err := streams.EnsureWorkerOutput(ctx, js, sc); err != nil {
			r = streams.OutputsReply{Error: err.Error()}
		}
		data, _ := json.Marshal(r)
		_ = m.Respond(data)
	}); err != nil {
		b.Fatal(err)
	}
	if err := nc.Flush(); err != nil { // the answerer is the server's before a worker asks
		b.Fatal(err)
	}
	// The reader: every end, from either live copy.
	var ends atomic.Int64
	ended := notify.NewSignal()
	count := func(evs ...events.Envelope) {
		for _, e := range evs {
			if _, ok := e.Event.(events.RequestCompleted); ok {
				ends.Add(1)
				ended.Notify()
			}
		}
	}
	if _, err := nc.Subscribe(streams.RequestsLive(), func(m *nats.Msg) {
		if e, err := streams.Decode(m); err == nil {
			count(e)
		}
	}); err != nil {
		b.Fatal(err)
	}
	if _, err := nc.Subscribe("baton.live.out.>", func(m *nats.Msg) {
		if _, es, err := streams.BatchEntries(m); err == nil {
			count(es...)
		}
	}); err != nil {
		b.Fatal(err)
	}
	eng, err := engine.NewMock(engine.MockConfig{TokensPerSec: 50, TTFT: 10 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	w, err := worker.New(srv.Connect(b), eng, slog.New(slog.DiscardHandler), prometheus.NewRegistry(),
		worker.Config{ID: "wbench", BatchedOutput: true, LeaseTTL: 5 * time.Second, ShutdownTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	b.Cleanup(func() {
		stop()
		<-done
	})
	kv, err := js.KeyValue(ctx, streams.LeasesBucket)
	if err != nil {
		b.Fatal(err)
	}
	waitfor.Poll(b, "a lease with writes_batched", func() bool {
		e, err := kv.Get(ctx, "wbench")
		var l events.Lease
		return err == nil && json.Unmarshal(e.Value(), &l) == nil && l.WritesBatched
	})
	log := streams.NewLog(js, "baton/bench")
	stored := func() uint64 {
		var total uint64
		for _, name := range []string{streams.RequestsStream, streams.WorkerOutputStream("wbench")} {
			s, err := js.Stream(ctx, name)
			if err != nil {
				b.Fatal(err)
			}
			total += s.CachedInfo().State.Msgs
		}
		return total
	}
	before := stored()
	var lifecycle uint64
	cpu0 := cpuTime(b)
	b.ResetTimer()
	for i := range b.N {
		ends.Store(0)
		for k := range n {
			id := fmt.Sprintf("r%d-%d", i, k)
			prompt := fmt.Sprintf("prompt %d", k)
			acc := events.RequestAccepted{RequestID: id, Model: "mock", Endpoint: events.EndpointCompletions, Prompt: prompt,
				PromptTokens: engine.CountTokens(prompt), MaxTokens: tokens, Frontend: "fe-bench"}
			if _, err := log.Append(ctx, streams.RequestEvents(id), log.Envelope(id+".accepted", id, acc), 0); err != nil {
				b.Fatal(err)
			}
			if _, err := log.Append(ctx, streams.RequestEvents(id), log.Envelope(id+".routed.0", id, events.RequestRouted{RequestID: id, WorkerID: "wbench"}), -1); err != nil {
				b.Fatal(err)
			}
			lifecycle += 2
			d := events.Dispatch{RequestID: id, Model: "mock", Prompt: prompt, PromptTokens: engine.CountTokens(prompt), MaxTokens: tokens, Frontend: "fe-bench"}
			if batched {
				d.Output = events.OutputBatched
			}
			data, _ := json.Marshal(d)
			if _, err := nc.Request(streams.DispatchSubject("wbench"), data, 5*time.Second); err != nil {
				b.Fatal(err)
			}
		}
		waitfor.Signal(b, ended, fmt.Sprintf("%d ends", n), func() bool { return ends.Load() >= int64(n) })
	}
	b.StopTimer()
	cpu := cpuTime(b) - cpu0
	total := float64(b.N * n * tokens)
	b.ReportMetric(float64(stored()-before-lifecycle)/total, "stored/token")
	b.ReportMetric(float64(cpu.Microseconds())/total, "cpu-µs/token")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
