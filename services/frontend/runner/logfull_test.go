package runner

import (
	"errors"
	"strings"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/waitfor"
	"github.com/baton-dev/baton/migrations"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// TestRunnerLogFullAttemptFails: a worker that says the log refused its
// attempt's tokens (class log_full) has the request fail with 503
// log_full, whatever the log reads by now: no migration, no inhibition.
func TestRunnerLogFullAttemptFails(t *testing.T) {
	x := newRunnerFixture(t, fakeWorker{id: "w1", fail: &events.AttemptFailed{Reason: events.FailureLogFull, Class: events.FailureLogFull}}, fakeWorker{id: "w2"})
	x.busy("w2") // w1 is the less loaded: tried first
	st := x.run("r")
	if st.Status != "failed" || st.Failure == nil || st.Failure.Code != migrations.CodeLogFull || st.Failure.Status != 503 || len(st.Migrations) != 0 {
		t.Fatalf("state %+v (failure %+v): want failed 503 log_full on w1, no migration", st, st.Failure)
	}
	if got := x.counter("baton_frontend_worker_inhibitions_total", "worker_id", "w1"); got != 0 {
		t.Errorf("inhibitions of w1 counted %v, want 0", got)
	}
}

// TestRunnerFencesWhenTheFullLogRefusesTheFailure: the log is full and
// refuses the request's log_full failure too. The request ends here even
// so, and its worker is fenced at once, not once the failure could be
// stored: else a worker trying to store its attempt's end would store it
// once eviction made room, perhaps by evicting this very request. (Without
// eviction here, the log stays full until the test makes room.)
func TestRunnerFencesWhenTheFullLogRefusesTheFailure(t *testing.T) {
	x := newRunnerFixtureConfig(t, func(c *Config) { c.Log.NoEvict = true }, fakeWorker{id: "w1", mute: true})
	x.start() // the log's monitor
	stream, err := x.js.Stream(x.ctx, "BATON_REQUESTS")
	if err != nil {
		t.Fatal(err)
	}
	cfg := stream.CachedInfo().Config
	cfg.MaxBytes = 64 << 10
	if _, err := x.js.UpdateStream(x.ctx, cfg); err != nil {
		t.Fatal(err)
	}
	done := make(chan projections.State, 1)
	go func() { done <- x.run("r") }()
	waitfor.Signal(t, x.changed, "the dispatch", func() bool { return len(x.sent()) == 1 })
	waitfor.Poll(t, "the worker's delta", func() bool {
		info, err := stream.Info(x.ctx)
		return err == nil && info.State.Msgs >= 3 // accepted, routed, the delta
	})

	// The filler is a request in flight (its accepted event, of a long
	// prompt): eviction keeps it.
	filler := streams.RequestEvents("filler")
	for try := 0; ; try++ {
		info, err := stream.Info(x.ctx)
		if err != nil {
			t.Fatal(err)
		}
		size := int(cfg.MaxBytes-int64(info.State.Bytes)) - 100 - 10*try
		if size <= 0 || try == 100 {
			t.Fatalf("could not fill the log (%d of %d bytes)", info.State.Bytes, cfg.MaxBytes)
		}
		acc := events.RequestAccepted{RequestID: "filler", Model: "m", Prompt: strings.Repeat("x", size), PromptTokens: 1, MaxTokens: 2, Frontend: "other"}
		if _, err := x.log.Append(x.ctx, filler, x.log.Envelope(events.ID("filler", "accepted", try), "filler", acc), 0); err == nil {
			break
		} else if !errors.Is(err, streams.ErrStreamFull) {
			t.Fatal(err)
		}
	}
	fenced := func() bool {
		for _, c := range x.received() {
			if c.RequestID == "r" && c.Attempt == 0 && c.Kind == streams.CommandFence {
				return true
			}
		}
		return false
	}
	waitfor.Signal(t, x.changed, "w1's fence while the log refuses the failure", fenced)
	select {
	case st := <-done:
		t.Fatalf("the runner stopped with the log full: %+v", st)
	default:
	}
	if err := stream.Purge(x.ctx, jetstream.WithPurgeSubject(filler)); err != nil {
		t.Fatal(err)
	}
	if st := <-done; st.Status != "failed" || st.Failure == nil || st.Failure.Code != migrations.CodeLogFull {
		t.Fatalf("state %+v (failure %+v): want failed log_full", st, st.Failure)
	}
}
