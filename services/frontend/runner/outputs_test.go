package runner

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/internal/waitfor"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
)

// ask asks for worker's output stream as a worker does.
func (x *runnerFixture) ask(nc *nats.Conn, worker string) (streams.OutputsReply, error) {
	x.t.Helper()
	m, err := nc.RequestWithContext(x.ctx, streams.OutputsSubject(worker), nil)
	if err != nil {
		return streams.OutputsReply{}, err
	}
	var r streams.OutputsReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		x.t.Fatal(err)
	}
	return r, nil
}

func (x *runnerFixture) outputExists(worker string) bool {
	x.t.Helper()
	_, ok, err := streams.LookupWorkerOutput(x.ctx, x.js, worker)
	if err != nil {
		x.t.Fatal(err)
	}
	return ok
}

// TestOutputStreamOnAsk: with --batched-output a frontend creates a
// worker's output stream when it asks, with its own limits, and again
// (the same stream, its messages kept) when a restarted worker of the same
// id asks; it deletes the stream once the worker's lease has been gone for
// the stream's MaxAge, and a stream whose worker asked but never held a
// lease likewise, while a worker with a live lease keeps its own.
func TestOutputStreamOnAsk(t *testing.T) {
	const maxAge = 500 * time.Millisecond
	x := newRunnerFixtureConfig(t, func(c *Config) {
		c.BatchedOutput, c.WorkerOutputMaxBytes, c.WorkerOutputMaxAge = true, 1<<20, maxAge
	})
	x.start()
	s := natstest.Server{URL: x.rn.nc.ConnectedUrl()}
	nc := s.Connect(t)

	r, err := x.ask(nc, "w1")
	if err != nil || r.Stream != "BATON_OUT_w1" || r.MaxBytes != 1<<20 || r.Error != "" {
		t.Fatalf("ask: got %+v, %v", r, err)
	}
	if _, err := x.js.Publish(x.ctx, streams.WorkerOutput("w1", "fe"), []byte("batch")); err != nil {
		t.Fatal(err)
	}
	if r, err := x.ask(nc, "w1"); err != nil || r.Stream != "BATON_OUT_w1" { // restarted, same id
		t.Fatalf("ask again: got %+v, %v", r, err)
	}
	st, err := x.js.Stream(x.ctx, "BATON_OUT_w1")
	if err != nil {
		t.Fatal(err)
	}
	if cfg, n := st.CachedInfo().Config, st.CachedInfo().State.Msgs; n != 1 || cfg.MaxBytes != 1<<20 || cfg.MaxAge != maxAge {
		t.Errorf("after the second ask: %d messages, MaxBytes %d, MaxAge %v", n, cfg.MaxBytes, cfg.MaxAge)
	}
	if r, err := x.ask(nc, "w.bad"); err == nil && r.Error == "" {
		t.Errorf("an ask on a subject naming no valid worker id was answered %+v", r)
	}

	// w1 registers (its lease says writes_batched); w2 asked, never registered.
	x.put(streams.LeasesBucket, "w1", events.Lease{WorkerID: "w1", LeaseID: "L-w1", Model: "m", WritesBatched: true})
	x.waitFleet("w1", func() bool { w, ok := x.fl.Worker("w1"); return ok && w.WritesBatched })
	asked := time.Now() // before the frontend stamps the ask
	if _, err := x.ask(nc, "w2"); err != nil {
		t.Fatal(err)
	}
	waitfor.Poll(t, "w2's stream deleted", func() bool { return !x.outputExists("w2") })
	if waited := time.Since(asked); waited < maxAge {
		t.Errorf("w2's stream deleted %v after its ask, before its MaxAge %v", waited, maxAge)
	}
	if !x.outputExists("w1") {
		t.Fatal("w1's stream deleted while its lease is live")
	}

	// w1's lease goes.
	kv, err := x.js.KeyValue(x.ctx, streams.LeasesBucket)
	if err != nil {
		t.Fatal(err)
	}
	gone := time.Now()
	if err := kv.Delete(x.ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	waitfor.Poll(t, "w1's stream deleted", func() bool { return !x.outputExists("w1") })
	if waited := time.Since(gone); waited < maxAge {
		t.Errorf("w1's stream deleted %v after its lease went, before its MaxAge %v", waited, maxAge)
	}
}

// TestOutputStreamIdleAtStart: a frontend starting with --batched-output
// deletes a stream left with no lease once its last write (here its
// creation) is MaxAge old, though it never saw its worker.
func TestOutputStreamIdleAtStart(t *testing.T) {
	const maxAge = 500 * time.Millisecond
	x := newRunnerFixtureConfig(t, func(c *Config) { c.BatchedOutput, c.WorkerOutputMaxAge = true, maxAge })
	created := time.Now()
	sc := streams.Config{MemoryStorage: true}.WorkerOutputConfig("w-left", 0, maxAge, time.Time{})
	if err := streams.EnsureWorkerOutput(x.ctx, x.js, sc); err != nil {
		t.Fatal(err)
	}
	x.start()
	waitfor.Poll(t, "the left stream deleted", func() bool { return !x.outputExists("w-left") })
	if waited := time.Since(created); waited < maxAge {
		t.Errorf("deleted %v after its creation, before its MaxAge %v", waited, maxAge)
	}
}

// TestOutputsOffByDefault: without the switch a frontend answers no ask
// (a worker gets no responders at once) and lists, creates and deletes no
// worker output stream.
func TestOutputsOffByDefault(t *testing.T) {
	x := newRunnerFixtureConfig(t, func(c *Config) { c.WorkerOutputMaxAge = 50 * time.Millisecond })
	sc := streams.Config{MemoryStorage: true}.WorkerOutputConfig("w-old", 0, time.Hour, time.Time{})
	if err := streams.EnsureWorkerOutput(x.ctx, x.js, sc); err != nil {
		t.Fatal(err)
	}
	x.start()
	if x.rn.outputs != nil {
		t.Fatal("the outputs part runs without the switch")
	}
	s := natstest.Server{URL: x.rn.nc.ConnectedUrl()}
	if _, err := x.ask(s.Connect(t), "w1"); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("ask: got %v, want no responders", err)
	}
	if x.outputExists("w1") || !x.outputExists("w-old") {
		t.Error("a frontend without the switch created or deleted a worker output stream")
	}
}

// TestOutputStreamRefused: a stream the server cannot hold (each reserves
// its MaxBytes from JetStream's storage) is refused in the answer, which a
// worker takes as no stream (it runs without writes_batched).
func TestOutputStreamRefused(t *testing.T) {
	x := newRunnerFixtureConfig(t, func(c *Config) { c.BatchedOutput, c.WorkerOutputMaxBytes = true, 1<<50 })
	x.start()
	s := natstest.Server{URL: x.rn.nc.ConnectedUrl()}
	r, err := x.ask(s.Connect(t), "w1")
	if err != nil || r.Error == "" || r.Stream != "" {
		t.Errorf("ask: got %+v, %v; want an error", r, err)
	}
	if x.outputExists("w1") {
		t.Error("a stream exists")
	}
}

// TestReadOutputReachesWhatWasDelivered: a follower that joins a worker's
// subject which this frontend's subscription already delivered batches of
// (to the followers there were then) must read back at least through the
// last one delivered: a read that stops short of it (here: delivered 5,
// stored 1) is an error, to be read again, not a fold with a silent gap.
func TestReadOutputReachesWhatWasDelivered(t *testing.T) {
	x := newRunnerFixtureConfig(t, func(c *Config) { c.BatchedOutput = true })
	x.start()
	sc := x.rn.cfg.Streams.WorkerOutputConfig("w1", 1<<20, time.Minute, time.Now())
	if err := streams.EnsureWorkerOutput(x.ctx, x.js, sc); err != nil {
		t.Fatal(err)
	}
	// One batch on w1's subject for fe-1, of another request.
	other := events.AttemptFailed{RequestID: "r-other", WorkerID: "w1", Reason: "worker_lost"}
	if _, err := streams.AppendOutputFence(x.ctx, x.js, "w1", "fe-1", "test", "other.fence", other); err != nil {
		t.Fatal(err)
	}
	read := func(delivered uint64) error {
		f := testFollower()
		f.js, f.subs = x.js, x.rn.live
		routeBatched(f) // r1's attempt 0, batched by w1 for fe-1
		subj := streams.WorkerOutput("w1", "fe-1")
		x.rn.live.outs.mu.Lock()
		x.rn.live.outs.last[subj] = delivered
		x.rn.live.outs.mu.Unlock()
		defer func() {
			for _, s := range f.foreign {
				x.rn.live.releaseForeign(s)
			}
		}()
		return f.readOutput(x.ctx)
	}
	if err := read(1); err != nil {
		t.Errorf("delivered through 1, stored through 1: %v, want nil", err)
	}
	if err := read(5); err == nil {
		t.Error("delivered through 5, read through 1: nil, want an error")
	}
}
