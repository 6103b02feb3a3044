package worker_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/services/worker"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// answerOutputs answers workers' asks for their output streams as a
// frontend with --batched-output does (services/frontend/runner/outputs.go,
// tested there): it creates the stream and replies. It returns the number
// of asks so far.
func (e *env) answerOutputs() *atomic.Int32 {
	e.t.Helper()
	var asks atomic.Int32
	sub, err := e.nc.QueueSubscribe(streams.OutputsSubjects, streams.CheckQueue, func(m *nats.Msg) {
		asks.Add(1)
		w, err := streams.OutputsWorker(m.Subject)
		if err != nil {
			e.t.Error(err)
			return
		}
		sc := streams.Config{MemoryStorage: true}.WorkerOutputConfig(w, 1<<20, time.Minute, time.Now())
		r := streams.OutputsReply{Stream: sc.Name, MaxBytes: sc.MaxBytes}
		if err := streams.EnsureWorkerOutput(context.Background(), e.js, sc); err != nil {
			r = streams.OutputsReply{Error: err.Error()}
		}
		data, _ := json.Marshal(r)
		_ = m.Respond(data)
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := e.nc.Flush(); err != nil {
		e.t.Fatal(err)
	}
	return &asks
}

// TestBatchedOutputAsked: a worker with --batched-output asks for its
// output stream before it registers, and says writes_batched in its lease;
// restarted with the same id it asks again and reuses the stream.
func TestBatchedOutputAsked(t *testing.T) {
	e := newEnv(t)
	asks := e.answerOutputs()
	cfg := worker.Config{ID: "wb-1", BatchedOutput: true}
	r := e.start(nil, engine.MockConfig{}, cfg)
	if l, _ := e.lease("wb-1"); !l.WritesBatched || asks.Load() != 1 {
		t.Fatalf("lease %+v after %d asks, want writes_batched after 1", l, asks.Load())
	}
	if _, err := e.js.Publish(context.Background(), streams.WorkerOutput("wb-1", "fe"), []byte("batch")); err != nil {
		t.Fatal(err)
	}
	r.cancel()
	err := <-r.done
	r.done <- err // for the cleanup, which waits for it too
	e.waitFor("the lease gone", func() bool { _, ok := e.lease("wb-1"); return !ok })

	e.start(nil, engine.MockConfig{}, cfg)
	var s jetstream.Stream
	if l, _ := e.lease("wb-1"); !l.WritesBatched || asks.Load() != 2 {
		t.Fatalf("restarted: lease %+v after %d asks, want writes_batched after 2", l, asks.Load())
	}
	s, err = e.js.Stream(context.Background(), "BATON_OUT_wb-1")
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("the restarted worker's stream holds %d messages, want the 1 stored before", n)
	}
}

// TestBatchedOutputUnanswered: with no frontend to answer (none with the
// switch, or a previous release), a worker with --batched-output runs
// without writes_batched; it asks again when it registers again, and says
// writes_batched once answered. Without the switch it never asks.
func TestBatchedOutputUnanswered(t *testing.T) {
	e := newEnv(t)
	e.start(nil, engine.MockConfig{}, worker.Config{ID: "wb-2", BatchedOutput: true})
	if l, _ := e.lease("wb-2"); l.WritesBatched {
		t.Fatalf("lease %+v: writes_batched with no stream", l)
	}
	asks := e.answerOutputs()
	e.start(nil, engine.MockConfig{}, worker.Config{ID: "wb-off"})
	old, _ := e.lease("wb-2")
	// The lease is lost (deleted under the worker): it registers again.
	if err := e.kv(streams.LeasesBucket).Delete(context.Background(), "wb-2"); err != nil {
		t.Fatal(err)
	}
	e.waitFor("a new lease with writes_batched", func() bool {
		l, ok := e.lease("wb-2")
		return ok && l.LeaseID != old.LeaseID && l.WritesBatched
	})
	if n := asks.Load(); n < 1 {
		t.Errorf("%d asks, want wb-2's again", n) // none of wb-off's: its stream does not exist (below)
	}
	if l, _ := e.lease("wb-off"); l.WritesBatched {
		t.Errorf("a worker without the switch says writes_batched: %+v", l)
	}
	if _, err := e.js.Stream(context.Background(), "BATON_OUT_wb-off"); err == nil {
		t.Error("a stream exists for a worker without the switch")
	}
}

// TestBatchedOutputAskedAgain: a worker with --batched-output that no
// frontend answered (it started first, as in a rolling upgrade) asks again
// every lease TTL, and once answered says writes_batched in the lease it
// holds, without registering again.
func TestBatchedOutputAskedAgain(t *testing.T) {
	e := newEnv(t)
	e.start(nil, engine.MockConfig{}, worker.Config{ID: "wb-3", BatchedOutput: true})
	first, _ := e.lease("wb-3")
	if first.WritesBatched {
		t.Fatalf("lease %+v: writes_batched with no stream", first)
	}
	asks := e.answerOutputs()
	e.waitFor("the lease to say writes_batched", func() bool { l, _ := e.lease("wb-3"); return l.WritesBatched })
	if l, _ := e.lease("wb-3"); l.LeaseID != first.LeaseID || asks.Load() != 1 {
		t.Errorf("lease %s after %d asks, want the same lease %s after 1", l.LeaseID, asks.Load(), first.LeaseID)
	}
	if _, err := e.js.Stream(context.Background(), "BATON_OUT_wb-3"); err != nil {
		t.Errorf("the stream the answer created: %v", err)
	}
}

// batchedOutputOf reads every batch in worker's output stream and returns
// the entries of request id, as the fold takes them (streams.BatchEntries),
// and the number of batches stored.
func (e *env) batchedOutputOf(worker, id string) (entries []events.Envelope, batches int) {
	e.t.Helper()
	ctx := context.Background()
	s, err := e.js.Stream(ctx, streams.WorkerOutputStream(worker))
	if err != nil {
		e.t.Fatal(err)
	}
	last := s.CachedInfo().State.LastSeq
	for seq := uint64(1); seq <= last; seq++ {
		raw, err := s.GetMsg(ctx, seq)
		if err != nil {
			e.t.Fatal(err)
		}
		w, es, err := streams.BatchEntries(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
		if err != nil || w != worker {
			e.t.Fatalf("batch %d: worker %q, %v", seq, w, err)
		}
		batches++
		for _, en := range es {
			if en.Subject == id {
				entries = append(entries, en)
			}
		}
	}
	return entries, batches
}

// TestBatchedWriterFoldsAsPerToken: a dispatch that says "output":"batched"
// to a worker with its output stream writes the attempt's deltas and its
// completion as batches on baton.out.<worker>.d.<owner>, nothing on the
// attempt's tokens subject; read back through streams.BatchEntries, they
// fold (projections.Request) to the same answer as the per-token path for
// the same engine output, for three attempts at once. Without
// the field, the same worker writes per token as before.
func TestBatchedWriterFoldsAsPerToken(t *testing.T) {
	e := newEnv(t)
	e.answerOutputs()
	e.start(nil, engine.MockConfig{TokensPerSec: 400, TTFT: time.Millisecond}, worker.Config{ID: "wb", BatchedOutput: true})
	const prompt, maxTokens = "tell me a batched story", 60

	e.dispatched("r-tok", prompt, maxTokens, "wb")
	batched := []string{"r-b1", "r-b2", "r-b3"}
	for _, id := range batched {
		e.accept(id, prompt, maxTokens, "wb")
		d := newDispatch(id, prompt, maxTokens)
		d.Output = events.OutputBatched
		if rep := e.dispatch("wb", d); !rep.Accepted {
			t.Fatalf("dispatch %s: %+v", id, rep)
		}
	}
	e.waitFor("r-tok's end", func() bool { _, ok := ended(e.outputOf("r-tok", "wb")); return ok })
	want := projections.NewRequest()
	for _, ev := range e.request("r-tok") {
		want.Fold(ev)
	}
	if want.Status != projections.StatusCompleted || want.Text() == "" {
		t.Fatalf("the per-token answer: status %s, text %q", want.Status, want.Text())
	}
	for _, id := range batched {
		e.waitFor(id+"'s end in the worker's stream", func() bool {
			es, _ := e.batchedOutputOf("wb", id)
			_, ok := ended(es)
			return ok
		})
		if out := e.outputOf(id, "wb"); len(out) != 0 {
			t.Errorf("%s: %d messages on its tokens subject, want none", id, len(out))
		}
		got := projections.NewRequest()
		for _, ev := range e.request(id) { // accepted, routed
			got.Fold(ev)
		}
		entries, _ := e.batchedOutputOf("wb", id)
		if len(entries) == 0 || len(entries[0].Header[streams.HeaderUpstreamTTFT]) == 0 {
			t.Errorf("%s: its first delta carries no %s", id, streams.HeaderUpstreamTTFT)
		}
		for _, en := range entries {
			if _, why := got.Fold(en); why != "" {
				t.Errorf("%s: entry %s ignored: %s", id, en.Type(), why)
			}
		}
		if got.Status != want.Status || got.Text() != want.Text() || got.FinishReason != want.FinishReason ||
			got.EngineCompletionTokens != want.EngineCompletionTokens || len(got.Tokens(0)) != len(want.Tokens(0)) {
			t.Errorf("%s folds to %s %q (%s, %d tokens), want %s %q (%s, %d tokens)", id, got.Status, got.Text(), got.FinishReason,
				len(got.Tokens(0)), want.Status, want.Text(), want.FinishReason, len(want.Tokens(0)))
		}
	}
	entries := 0
	for _, id := range batched {
		es, _ := e.batchedOutputOf("wb", id)
		entries += len(es)
	}
	// How many batches the attempts shared depends on the machine's load
	// (a batch waits 2 ms at most): said, not checked.
	_, batches := e.batchedOutputOf("wb", "none")
	t.Logf("%d entries of three attempts in %d batches", entries, batches)
}

// TestBatchedDispatchWithoutStream: a dispatch that says "output":"batched"
// to a worker without its output stream (no frontend answered its ask, or
// the switch is off) is written per token on the attempt's subject.
func TestBatchedDispatchWithoutStream(t *testing.T) {
	e := newEnv(t)
	e.start(nil, fullSpeed, worker.Config{ID: "wn-1", BatchedOutput: true}) // nobody answers
	e.start(nil, fullSpeed, worker.Config{ID: "wn-2"})
	for _, w := range []string{"wn-1", "wn-2"} {
		id := "r-" + w
		e.accept(id, "no stream", 8, w)
		d := newDispatch(id, "no stream", 8)
		d.Output = events.OutputBatched
		if rep := e.dispatch(w, d); !rep.Accepted {
			t.Fatalf("dispatch %s: %+v", id, rep)
		}
		e.waitFor(id+"'s end on its tokens subject", func() bool { _, ok := ended(e.outputOf(id, w)); return ok })
	}
}
