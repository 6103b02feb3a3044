package runner

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/internal/notify"
	"github.com/baton-dev/baton/internal/promtext"
	"github.com/baton-dev/baton/internal/waitfor"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/fleet"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// fakeWorker answers dispatches on core NATS the way a worker would, and
// writes what its script says to the attempt's subject.
type fakeWorker struct {
	id     string
	refuse string // reply refused with this reason
	// busyFirst refuses its first busyFirst dispatches busy (another
	// frontend's request took its place), then serves.
	busyFirst int
	fail      *events.AttemptFailed // report this failure after accepting
	// cancelFirst, when set, has another frontend cancel the request in
	// this mode (the event only) while the dispatch is in flight; the fake
	// then writes nothing but what a command makes it write.
	cancelFirst string
	silent      bool // never answers a dispatch
	mute        bool // writes its first delta, then nothing (its tokens refused, or stalled)
	// holds says so in its lease (HoldsUntilRouted) and, as a worker
	// does, writes a held dispatch's output only once told its routed
	// decision is stored.
	holds bool
}

// runnerFixture is a runtime whose runner is driven directly (no HTTP, no
// Run), routing with a running fleet view whose workers' leases the fixture
// puts, and faked on core NATS.
type runnerFixture struct {
	t   *testing.T
	ctx context.Context
	rn  *Runner
	fl  *fleet.Fleet
	js  jetstream.JetStream
	reg *prometheus.Registry
	log *streams.Log
	wg  sync.WaitGroup // fake workers' writes in flight

	mu         sync.Mutex
	commands   []streams.Command        // what the fake workers received
	dispatches []events.Dispatch        // what they were sent
	servedBy   map[string]int           // dispatches per worker
	routed     map[string]chan struct{} // per request: closed at its routed command
	changed    *notify.Signal           // a command or dispatch came
}

func newRunnerFixture(t *testing.T, workers ...fakeWorker) *runnerFixture {
	return newRunnerFixtureConfig(t, func(*Config) {}, workers...)
}

// newRunnerFixtureConfig is newRunnerFixture with the runtime's Config as
// edit leaves it.
func newRunnerFixtureConfig(t *testing.T, edit func(*Config), workers ...fakeWorker) *runnerFixture {
	s := natstest.Start(t)
	js := s.Provision(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	reg := prometheus.NewRegistry()
	fl, err := fleet.New(s.Connect(t), "fe", nil, nil, fleet.Config{})
	if err != nil {
		t.Fatal(err)
	}
	fctx, stopFleet := context.WithCancel(context.Background())
	fleetDone := make(chan error, 1)
	go func() { fleetDone <- fl.Run(fctx) }()
	t.Cleanup(func() {
		stopFleet()
		if err := <-fleetDone; err != nil {
			t.Errorf("fleet: %v", err)
		}
	})
	cfg := Config{ID: "fe", MigrationLimit: 3, Streams: streams.Config{MemoryStorage: true}}
	edit(&cfg)
	rn, err := New(s.Connect(t), fl, nil, reg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	x := &runnerFixture{t: t, ctx: ctx, rn: rn, fl: fl, js: js, reg: reg, log: streams.NewLog(js, "fake-worker"), routed: map[string]chan struct{}{}, servedBy: map[string]int{}, changed: notify.NewSignal()}
	// The fake workers' connection is drained before the test ends (after
	// the runtime stopped, the cleanups run last first), so that no
	// dispatch or command is served once the test is over; the fixture's
	// ctx ends first, so that a worker waiting for its routed command
	// gives up.
	closed := make(chan struct{})
	nc := s.Connect(t, nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	t.Cleanup(func() {
		cancel()
		if err := nc.Drain(); err == nil {
			<-closed
		}
	})
	for _, w := range workers {
		x.put(streams.LeasesBucket, w.id, events.Lease{WorkerID: w.id, LeaseID: "L-" + w.id, Model: "m", HoldsUntilRouted: w.holds})
		if _, err := nc.Subscribe(streams.DispatchSubject(w.id), func(m *nats.Msg) { x.serve(w, m) }); err != nil {
			t.Fatal(err)
		}
		if _, err := nc.Subscribe(streams.CommandSubject(w.id), x.obey); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	x.waitFleet("every worker", func() bool {
		for _, w := range workers {
			if _, ok := fl.Worker(w.id); !ok {
				return false
			}
		}
		return true
	})
	return x
}

// put writes v as key's value in bucket.
func (x *runnerFixture) put(bucket, key string, v any) {
	kv, err := x.js.KeyValue(x.ctx, bucket)
	if err != nil {
		x.t.Fatal(err)
	}
	data, _ := json.Marshal(v)
	if _, err := kv.Put(x.ctx, key, data); err != nil {
		x.t.Fatal(err)
	}
}

// start starts the runtime (its presence at a made-up address) and stops
// it when the test ends.
func (x *runnerFixture) start() *Runner {
	x.t.Helper()
	if err := x.rn.Start(x.ctx, "127.0.0.1:1"); err != nil {
		x.t.Fatal(err)
	}
	x.t.Cleanup(x.rn.Stop)
	return x.rn
}

// depart deletes frontend id's presence key once the fleet view holds it
// and every frontend of alive live. It returns the time just before the
// delete was sent: no frontend can see the departure earlier (one may
// before the delete returns).
func (x *runnerFixture) depart(id string, alive ...string) time.Time {
	x.t.Helper()
	all := append([]string{id}, alive...)
	for ch := x.fl.FrontendsChanged(); slices.ContainsFunc(all, func(f string) bool { return !x.fl.FrontendAlive(f) }); ch = x.fl.FrontendsChanged() {
		select {
		case <-ch:
		case <-x.ctx.Done():
			x.t.Fatalf("the fleet view never saw every one of %v", all)
		}
	}
	kv, err := x.js.KeyValue(x.ctx, streams.FrontendsBucket)
	if err != nil {
		x.t.Fatal(err)
	}
	sent := time.Now()
	if err := kv.Delete(x.ctx, id); err != nil {
		x.t.Fatal(err)
	}
	return sent
}

// waitFleet waits until the fleet view satisfies cond.
func (x *runnerFixture) waitFleet(what string, cond func() bool) {
	x.t.Helper()
	for {
		ch := x.fl.WorkersChanged()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-x.ctx.Done():
			x.t.Fatalf("the fleet view never saw %s", what)
		}
	}
}

// busy reports one active request of worker id, so that another worker is
// the least loaded, tried first.
func (x *runnerFixture) busy(id string) {
	x.put(streams.LoadBucket, id, events.Load{WorkerID: id, ActiveRequests: 1})
	x.waitFleet(id+"'s load", func() bool { w, _ := x.fl.Worker(id); return w.Load.ActiveRequests == 1 })
}

func (x *runnerFixture) serve(w fakeWorker, m *nats.Msg) {
	x.wg.Add(1) // before the reply: the runner cannot stop before this
	defer x.wg.Done()
	var d events.Dispatch
	_ = json.Unmarshal(m.Data, &d)
	x.mu.Lock()
	dup := slices.ContainsFunc(x.dispatches, func(e events.Dispatch) bool { return e.RequestID == d.RequestID && e.Attempt == d.Attempt })
	x.dispatches = append(x.dispatches, d)
	x.servedBy[w.id]++
	if x.servedBy[w.id] <= w.busyFirst {
		w.refuse = streams.RefusedBusy
	}
	x.mu.Unlock()
	x.changed.Notify()
	if w.silent {
		return
	}
	if dup && w.holds { // accepted again, as a worker does, with no new job
		reply, _ := json.Marshal(streams.DispatchReply{Accepted: true})
		_ = m.Respond(reply)
		return
	}
	if w.cancelFirst != "" {
		c := events.RequestCancelled{RequestID: d.RequestID, Mode: w.cancelFirst, Reason: "elsewhere"}
		if _, err := x.log.Append(x.ctx, streams.RequestEvents(d.RequestID), x.log.Envelope(events.ID(d.RequestID, "cancelled"), d.RequestID, c), -1); err != nil {
			x.t.Error(err)
		}
	}
	reply, _ := json.Marshal(streams.DispatchReply{Accepted: w.refuse == "", Reason: w.refuse})
	_ = m.Respond(reply)
	if w.refuse != "" || w.cancelFirst != "" {
		return
	}
	if w.holds && d.Hold != "" {
		select {
		case <-x.routedOf(d.RequestID):
		case <-x.ctx.Done():
			return
		}
	}
	id, k := d.RequestID, d.Attempt
	var ev events.Event = events.TokensGenerated{RequestID: id, Attempt: k, Offset: d.StartOffset, Tokens: []string{"a ", "b "}}
	if w.fail != nil {
		f := *w.fail
		f.RequestID, f.Attempt, f.WorkerID = id, k, w.id
		ev = f
	}
	// A fake worker still writing when the fixture is torn down (its ctx
	// ends with the test) stops, as a real one would; any other failure to
	// append fails the test.
	if _, err := x.log.Append(x.ctx, streams.SubjectOf(id, w.id, ev), x.log.Envelope(events.ID(id, k, "1"), id, ev), -1); err != nil {
		if x.ctx.Err() == nil {
			x.t.Error(err)
		}
		return
	}
	if w.fail == nil && !w.mute {
		done := events.RequestCompleted{RequestID: id, Attempt: k, FinishReason: "length", CompletionTokens: 2}
		if _, err := x.log.Append(x.ctx, streams.SubjectOf(id, w.id, done), x.log.Envelope(events.ID(id, k, "done"), id, done), -1); err != nil && x.ctx.Err() == nil {
			x.t.Error(err)
		}
	}
}

// obey records a command, and carries out a stop as a worker does: the
// attempt completes with finish reason "cancelled".
func (x *runnerFixture) obey(m *nats.Msg) {
	var c streams.Command
	_ = json.Unmarshal(m.Data, &c)
	x.mu.Lock()
	x.commands = append(x.commands, c)
	x.mu.Unlock()
	x.changed.Notify()
	if c.Kind == streams.CommandRouted {
		close(x.routedOf(c.RequestID))
	}
	if c.Kind == streams.CommandCancel && c.Mode == events.CancelStop {
		x.wg.Add(1) // the runner may see the completion before its append returns
		defer x.wg.Done()
		id, worker := c.RequestID, strings.TrimPrefix(m.Subject, strings.TrimSuffix(streams.CommandSubject("_"), "_"))
		done := events.RequestCompleted{RequestID: id, Attempt: c.Attempt, FinishReason: "cancelled"}
		if _, err := x.log.Append(x.ctx, streams.SubjectOf(id, worker, done), x.log.Envelope(events.ID(id, c.Attempt, "done"), id, done), -1); err != nil {
			x.t.Error(err)
		}
	}
}

// routedOf is closed when request id's routed command came.
func (x *runnerFixture) routedOf(id string) chan struct{} {
	x.mu.Lock()
	defer x.mu.Unlock()
	ch, ok := x.routed[id]
	if !ok {
		ch = make(chan struct{})
		x.routed[id] = ch
	}
	return ch
}

// sent returns the dispatches the fake workers were sent.
func (x *runnerFixture) sent() []events.Dispatch {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]events.Dispatch(nil), x.dispatches...)
}

// received returns the commands the fake workers received.
func (x *runnerFixture) received() []streams.Command {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]streams.Command(nil), x.commands...)
}

// run accepts request id and runs its runner until it stops; it returns the
// request's final state.
func (x *runnerFixture) run(id string) projections.State {
	return x.runAfter(id, func(*follower) {})
}

// runAfter is run, with before called once the request's follower has read
// its accepted event and before its runner starts.
func (x *runnerFixture) runAfter(id string, before func(f *follower)) projections.State {
	acc := events.RequestAccepted{RequestID: id, Model: "m", Prompt: "p", PromptTokens: 1, MaxTokens: 2, Frontend: "fe"}
	if _, err := x.log.Append(x.ctx, streams.RequestEvents(id), x.log.Envelope(events.ID(id, "accepted"), id, acc), 0); err != nil {
		x.t.Fatal(err)
	}
	f, err := follow(x.ctx, x.rn.live, x.rn.js, x.rn.parts, id, true)
	if err != nil {
		x.t.Fatal(err)
	}
	defer f.stop()
	before(f)
	t := x.rn.requests.newRequest(id, f)
	x.rn.run(x.ctx, t)
	x.wg.Wait()
	var st projections.State
	f.view(func(p *projections.Request) { st = p.State() })
	return st
}

// migrations reads dynamo_frontend_model_migration_total{model="m",migration_type=typ}.
func (x *runnerFixture) migrations(typ string) float64 {
	return x.counter("dynamo_frontend_model_migration_total", "migration_type", typ)
}

// counter reads counter name, summed over its series whose labels hold
// the given pairs (label, value, ...).
func (x *runnerFixture) counter(name string, labels ...string) float64 {
	x.t.Helper()
	v, err := promtext.Gathered(x.reg, name, labels...)
	if err != nil {
		x.t.Fatal(err)
	}
	return v
}

// TestRunnerRefusalIsNoMigration: a busy refusal moves on to the next
// worker with no migration and no inhibition.
func TestRunnerRefusalIsNoMigration(t *testing.T) {
	x := newRunnerFixture(t, fakeWorker{id: "w1", refuse: streams.RefusedBusy}, fakeWorker{id: "w2"})
	x.busy("w2") // w1 is the less loaded: tried first
	st := x.run("r")
	if st.Status != "completed" || len(st.Migrations) != 0 || st.Worker != "w2" || len(st.Attempts) != 2 ||
		st.Attempts[0].WorkerID != "w1" || st.Attempts[0].CloseReason != "refused_busy" {
		t.Fatalf("state %+v: want w1 refused, then completed on w2 with no migration", st)
	}
	if got := x.migrations(events.MigrationNewRequest) + x.migrations(events.MigrationOngoingRequest); got != 0 {
		t.Errorf("migrations counted %v, want 0", got)
	}
	if got := x.counter("baton_frontend_worker_inhibitions_total", "worker_id", "w1"); got != 0 {
		t.Errorf("inhibitions of w1 counted %v, want 0", got)
	}
}

// TestRunnerBusyWaitsForPlace: with Config.BusyWait (the admission
// queue's wait), a request whose only worker refuses it busy twice (two
// frontends admitted on its one free place) waits for a place and is
// dispatched again, rather than fail 503: it completes on the third try.
func TestRunnerBusyWaitsForPlace(t *testing.T) {
	x := newRunnerFixtureConfig(t, func(c *Config) { c.BusyWait = 10 * time.Second }, fakeWorker{id: "w1", busyFirst: 2})
	st := x.run("r")
	if st.Status != "completed" || len(st.Attempts) != 3 || st.Attempts[0].CloseReason != "refused_busy" ||
		st.Attempts[1].CloseReason != "refused_busy" || len(st.Migrations) != 0 {
		t.Fatalf("state %+v: want refused busy twice, then completed on w1 with no migration", st)
	}
}

// TestRunnerBusyWaitEnds: a worker that stays busy past Config.BusyWait
// fails the request 503 all_workers_busy, as admission does, after a
// handful of tries (the back-off doubles), not one a millisecond; without
// BusyWait the one refusal fails it at once.
func TestRunnerBusyWaitEnds(t *testing.T) {
	for _, wait := range []time.Duration{0, 400 * time.Millisecond} {
		t.Run(wait.String(), func(t *testing.T) {
			x := newRunnerFixtureConfig(t, func(c *Config) { c.BusyWait = wait }, fakeWorker{id: "w1", refuse: streams.RefusedBusy})
			start := time.Now()
			st := x.run("r")
			took := time.Since(start)
			if st.Status != "failed" || st.Failure == nil || st.Failure.Status != 503 {
				t.Fatalf("state %+v: want failed 503", st)
			}
			switch {
			case wait == 0 && len(st.Attempts) != 1:
				t.Errorf("%d attempts without BusyWait, want 1", len(st.Attempts))
			case wait > 0 && (st.Failure.Code != "all_workers_busy" || took < wait):
				t.Errorf("failed %q after %v, want all_workers_busy after BusyWait %v", st.Failure.Code, took, wait)
			case wait > 0 && (len(st.Attempts) < 2 || len(st.Attempts) > 8):
				t.Errorf("%d attempts in %v, want a few (the back-off doubles from %v)", len(st.Attempts), took, busyBackoffMin)
			}
		})
	}
}

// TestRunnerUnreadableLogFails: a runner that cannot read its request's
// log back, after its follower missed a decision another writer stored (as
// a frontend disconnected as a slow consumer misses live messages), decides
// nothing and fails the request 503 log_unreadable once the stall timeout
// has passed, its end stored in the ends place. Before, its routed
// decision conflicted, the catch-up failed, and it dispatched again for
// ever: its client got nothing.
func TestRunnerUnreadableLogFails(t *testing.T) {
	const stall = time.Second
	x := newRunnerFixtureConfig(t, func(c *Config) { c.StallTimeout = stall }, fakeWorker{id: "w1"})
	start := time.Now()
	st := x.runAfter("r", func(f *follower) {
		seen := f.eventsSeq()
		other := events.RequestAttached{RequestID: "r", Frontend: "fe"}
		seq, err := x.log.Append(x.ctx, streams.RequestEvents("r"), x.log.Envelope(events.ID("r", "attached", "x"), "r", other), -1)
		if err != nil {
			t.Fatal(err)
		}
		// The live copy of the other writer's decision is lost, and the
		// log cannot be read back: direct gets are refused.
		waitfor.Poll(t, "the other decision seen live", func() bool { return f.eventsSeq() >= seq })
		f.mu.Lock()
		f.lastBySubj.set(streams.RequestEvents("r"), seen)
		f.mu.Unlock()
		stream, err := x.js.Stream(x.ctx, x.rn.parts.StreamOf("r"))
		if err != nil {
			t.Fatal(err)
		}
		cfg := stream.CachedInfo().Config
		cfg.AllowDirect = false
		if _, err := x.js.UpdateStream(x.ctx, cfg); err != nil {
			t.Fatal(err)
		}
	})
	took := time.Since(start)
	if st.Status != "failed" || st.Failure == nil || st.Failure.Code != "log_unreadable" || st.Failure.Status != 503 {
		t.Fatalf("state %+v: want failed 503 log_unreadable", st)
	}
	if took < stall {
		t.Errorf("failed after %v, want the stall timeout (%v) of failed reads first", took, stall)
	}
	if n := len(x.sent()); n != 0 {
		t.Errorf("%d dispatches sent, want none (no routed decision could be stored)", n)
	}
	end, err := streams.ReadEnd(x.ctx, x.js, "r")
	if err != nil || end == nil {
		t.Fatalf("the ends place holds %v (%v), want the failure", end, err)
	}
	if e := end.Event.(events.RequestEnded); e.Failed == nil || e.Failed.Code != "log_unreadable" {
		t.Errorf("end %+v, want the log_unreadable failure", e)
	}
}

// TestRunnerDispatchUnanswered: a dispatch the worker does not answer in
// time is counted as unanswered, inhibits the worker (both counted), and
// the request migrates as new_request to the other worker.
func TestRunnerDispatchUnanswered(t *testing.T) {
	x := newRunnerFixture(t, fakeWorker{id: "w1", silent: true}, fakeWorker{id: "w2"})
	x.rn.dispatcher.timeout = 100 * time.Millisecond
	x.busy("w2") // w1 is the less loaded: tried first
	st := x.run("r")
	if st.Status != "completed" || len(st.Migrations) != 1 || st.Migrations[0].MigrationType != events.MigrationNewRequest || st.Worker != "w2" {
		t.Fatalf("state %+v: want one new_request migration, completed on w2", st)
	}
	for _, c := range []struct {
		name string
		want float64
	}{
		{"baton_frontend_dispatch_unanswered_total", 1},
		{"baton_frontend_worker_inhibitions_total", 1},
	} {
		if got := x.counter(c.name, "worker_id", "w1"); got != c.want {
			t.Errorf("%s{worker_id=w1} = %v, want %v", c.name, got, c.want)
		}
		if got := x.counter(c.name, "worker_id", "w2"); got != 0 {
			t.Errorf("%s{worker_id=w2} = %v, want 0", c.name, got)
		}
	}
	if got := x.migrations(events.MigrationNewRequest); got != 1 {
		t.Errorf("new_request migrations counted %v, want 1", got)
	}
}

// TestRunnerUpstreamUnavailable: an overloaded upstream migrates the request
// as new_request, counts it once the other worker accepted, and inhibits
// the worker.
func TestRunnerUpstreamUnavailable(t *testing.T) {
	fail := &events.AttemptFailed{Reason: "engine_error", Class: events.FailureUnavailable, Status: 429, RetryAfterMS: 60_000}
	x := newRunnerFixture(t, fakeWorker{id: "w1", fail: fail}, fakeWorker{id: "w2"})
	x.busy("w2")
	st := x.run("r")
	if st.Status != "completed" || len(st.Migrations) != 1 || st.Migrations[0].MigrationType != events.MigrationNewRequest ||
		st.Migrations[0].FromWorker != "w1" || st.Worker != "w2" {
		t.Fatalf("state %+v: want one new_request migration, completed on w2", st)
	}
	if got := x.migrations(events.MigrationNewRequest); got != 1 {
		t.Errorf("new_request migrations counted %v, want 1", got)
	}
	if got := x.counter("baton_frontend_worker_inhibitions_total", "worker_id", "w1"); got != 1 {
		t.Errorf("inhibitions of w1 counted %v, want 1", got)
	}
}

// TestRunnerClientError: an upstream that rejects the request fails it with
// the upstream's status, without migrating it or inhibiting the worker.
func TestRunnerClientError(t *testing.T) {
	fail := &events.AttemptFailed{Reason: "engine_error", Class: events.FailureClient, Status: 422, Code: "context_length_exceeded", Message: "too long"}
	x := newRunnerFixture(t, fakeWorker{id: "w1", fail: fail}, fakeWorker{id: "w2"})
	x.busy("w2")
	st := x.run("r")
	if st.Status != "failed" || st.Failure == nil || st.Failure.Status != 422 || st.Failure.Code != "context_length_exceeded" ||
		len(st.Migrations) != 0 || len(st.Attempts) != 1 || st.Attempts[0].WorkerID != "w1" {
		t.Fatalf("state %+v failure %+v: want failed with 422 context_length_exceeded and no migration", st, st.Failure)
	}
	if got := x.counter("baton_frontend_worker_inhibitions_total", "worker_id", "w1"); got != 0 {
		t.Errorf("inhibitions of w1 counted %v after the upstream rejected the request itself, want 0", got)
	}
}

// TestRunnerHeldDispatch: to a worker that holds its output until told its
// routed decision is stored, the dispatch goes with the routed append (it
// carries a hold id) and the worker is told once the decision is stored;
// to one that does not, the dispatch goes after the append, without one.
func TestRunnerHeldDispatch(t *testing.T) {
	for _, holds := range []bool{true, false} {
		x := newRunnerFixture(t, fakeWorker{id: "w1", holds: holds})
		st := x.run("r")
		if st.Status != "completed" || st.Worker != "w1" || len(st.Attempts) != 1 {
			t.Fatalf("holds=%v: state %+v, want completed on w1 in one attempt", holds, st)
		}
		ds := x.sent()
		if len(ds) != 1 || (ds[0].Hold != "") != holds {
			t.Errorf("holds=%v: dispatches %+v, want one, held=%v", holds, ds, holds)
		}
		var notices int
		for _, c := range x.received() {
			if c.Kind == streams.CommandRouted && c.RequestID == "r" && c.Attempt == 0 {
				notices++
			}
		}
		if want := map[bool]int{true: 1, false: 0}[holds]; notices != want {
			t.Errorf("holds=%v: %d routed notices, want %d", holds, notices, want)
		}
	}
}
