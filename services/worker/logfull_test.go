package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/worker"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// fillRequestLog shrinks the request log to maxBytes and fills it to
// within a few bytes of that with one message on subject: the next delta
// does not fit.
func (e *env) fillRequestLog(maxBytes int64, subject string) jetstream.Stream {
	e.t.Helper()
	ctx := context.Background()
	stream, err := e.js.Stream(ctx, "BATON_REQUESTS")
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := stream.CachedInfo().Config
	cfg.MaxBytes = maxBytes
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		e.t.Fatal(err)
	}
	for try := 0; ; try++ {
		info, err := stream.Info(ctx)
		if err != nil {
			e.t.Fatal(err)
		}
		size := int(maxBytes-int64(info.State.Bytes)) - len(subject) - 60 - 50*try
		if size <= 0 || try == 40 {
			e.t.Fatalf("could not fill the log (%d of %d bytes)", info.State.Bytes, maxBytes)
		}
		if _, err := e.js.Publish(ctx, subject, make([]byte, size)); err == nil {
			return stream
		}
	}
}

// TestLogFullEndsTheAttempt: the log refuses an attempt's delta at its
// byte limit, and room is made a moment later. The worker stops
// generating and stores the attempt's end, an AttemptFailed of class
// log_full at the tokens stored: the frontend's to end the request with
// log_full, rather than to take the silence for a stall. Nothing of the
// attempt is stored after it, so no reader sees a token twice or past it.
func TestLogFullEndsTheAttempt(t *testing.T) {
	e := newEnv(t)
	r, stream, filler := e.refused("r-full", "w-full")
	if _, ok := ended(e.request("r-full")); ok {
		t.Fatal("the attempt's end was stored in a full log")
	}
	if err := stream.Purge(context.Background(), jetstream.WithPurgeSubject(filler)); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the attempt's end", func() bool { _, ok := ended(e.request("r-full")); return ok })
	e.waitFor("the job to end", func() bool { return value(t, r.reg, "dynamo_component_inflight_requests") == 0 })

	es := e.request("r-full")
	end, _ := ended(es)
	f, ok := end.Event.(events.AttemptFailed)
	if !ok || f.Class != events.FailureLogFull || f.Reason != events.FailureLogFull {
		t.Fatalf("the attempt ended with %+v, want an AttemptFailed of class log_full", end.Event)
	}
	p := projections.NewRequest()
	for _, ev := range es {
		p.Apply(ev)
	}
	if got := p.Len(); f.Offset != got || got == 0 {
		t.Errorf("the end's offset %d, the fold's tokens %d: want the same, above 0", f.Offset, got)
	}
	if last := es[len(es)-1]; last.ID != end.ID {
		t.Errorf("%s stored after the attempt's end", last.Event.EventType())
	}
}

// TestLogFullFencedStoresNothing: while the log stays full, a fence (the
// frontend ended the request itself) ends the worker's tries to store the
// attempt's end: nothing of it is stored once room is made.
func TestLogFullFencedStoresNothing(t *testing.T) {
	e := newEnv(t)
	r, stream, filler := e.refused("r-fen", "w-fen")
	// The worker now tries to store the end every 250 ms, for 30 s.
	e.command("w-fen", streams.Command{RequestID: "r-fen", Attempt: 0, Kind: streams.CommandFence, Reason: "test"})
	start := time.Now()
	e.waitFor("the fenced job to end", func() bool { return value(t, r.reg, "dynamo_component_inflight_requests") == 0 })
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the fenced job ended %v after the fence, want at once", took)
	}
	before := len(e.request("r-fen"))
	if err := stream.Purge(context.Background(), jetstream.WithPurgeSubject(filler)); err != nil {
		t.Fatal(err)
	}
	// Another request served in full after the purge (its tokens take
	// longer than a try's spacing): nothing of r-fen was stored meanwhile.
	e.accept("r-after", "p", 3, "w-fen")
	e.dispatch("w-fen", newDispatch("r-after", "p", 3))
	e.waitFor("another request's end", func() bool { _, ok := ended(e.request("r-after")); return ok })
	if got := len(e.request("r-fen")); got != before {
		t.Errorf("%d events of the fenced attempt after the purge, want %d", got, before)
	}
}

// refused starts worker id on request req, and fills the log once it has
// stored a few deltas, until the log refuses one and the worker stops
// generating. It returns the worker, the log and the subject of what
// filled it (purge it to make room).
func (e *env) refused(req, id string) (*running, jetstream.Stream, string) {
	e.t.Helper()
	r := e.start(nil, slow, worker.Config{ID: id})
	e.accept(req, "p", 1000, id)
	e.dispatch(id, newDispatch(req, "p", 1000))
	e.waitFor("the first deltas", func() bool { return len(e.request(req)) > 4 })
	filler := streams.RequestTokens("filler", 0, "w-other")
	stream := e.fillRequestLog(64<<10, filler)
	e.waitFor("the worker to stop at the refusal", func() bool {
		return value(e.t, r.reg, "dynamo_component_requests_total") == 1
	})
	return r, stream, filler
}
