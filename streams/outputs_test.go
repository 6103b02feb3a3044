package streams_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// TestWorkerOutputStream: a worker's output stream is defined as the design
// says, created once however often it is ensured (an ask again, another
// frontend's limits), listed, and deleted.
func TestWorkerOutputStream(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.Provision(t)
	ctx := testCtx(t)
	cfg := streams.Config{MemoryStorage: true}
	asked := time.Now()
	sc := cfg.WorkerOutputConfig("w-1", 0, 3*time.Minute, asked)
	if err := streams.EnsureWorkerOutput(ctx, js, sc); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "BATON_OUT_w-1")
	if err != nil {
		t.Fatal(err)
	}
	got := s.CachedInfo().Config
	if got.Subjects[0] != "baton.out.w-1.>" || got.MaxBytes != 256<<20 || got.MaxMsgSize != 1<<20 || got.MaxAge != 3*time.Minute ||
		got.Discard != jetstream.DiscardNew || !got.AllowDirect || got.RePublish == nil ||
		got.RePublish.Source != "baton.out.>" || got.RePublish.Destination != "baton.live.out.>" {
		t.Errorf("definition: got %+v", got)
	}
	// A message stored, then the stream ensured again (a restarted worker of
	// the same id asks again; another frontend's limits): the same stream,
	// its messages kept, the new limits and ask time applied.
	if _, err := js.Publish(ctx, streams.WorkerOutput("w-1", "fe-1"), []byte("batch")); err != nil {
		t.Fatal(err)
	}
	later := asked.Add(time.Second)
	if err := streams.EnsureWorkerOutput(ctx, js, cfg.WorkerOutputConfig("w-1", 1<<20, 3*time.Minute, later)); err != nil {
		t.Fatal(err)
	}
	info, ok, err := streams.LookupWorkerOutput(ctx, js, "w-1")
	if err != nil || !ok {
		t.Fatalf("look up: %v %v", ok, err)
	}
	if !info.Asked.Equal(later) || info.Last.IsZero() || info.Worker != "w-1" || info.MaxAge != 3*time.Minute {
		t.Errorf("info: got %+v, want asked %v and a last message", info, later)
	}
	s, _ = js.Stream(ctx, "BATON_OUT_w-1")
	if n, mb := s.CachedInfo().State.Msgs, s.CachedInfo().Config.MaxBytes; n != 1 || mb != 1<<20 {
		t.Errorf("after the second ensure: %d messages, MaxBytes %d; want 1, %d", n, mb, 1<<20)
	}

	if err := streams.EnsureWorkerOutput(ctx, js, cfg.WorkerOutputConfig("w-2", 0, time.Minute, time.Time{})); err != nil {
		t.Fatal(err)
	}
	list, err := streams.WorkerOutputs(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range list {
		names = append(names, i.Worker)
	}
	if strings.Join(names, ",") != "w-1,w-2" && strings.Join(names, ",") != "w-2,w-1" {
		t.Errorf("listed %v, want w-1 and w-2 (and no request log)", names)
	}
	for range 2 { // a second delete is not an error
		if err := streams.DeleteWorkerOutput(ctx, js, "w-1"); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok, err := streams.LookupWorkerOutput(ctx, js, "w-1"); ok || err != nil {
		t.Errorf("after delete: ok %v, err %v", ok, err)
	}
}

// TestWorkerOutputNotOurs: a stream named BATON_OUT_<id> that baton did not
// make (other subjects) is left alone, and not listed.
func TestWorkerOutputNotOurs(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.Provision(t)
	ctx := testCtx(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BATON_OUT_w-x", Subjects: []string{"elsewhere.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	err := streams.EnsureWorkerOutput(ctx, js, streams.Config{MemoryStorage: true}.WorkerOutputConfig("w-x", 0, time.Minute, time.Time{}))
	if err == nil || !strings.Contains(err.Error(), "not a worker's output stream") {
		t.Errorf("got %v, want a refusal", err)
	}
	if list, err := streams.WorkerOutputs(ctx, js); err != nil || len(list) != 0 {
		t.Errorf("listed %v (%v), want none", list, err)
	}
}

// TestWorkerOutputBound is issue 33's property: one worker credential
// flooding its own output cannot take more than its own limit. w1 floods
// its stream until it is refused at its MaxBytes; meanwhile, and after,
// w2's stream and the request log keep taking writes.
func TestWorkerOutputBound(t *testing.T) {
	srv := natstest.Start(t)
	js := srv.Provision(t)
	ctx := testCtx(t)
	cfg := streams.Config{MemoryStorage: true}
	const limit = 256 << 10
	for _, w := range []string{"w1", "w2"} {
		if err := streams.EnsureWorkerOutput(ctx, js, cfg.WorkerOutputConfig(w, limit, time.Minute, time.Time{})); err != nil {
			t.Fatal(err)
		}
	}
	junk := make([]byte, 16<<10)
	stored, refused := 0, 0
	for range 64 { // 1 MiB of junk, 4× the limit
		_, err := js.Publish(ctx, streams.WorkerOutput("w1", "fe-1"), junk)
		switch {
		case err == nil:
			stored++
		case errors.Is(err, jetstream.ErrNoStreamResponse):
			t.Fatal(err)
		default:
			refused++
			if !strings.Contains(err.Error(), "maximum bytes") {
				t.Fatalf("refused with %v, want its maximum bytes exceeded", err)
			}
		}
		// The others keep taking writes, before and after w1's is full.
		if _, err := js.Publish(ctx, streams.WorkerOutput("w2", "fe-1"), []byte("honest")); err != nil {
			t.Fatalf("w2's output refused while w1 floods: %v", err)
		}
		if _, err := js.Publish(ctx, streams.RequestEvents("r-other"), []byte("x")); err != nil {
			t.Fatalf("the request log refused a write while w1 floods: %v", err)
		}
	}
	s, err := js.Stream(ctx, "BATON_OUT_w1")
	if err != nil {
		t.Fatal(err)
	}
	if b := s.CachedInfo().State.Bytes; b > limit || refused == 0 || stored == 0 {
		t.Errorf("w1's stream holds %d bytes (limit %d), %d stored, %d refused", b, limit, stored, refused)
	}
	s2, _ := js.Stream(ctx, "BATON_OUT_w2")
	if n := s2.CachedInfo().State.Msgs; n != 64 {
		t.Errorf("w2's stream holds %d messages, want 64", n)
	}
}

// TestWorkerOutputStreamNames: a worker id is a ValidID, which is a valid
// stream name part (JetStream refuses '.', '*', '>', spaces and path
// separators in names), and the longest makes a stream.
func TestWorkerOutputStreamNames(t *testing.T) {
	for _, id := range []string{"w.1", "w*", "w>", "w 1", "w/1", `w\1`, ""} {
		if streams.ValidID(id) {
			t.Errorf("ValidID(%q): got true, want false", id)
		}
		if _, ok := streams.WorkerOfOutputStream("BATON_OUT_" + id); ok {
			t.Errorf("WorkerOfOutputStream(BATON_OUT_%s): got ok", id)
		}
	}
	srv := natstest.Start(t)
	js := srv.Provision(t)
	long := strings.Repeat("w", 128)
	if !streams.ValidID(long) {
		t.Fatal("a 128-byte id is not valid")
	}
	if err := streams.EnsureWorkerOutput(testCtx(t), js, streams.Config{MemoryStorage: true}.WorkerOutputConfig(long, 0, time.Minute, time.Time{})); err != nil {
		t.Errorf("the longest worker id: %v", err)
	}
}
