package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/streams"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Worker serves one engine behind a lease. Create it with New and run it once
// with Run.
type Worker struct {
	nc *nats.Conn
	js jetstream.JetStream
	// ctl carries dispatches and their replies on a connection of its own,
	// opened by Run with nc's options and closed with nc: on nc they would
	// queue behind thousands of token deltas and their acks, and a dispatch
	// reply late by seconds makes a frontend inhibit a healthy worker. The
	// lease stays on nc, so a worker whose deltas cannot reach the log loses
	// it.
	ctl     *nats.Conn
	eng     engine.Engine
	log     *slog.Logger
	cfg     Config
	metrics *metrics
	events  *streams.Log

	health *monitor

	// The parts with receivers of their own, each holding what it uses.
	upstream     *upstream      // upstream.go
	registration *registration  // lease.go
	load         *loadReporter  // load.go
	watch        *engineWatch   // liveness.go
	server       *statusServer  // status.go
	checks       *checks        // commands.go, hold.go
	detacher     *detacher      // detach.go
	output       *outputStream  // output.go; nil without Config.BatchedOutput
	batched      *batchedOutput // batched.go; nil without Config.BatchedOutput

	mu       sync.Mutex // guards running, draining, jobs and early
	running  bool
	draining bool
	jobs     map[jobKey]*job
	early    earlyNotices // routed notices that came before their dispatch (hold.go)
	gens     sync.WaitGroup

	logOff *logOffMode // Config.BenchLogOff only; nil otherwise

	fatalOnce sync.Once
	fatalCh   chan struct{}
	fatalErr  error // set once, before fatalCh closes
}

// New returns a worker for eng on nc. cfg's zero values mean the defaults.
// Metrics are registered on reg (nil: not registered); if reg is also a
// prometheus.Gatherer, the status server's /metrics serves it.
func New(nc *nats.Conn, eng engine.Engine, log *slog.Logger, reg prometheus.Registerer, cfg Config) (*Worker, error) {
	if nc == nil || eng == nil {
		return nil, errors.New("worker: a NATS connection and an engine are required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("worker: config: %w", err)
	}
	cfg = cfg.withDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// The token appends' window and ack timeout are the log's
	// (streams.AppendWindow, AppendAckTimeout), not nats.go's.
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("worker: jetstream: %w", err)
	}
	w := &Worker{
		nc: nc, js: js, eng: eng, cfg: cfg,
		log:     log.With("worker_id", cfg.ID),
		events:  streams.NewLog(js, "baton/worker/"+cfg.ID),
		jobs:    map[jobKey]*job{},
		early:   earlyNotices{},
		fatalCh: make(chan struct{}),
	}
	if cfg.BenchLogOff {
		w.logOff = newLogOffMode(nc)
	}
	w.health = newMonitor(cfg.HealthCheck, cfg.CanaryWait, cfg.HealthCheckTimeout,
		canaryProbe(eng, cfg.ID, w.fail), w.healthChanged)
	w.health.onCanary = w.canaryDone
	w.upstream = newUpstream(eng, w.log, w.health, cfg.UpstreamProbeInterval)
	w.load = newLoadReporter(js, eng, w.upstream.busy, w.log, cfg)
	w.upstream.loadChanged = w.load.notify
	if _, ok := eng.(interface{ FirstTokenTimeout() time.Duration }); ok {
		w.health.queued = true // time in the server's queue is not a stall
	}
	w.metrics, err = newMetrics(reg, cfg.ID, w.Ready, func() bool {
		_, why := w.health.state()
		return why == engineStalled
	}, eng.Stats)
	if err != nil {
		return nil, err
	}
	if cfg.BatchedOutput {
		w.output = &outputStream{id: cfg.ID, log: w.log}
		if w.batched, err = newBatchedOutput(cfg.ID, w.events, w.log); err != nil {
			return nil, err
		}
		w.output.answered, w.batched.askRoom = w.batched.noteRoom, w.output.room
	}
	w.registration = &registration{cfg: cfg, nc: nc, js: js, eng: eng, events: w.events, health: w.health,
		upstream: w.upstream, output: w.output, live: w.metrics.leaseLive, loadChanged: w.load.notify, log: w.log}
	w.upstream.readinessChanged = w.registration.syncReady
	w.watch = &engineWatch{eng: eng, interval: cfg.LivenessInterval, timeout: cfg.LivenessTimeout, health: w.health,
		upstream: w.upstream, stopAll: w.stopAll, readinessChanged: w.registration.syncReady, log: w.log}
	w.checks = &checks{id: cfg.ID, log: w.log}
	w.detacher = &detacher{frontends: newFrontends(), checks: w.checks, js: js, log: w.log}
	w.server = &statusServer{addr: cfg.SystemAddr, status: w.Status, gatherer: prometheus.DefaultGatherer, log: w.log}
	if g, ok := reg.(prometheus.Gatherer); ok {
		w.server.gatherer = g
	}
	return w, nil
}

// ID is the worker's id.
func (w *Worker) ID() string { return w.cfg.ID }

// Run registers the worker and serves dispatches until ctx is done or the
// engine fails, then shuts down within Config.ShutdownTimeout. It returns nil
// after a shutdown on ctx, an error wrapping engine.ErrFatal after an engine
// failure, and other errors when the worker cannot start (the process should
// exit 1). Run may be called once.
func (w *Worker) Run(ctx context.Context) error {
	w.mu.Lock()
	if w.running {
		w.mu.Unlock()
		return errors.New("worker: Run called twice")
	}
	w.running = true
	w.mu.Unlock()

	// The status server runs for the whole of Run, shutdown included, so
	// that /live answers while starting and /health shows the drain.
	stopStatus, err := w.server.serve()
	if err != nil {
		return err
	}
	defer stopStatus()
	if err := w.openControl(); err != nil {
		return err
	}
	defer w.ctl.Close() // last: the shutdown's lease and load deletes use it
	if err := w.open(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting for the log: nothing to shut down
		}
		return err
	}
	// Probe the upstream before listening: a dispatch can come before the
	// lease exists (to a previous incarnation's lease, still live after a
	// crash), and one served with the engine's capabilities unknown went
	// without the token ids a migration continues from. Listen before the
	// lease exists, so nobody can dispatch to a worker that is not yet
	// listening.
	w.upstream.probe(ctx)
	// Ask for the output stream before listening too: a dispatch to a
	// previous incarnation's lease may ask for batched output.
	w.output.ask(ctx)
	subs, err := w.listen(ctx)
	if err != nil {
		return err
	}
	l, err := w.registration.first(ctx)
	if err != nil {
		unsubscribe(subs)
		if ctx.Err() != nil {
			return nil // stopped while registering: a lease granted meanwhile is revoked (register)
		}
		return err
	}

	bg, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	var background sync.WaitGroup
	background.Go(func() { w.registration.keep(bg, l) })
	background.Go(func() { w.registration.askAgain(bg) })
	background.Go(func() { w.load.run(bg) })
	background.Go(func() { w.health.Run(bg) })
	background.Go(func() { w.detacher.watch(bg) })
	background.Go(func() { w.checkOnReconnect(bg) })
	background.Go(func() { w.upstream.reprobe(bg) })
	background.Go(func() { w.watch.run(bg) })
	w.load.notify()

	reason := "shutdown"
	select {
	case <-ctx.Done():
	case <-w.fatalCh:
		reason = "engine_error"
	}
	w.shutdown(ctx, reason, subs, stopBackground, &background)
	select {
	case <-w.fatalCh:
		return fmt.Errorf("worker %s: %w", w.cfg.ID, w.fatalErr)
	default:
		return nil
	}
}

// openControl opens the control connection (see Worker.ctl) with the
// options of the worker's connection, and closes it when nc closes.
func (w *Worker) openControl() error {
	opts := w.nc.Opts
	opts.Name += " (control)"
	ctl, err := opts.Connect()
	if err != nil {
		return fmt.Errorf("worker: control connection: %w", err)
	}
	closed, ctlClosed := w.nc.StatusChanged(nats.CLOSED), ctl.StatusChanged(nats.CLOSED)
	go func() {
		defer w.nc.RemoveStatusListener(closed)
		defer ctl.RemoveStatusListener(ctlClosed)
		if !w.nc.IsClosed() && !ctl.IsClosed() {
			select {
			case <-closed:
			case <-ctlClosed:
			}
		}
		ctl.Close()
	}()
	w.ctl, w.checks.ctl = ctl, ctl
	if w.output != nil {
		w.output.nc = ctl
	}
	return nil
}

// open waits for the streams and buckets to be provisioned (by a frontend
// or `baton provision`: a worker creates none, so that a worker credential
// cannot define the log, issue 23), verifies that they are defined as its
// own flags define them, and binds the buckets, retrying what fails
// transiently for streams.StartBudget.
func (w *Worker) open(ctx context.Context) error {
	err := streams.WaitProvisioned(ctx, w.js, w.cfg.Streams, func(err error) {
		w.log.Warn("waiting for the log to be provisioned by a frontend or `baton provision`; a worker creates no stream", "err", err)
	})
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, streams.StartBudget)
	defer cancel()
	return streams.Retry(ctx, func(ctx context.Context) error {
		var err error
		if w.registration.kv, err = w.js.KeyValue(ctx, streams.LeasesBucket); err != nil {
			return fmt.Errorf("worker: bind %s: %w", streams.LeasesBucket, err)
		}
		if w.load.kv, err = w.js.KeyValue(ctx, streams.LoadBucket); err != nil {
			return fmt.Errorf("worker: bind %s: %w", streams.LoadBucket, err)
		}
		return nil
	})
}

// shutdown drains and leaves, in this order:
//  1. refuse new dispatches (RefusedDraining), then mark the lease draining
//     and append worker_draining, so discovery stops routing here at once;
//  2. wait for in-flight generations until the drain deadline (the budget
//     minus a reserve for the steps below);
//  3. hand off what is still running: stop it and append attempt_failed
//     "shutdown", so the owning frontend migrates it, until the budget
//     minus the leave's own part of the reserve (a hand-off that overruns
//     must not leave the worker to be declared lost instead of deregistered:
//     the frontends migrate its attempts when the lease goes either way);
//  4. stop renewing, delete the lease key, stop load reports and delete the
//     load key, append worker_deregistered;
//  5. unsubscribe from dispatches and commands (until then late dispatches
//     are refused rather than timing out);
//  6. (in Run, after this returns) stop the status server.
//
// Canaries and the progress check stop with the background work in step 1.
// Every step runs on context.WithTimeout(context.WithoutCancel(ctx), budget).
func (w *Worker) shutdown(ctx context.Context, reason string, subs []*nats.Subscription, stopBackground context.CancelFunc, background *sync.WaitGroup) {
	budget := w.cfg.ShutdownTimeout
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budget)
	defer cancel()
	reserve := min(budget/4, 2*time.Second)
	drainCtx, cancelDrain := context.WithTimeout(sctx, budget-reserve)
	defer cancelDrain()
	handOffCtx, cancelHandOff := context.WithTimeout(sctx, budget-reserve/2)
	defer cancelHandOff()

	// 1. Refuse, then announce.
	w.mu.Lock()
	w.draining = true
	n := len(w.jobs)
	w.mu.Unlock()
	w.log.Info("draining", "reason", reason, "in_flight", n, "budget", budget)
	stopBackground() // no re-registration from here on; load reports stop too
	background.Wait()
	l := w.registration.current()
	leaseID := ""
	if l != nil {
		leaseID = l.ID()
		if err := l.setDraining(); err != nil {
			w.log.Warn("mark lease draining", "lease_id", leaseID, "err", err)
		}
	}
	w.appendWorker(sctx, "draining", events.WorkerDraining{WorkerID: w.cfg.ID, LeaseID: leaseID, Reason: reason})

	// 2. Drain.
	if !waitGroup(drainCtx, &w.gens) {
		// 3. Hand off.
		w.mu.Lock()
		left := len(w.jobs)
		for _, j := range w.jobs {
			j.overrule(errHandOff)
		}
		w.mu.Unlock()
		w.log.Warn("drain budget spent; handing off", "in_flight", left)
		if !waitGroup(handOffCtx, &w.gens) {
			w.log.Error("hand-off did not finish within the shutdown budget; leaving")
		}
	}

	// 4. Leave.
	if l != nil {
		if err := l.revoke(sctx); err != nil {
			w.log.Warn("revoke lease", "lease_id", leaseID, "err", err)
		}
	}
	w.metrics.leaseLive.Set(0)
	if err := w.load.kv.Delete(sctx, w.cfg.ID); err != nil {
		w.log.Warn("delete load key", "err", err)
	}
	w.appendWorker(sctx, "deregistered", events.WorkerDeregistered{WorkerID: w.cfg.ID, LeaseID: leaseID})

	// 5. Stop listening.
	unsubscribe(subs)
	if w.batched != nil {
		_ = w.batched.close() // every attempt settled its entries: nothing is left
	}
	w.log.Info("stopped", "lease_id", leaseID)
}

// fail records a fatal engine error and starts the shutdown.
func (w *Worker) fail(err error) {
	w.fatalOnce.Do(func() {
		w.fatalErr = err
		close(w.fatalCh)
	})
}

// appendWorker appends a lifecycle event; failures are logged, since the
// lease (not the event) is the authority on liveness.
func (w *Worker) appendWorker(ctx context.Context, what string, ev events.Event) {
	id := events.ID(w.cfg.ID, what, uuid.NewString())
	if _, err := w.events.Append(ctx, streams.WorkerEvents(w.cfg.ID), w.events.Envelope(id, w.cfg.ID, ev), -1); err != nil {
		w.log.Warn("append worker event", "event", ev.EventType(), "err", err)
	}
}

// withDefaultTimeout bounds ctx by streams.DefaultTimeout when it has no
// deadline.
func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, streams.DefaultTimeout)
}

// waitGroup waits for wg until ctx is done; it reports whether wg finished.
func waitGroup(ctx context.Context, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// listen subscribes to the worker's dispatches and commands, on the control
// connection, and waits until the server has both subscriptions.
func (w *Worker) listen(ctx context.Context) ([]*nats.Subscription, error) {
	cmds, err := w.subscribeCommands()
	if err != nil {
		return nil, err
	}
	subs := []*nats.Subscription{cmds}
	sub, err := w.ctl.Subscribe(streams.DispatchSubject(w.cfg.ID), w.onDispatch)
	if err != nil {
		unsubscribe(subs)
		return nil, fmt.Errorf("worker: subscribe to dispatches: %w", err)
	}
	subs = append(subs, sub)
	fctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	if err := w.ctl.FlushWithContext(fctx); err != nil {
		unsubscribe(subs)
		return nil, fmt.Errorf("worker: subscribe to dispatches: %w", err)
	}
	return subs, nil
}

// unsubscribe ends subs; a closed connection ended them already.
func unsubscribe(subs []*nats.Subscription) {
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
}
