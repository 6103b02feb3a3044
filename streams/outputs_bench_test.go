package streams_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/streams"
)

// BenchmarkOutputStreamChurn: what a worker that comes and goes costs in
// output streams. Each op creates one worker's output stream as the
// frontend answering its ask does (EnsureWorkerOutput, file storage, R1,
// on a server holding baton's log), stores one batch in it, and deletes
// it, over a loopback connection to an embedded server. It reports the
// wall time of the create and of the delete, and the process's CPU (the
// server's and the client's: both run in the test process) per op.
//
//	go test -run '^$' -bench BenchmarkOutputStreamChurn -benchtime 200x -count 3 ./streams/
func BenchmarkOutputStreamChurn(b *testing.B) {
	for _, live := range []int{0, 100} {
		b.Run(fmt.Sprintf("beside=%d", live), func(b *testing.B) { outputChurn(b, live) })
	}
}

// outputChurn runs the churn beside live other workers' streams.
func outputChurn(b *testing.B, live int) {
	srv := natstest.Start(b)
	js := srv.JetStream(b)
	ctx := context.Background()
	cfg := streams.Config{}
	if _, err := streams.Provision(ctx, js, cfg); err != nil {
		b.Fatal(err)
	}
	for i := range live {
		if err := streams.EnsureWorkerOutput(ctx, js, cfg.WorkerOutputConfig(fmt.Sprintf("live-%d", i), 0, 3*time.Minute, time.Now())); err != nil {
			b.Fatal(err)
		}
	}
	var create, del time.Duration
	cpu0 := cpuTime(b)
	b.ResetTimer()
	for i := range b.N {
		w := fmt.Sprintf("w-%d", i)
		t0 := time.Now()
		if err := streams.EnsureWorkerOutput(ctx, js, cfg.WorkerOutputConfig(w, 0, 3*time.Minute, time.Now())); err != nil {
			b.Fatal(err)
		}
		create += time.Since(t0)
		if _, err := js.Publish(ctx, streams.WorkerOutput(w, "fe-1"), []byte("a batch")); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := streams.DeleteWorkerOutput(ctx, js, w); err != nil {
			b.Fatal(err)
		}
		del += time.Since(t1)
	}
	b.StopTimer()
	cpu := cpuTime(b) - cpu0
	b.ReportMetric(float64(create.Microseconds())/float64(b.N)/1000, "create-ms/op")
	b.ReportMetric(float64(del.Microseconds())/float64(b.N)/1000, "delete-ms/op")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N)/1000, "cpu-ms/op")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkOutputStreamList: one sweep's list (WorkerOutputs) with 600
// workers' output streams, as many as a worker every 0.3 s leaves within
// the default MaxAge (3 min), beside baton's log. Each is 16 MiB here: a
// stream reserves its MaxBytes from the server's JetStream storage (75%
// of the free disk by default), and 600 × 256 MiB (the default) does not
// fit on the machine this was measured on (about 215 do).
//
//	go test -run '^$' -bench BenchmarkOutputStreamList -count 3 ./streams/
func BenchmarkOutputStreamList(b *testing.B) {
	srv := natstest.Start(b)
	js := srv.JetStream(b)
	ctx := context.Background()
	cfg := streams.Config{}
	if _, err := streams.Provision(ctx, js, cfg); err != nil {
		b.Fatal(err)
	}
	const n = 600
	for i := range n {
		if err := streams.EnsureWorkerOutput(ctx, js, cfg.WorkerOutputConfig(fmt.Sprintf("w-%d", i), 16<<20, 3*time.Minute, time.Now())); err != nil {
			b.Fatal(err)
		}
	}
	cpu0 := cpuTime(b)
	b.ResetTimer()
	for range b.N {
		list, err := streams.WorkerOutputs(ctx, js)
		if err != nil || len(list) != n {
			b.Fatalf("listed %d, %v", len(list), err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/float64(b.N)/1000, "cpu-ms/op")
}
