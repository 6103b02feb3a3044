package integration

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/streams"
)

// Batched output (--batched-output, issue 33): workers write their
// attempts' output in batches to streams of their own, frontends follow
// them, fence them there and copy them to the request's partition. The
// faults below are the per-token ones, and every answer must be the
// fault-free one, in the stream and in the log.

// batchedStack starts NATS, n frontends and two workers, all with
// --batched-output, on a request log of testPartitions partitions, and
// waits until both workers' leases say they write batches.
func batchedStack(t *testing.T, n int, workerArgs []string, frontendArgs ...string) (*stack, []*frontend) {
	t.Helper()
	s := newStack(t)
	s.partitions = testPartitions
	args := append([]string{"--batched-output", "--migration-limit", "3", "--nats-system-url", s.sysURL()}, frontendArgs...)
	var fes []*frontend
	for range n {
		fes = append(fes, s.frontend(nil, args...))
	}
	s.workerEnv = []string{"DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS=1"}
	wargs := append([]string{"--batched-output", "--mock-tokens-per-sec", "100", "--mock-ttft", "10ms"}, workerArgs...)
	s.worker("w1", wargs...)
	s.worker("w2", wargs...)
	for _, fe := range fes {
		fe.waitRoutable(t, "w1", "w2")
	}
	waitWritesBatched(t, s, "w1", "w2")
	return s, fes
}

// waitWritesBatched waits until the leases of workers say they write
// batches (they have their output streams).
func waitWritesBatched(t testing.TB, s *stack, workers ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	leases, err := s.jetStream(t).KeyValue(ctx, streams.LeasesBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range workers {
		waitFor(t, 20*time.Second, w+"'s lease to say writes_batched", func() bool {
			e, err := leases.Get(ctx, w)
			return err == nil && strings.Contains(string(e.Value()), `"writes_batched":true`)
		})
	}
}

// checkBatchedLog folds request id from its partition alone, as a reader
// that predates batches does, once it says the request ended (the owner
// copies an attempt's end after its client saw it), and checks that its
// first attempt was batched and that it reads as the fault-free answer of
// maxTokens to prompt. It returns the fold.
func checkBatchedLog(t *testing.T, s *stack, id, prompt string, maxTokens int) *projections.Request {
	t.Helper()
	var p *projections.Request
	var stored int
	var read []string
	waitFor(t, 10*time.Second, id+" to end in the log", func() bool {
		p, stored, read = foldPartition(t, s, id)
		return p.Status.Terminal()
	})
	defer func() {
		if t.Failed() {
			t.Logf("the log of %s:\n%s", id, strings.Join(read, "\n"))
		}
	}()
	if len(p.Attempts) == 0 || !p.Attempts[0].Batched() {
		t.Fatalf("attempts %+v: the first one is not batched", p.Attempts)
	}
	if want := engine.MockText(prompt, 0, maxTokens); p.Status != projections.StatusCompleted || p.Text() != want {
		t.Fatalf("the log folds to %s %q, want completed %q", p.Status, p.Text(), want)
	}
	// Per token, the partition would hold a message a token or so.
	if stored > maxTokens/2 {
		t.Errorf("the partition holds %d messages of the request, for %d tokens: the output was not batched", stored, maxTokens)
	}
	return p
}

// foldPartition folds request id from the request log, and returns the
// messages it read and a line for each event: its sequence, subject, id,
// what it says and why the fold passed it over, if it did.
func foldPartition(t *testing.T, s *stack, id string) (p *projections.Request, stored int, read []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p = projections.NewRequest()
	for e, err := range readLog(ctx, t, s.jetStream(t), id) {
		if err != nil {
			t.Fatalf("read %s from the log: %v", id, err)
		}
		if e.Seq != 0 {
			stored++
		}
		_, why := p.Fold(e)
		read = append(read, fmt.Sprintf("%d %s %s: %s %s", e.Seq, e.Stored, e.ID, projections.Describe(e), why))
	}
	return p, stored, read
}

// TestBatchedCompletes: a batched answer streams as the per-token one, and
// its partition alone (no compaction: the consolidated copies, not the
// compact record) folds to it, with a message for every few tokens at most.
func TestBatchedCompletes(t *testing.T) {
	t.Parallel()
	s, fes := batchedStack(t, 1, nil, "--log-compaction=false")
	prompt := "batched and complete"
	res := postStream(t, fes[0].url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 100},
		map[string]string{"X-Request-Id": "b-done"}, nil)
	checkComplete(t, res, prompt, 100)
	checkBatchedLog(t, s, "b-done", prompt, 100)
}

// TestBatchedWorkerFaults: the worker of a batched attempt is killed
// (SIGKILL), stops producing (SIGSTOP, a stall) or drains (SIGTERM)
// mid-stream; the
// frontend fences the attempt in the worker's stream, copies what it
// accepted to the partition, and migrates. The stream and the log both
// read as the fault-free answer.
func TestBatchedWorkerFaults(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			s, fes := batchedStack(t, 1, nil, "--log-compaction=false", "--stall-timeout", "1s")
			prompt := "batched worker fault " + sig.String()
			var stopped *proc
			res := faultAfter(t, fes[0], "b-fault", prompt, 120, 20, func(w string) {
				stopped = s.workers[w]
				stopped.signal(sig)
			})
			if sig == syscall.SIGSTOP {
				stopped.signal(syscall.SIGCONT) // the zombie writes on: nobody reads past the fence
			}
			checkComplete(t, res, prompt, 120)
			p := checkBatchedLog(t, s, "b-fault", prompt, 120)
			if len(p.Migrations) != 1 || !p.Attempts[0].Closed {
				t.Errorf("migrations %+v, attempts %+v: want attempt 0 closed and one migration", p.Migrations, p.Attempts)
			}
		})
	}
}

// TestBatchedResumeAfterFrontendKill: the owner of a batched attempt is
// killed mid-stream; the client resumes on the other frontend, which
// takes the request over, reads the attempt's output back from the
// worker's stream and follows the dead frontend's subject: exactly the
// rest, with no migration.
func TestBatchedResumeAfterFrontendKill(t *testing.T) {
	t.Parallel()
	s, fes := batchedStack(t, 2, []string{"--mock-hold-at-token", "40"}) // held there until the kill
	prompt := "batched resume after a frontend crash"
	first := streamFaults(t, fes[0], "b-resume", prompt, 100, true, faultAt{20, func() {
		fes[0].signal(syscall.SIGKILL)
		s.release("")
	}})
	if first.done {
		t.Fatal("the first stream completed: the kill came too late")
	}
	rest := resume(t, fes[1], "b-resume", lastID(first))
	joined(t, first, rest, prompt, 100)
	p := checkBatchedLog(t, s, "b-resume", prompt, 100)
	if len(p.Migrations) != 0 {
		t.Errorf("migrations %+v: the takeover migrated the attempt", p.Migrations)
	}
	if p.Attempts[0].OutputTo == "" || p.Owner == p.Attempts[0].OutputTo {
		t.Errorf("owner %q, attempt %+v: want the request owned by the frontend that resumed it", p.Owner, p.Attempts[0])
	}
}

// TestBatchedRoutedRecordsOutput: a batched attempt's routed decision
// names its output, and the timeline says so.
func TestBatchedRoutedRecordsOutput(t *testing.T) {
	t.Parallel()
	s, fes := batchedStack(t, 1, nil)
	res := postStream(t, fes[0].url, "/v1/completions", map[string]any{"model": "mock", "prompt": "routed batched", "max_tokens": 10},
		map[string]string{"X-Request-Id": "b-routed"}, nil)
	checkComplete(t, res, "routed batched", 10)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var routed *events.RequestRouted
	for e, err := range readLog(ctx, t, s.jetStream(t), "b-routed") {
		if err != nil {
			t.Fatal(err)
		}
		switch ev := e.Event.(type) {
		case events.RequestRouted:
			routed = &ev
		case events.RequestAccepted:
			routed = ev.Route
		}
		if routed != nil {
			if d := projections.Describe(e); !strings.Contains(d, "batched") {
				t.Errorf("the routed decision reads %q: no word of its batches", d)
			}
			break
		}
	}
	if routed == nil || routed.Output != events.OutputBatched || routed.OutputTo == "" {
		t.Fatalf("routed %+v: want output batched to the frontend", routed)
	}
}

// TestBatchedOutputFull: a worker's output stream fills mid-answer (its
// cap, --worker-output-max-bytes, is a few dozen batches): the worker's
// writes are refused, nothing else is, and the frontend, which cannot
// store its fence there either (a stall: the worker's end cannot be
// stored), seals the attempt at what it holds, copies it to the partition,
// and migrates it to the other worker. The answer is
// the fault-free one, in the stream and in the log.
func TestBatchedOutputFull(t *testing.T) {
	t.Parallel()
	s, fes := batchedStack(t, 1, nil, "--log-compaction=false", "--stall-timeout", "1s", "--worker-output-max-bytes", "24576")
	prompt := "batched into a full stream"
	res := postStream(t, fes[0].url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 120},
		map[string]string{"X-Request-Id": "b-full"}, nil)
	checkComplete(t, res, prompt, 120)
	p := checkBatchedLog(t, s, "b-full", prompt, 120)
	if len(p.Migrations) == 0 || !p.Attempts[0].Closed {
		t.Errorf("migrations %+v, attempts %+v: want attempt 0 closed when its stream filled, and a migration", p.Migrations, p.Attempts)
	}
}
