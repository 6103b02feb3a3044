package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
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
	leases  jetstream.KeyValue
	loadKV  jetstream.KeyValue

	loadCh chan struct{} // capacity 1: load changed, coalesced

	health   *monitor
	gatherer prometheus.Gatherer // served on /metrics
	readyMu  sync.Mutex          // serialises syncReady

	mu        sync.Mutex
	running   bool
	draining  bool
	jobs      map[jobKey]*job
	early     map[jobKey]time.Time // routed notices that came before their dispatch (hold.go)
	frontends *frontends           // live frontend replicas, for detached requests
	lease     *lease               // current lease; nil while re-registering
	gens      sync.WaitGroup
	listener  net.Listener // status server; nil when off or not yet bound

	logOff *logOffMode // Config.BenchLogOff only; nil otherwise

	upstreamMu sync.Mutex
	caps       *events.Capabilities // the engine's, when it is a Prober and a probe passed
	recheck    chan struct{}        // capacity 1: probe the upstream now, coalesced
	unanswered bool                 // the last probe failed for want of an answer
	busyUntil  time.Time            // the server answered its probe 429/503: busy until then and its next probe; zero: not busy

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
		log:       log.With("worker_id", cfg.ID),
		events:    streams.NewLog(js, "baton/worker/"+cfg.ID),
		loadCh:    make(chan struct{}, 1),
		recheck:   make(chan struct{}, 1),
		jobs:      map[jobKey]*job{},
		early:     map[jobKey]time.Time{},
		frontends: newFrontends(),
		fatalCh:   make(chan struct{}),
	}
	if cfg.BenchLogOff {
		w.logOff = newLogOffMode(nc)
	}
	w.health = newMonitor(cfg.HealthCheck, cfg.CanaryWait, cfg.HealthCheckTimeout,
		canaryProbe(eng, cfg.ID, w.fail), w.healthChanged)
	w.health.onCanary = w.canaryDone
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
	w.gatherer = prometheus.DefaultGatherer
	if g, ok := reg.(prometheus.Gatherer); ok {
		w.gatherer = g
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
	stopStatus, err := w.serveStatus()
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
	w.probeUpstream(ctx)
	subs, err := w.listen(ctx)
	if err != nil {
		return err
	}
	l, err := w.registerFirst(ctx)
	if err != nil {
		unsubscribe(subs)
		if ctx.Err() != nil {
			return nil // stopped while registering: a lease granted meanwhile is revoked (register)
		}
		return err
	}

	bg, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	var background sync.WaitGroup
	background.Go(func() { w.keepRegistered(bg, l) })
	background.Go(func() { w.reportLoad(bg) })
	background.Go(func() { w.health.Run(bg) })
	background.Go(func() { w.watchFrontends(bg) })
	background.Go(func() { w.checkOnReconnect(bg) })
	background.Go(func() { w.reprobeUpstream(bg) })
	background.Go(func() { w.watchEngine(bg) })
	w.notifyLoad()

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
	w.ctl = ctl
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
		if w.leases, err = w.js.KeyValue(ctx, streams.LeasesBucket); err != nil {
			return fmt.Errorf("worker: bind %s: %w", streams.LeasesBucket, err)
		}
		if w.loadKV, err = w.js.KeyValue(ctx, streams.LoadBucket); err != nil {
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
	l := w.currentLease()
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
			j.cancel(errHandOff)
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
	if err := w.loadKV.Delete(sctx, w.cfg.ID); err != nil {
		w.log.Warn("delete load key", "err", err)
	}
	w.appendWorker(sctx, "deregistered", events.WorkerDeregistered{WorkerID: w.cfg.ID, LeaseID: leaseID})

	// 5. Stop listening.
	unsubscribe(subs)
	w.log.Info("stopped", "lease_id", leaseID)
}

// fail records a fatal engine error and starts the shutdown.
func (w *Worker) fail(err error) {
	w.fatalOnce.Do(func() {
		w.fatalErr = err
		close(w.fatalCh)
	})
}

// registerFirst grants the first lease, waiting up to two TTLs for a key
// held by an earlier incarnation with the same id to expire.
func (w *Worker) registerFirst(ctx context.Context) (*lease, error) {
	// A key still held by a previous incarnation expires within a TTL; a
	// cluster electing a leader answers again within seconds.
	deadline := time.Now().Add(max(2*w.cfg.LeaseTTL, streams.AppendBudget))
	for {
		l, err := w.register(ctx, "")
		if err == nil {
			return l, nil
		}
		if !(errors.Is(err, ErrIDInUse) || streams.Transient(err)) || time.Now().After(deadline) {
			return nil, err
		}
		w.log.Info("cannot register yet; retrying", "err", err)
		if !streams.Sleep(ctx, w.cfg.LeaseTTL/10) {
			return nil, fmt.Errorf("worker: register: %w", ctx.Err())
		}
	}
}

// keepRegistered grants a new lease whenever the current one is lost, until
// ctx is done.
func (w *Worker) keepRegistered(ctx context.Context, l *lease) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.Done():
		}
		w.metrics.leaseLive.Set(0)
		w.log.Warn("lease lost; registering again", "lease_id", l.ID(), "err", l.Err())
		w.mu.Lock()
		w.lease = nil
		w.mu.Unlock()
		prev := l.ID()
		l.close()
		for {
			var err error
			if l, err = w.register(ctx, prev); err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			w.log.Warn("register again", "err", err)
			if !streams.Sleep(ctx, w.cfg.LeaseTTL/3) {
				return
			}
		}
		w.notifyLoad()
	}
}

// register grants a new lease with a new lease id and appends worker_registered.
func (w *Worker) register(ctx context.Context, ownedLeaseID string) (*lease, error) {
	healthy, reason := w.health.state()
	v := events.Lease{
		WorkerID: w.cfg.ID, LeaseID: uuid.NewString(), Model: w.cfg.Model,
		PID: os.Getpid(), Host: w.cfg.Host, TTLMS: w.cfg.LeaseTTL.Milliseconds(),
		NotReady: !healthy, Capabilities: w.capabilities(), HoldsUntilRouted: true, Priority: w.cfg.Priority,
	}
	if ft, ok := w.eng.(interface{ FirstTokenTimeout() time.Duration }); ok {
		v.FirstTokenTimeoutMS = ft.FirstTokenTimeout().Milliseconds()
	}
	if !healthy {
		v.NotReadyReason = reason
		if up := w.health.upstreamReason(); up != "" {
			v.NotReadyReason = up
		}
	}
	w.connInfo(&v)
	rctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	l, err := grantLease(rctx, w.js, w.leases, v, w.cfg.LeaseTTL, ownedLeaseID, w.connInfo, w.log)
	if err != nil {
		return nil, fmt.Errorf("worker: register %s: %w", w.cfg.ID, err)
	}
	st := w.eng.Stats()
	reg := events.WorkerRegistered{
		WorkerID: w.cfg.ID, LeaseID: v.LeaseID, Model: w.cfg.Model, PID: v.PID, Host: v.Host,
		LeaseTTLMS: v.TTLMS, KVBlocks: st.KVBlocksTotal, MaxConcurrent: w.cfg.MaxConcurrentRequests,
	}
	if _, err := w.events.Append(rctx, streams.WorkerEvents(w.cfg.ID), w.events.Envelope(events.ID(w.cfg.ID, "registered", v.LeaseID), w.cfg.ID, reg), -1); err != nil {
		dctx, cancel := withDefaultTimeout(context.WithoutCancel(ctx))
		defer cancel()
		_ = l.revoke(dctx)
		return nil, fmt.Errorf("worker: register %s: %w", w.cfg.ID, err)
	}
	w.mu.Lock()
	w.lease = l
	w.mu.Unlock()
	w.metrics.leaseLive.Set(1)
	w.log.Info("registered", "lease_id", v.LeaseID, "model", w.cfg.Model, "lease_ttl", w.cfg.LeaseTTL)
	w.syncReady() // health may have changed since v was built
	return l, nil
}

// healthChanged is the monitor's report of a change of engine health.
func (w *Worker) healthChanged(healthy bool) {
	if healthy {
		w.log.Info("engine healthy again; back in routing")
	} else {
		_, why := w.health.state()
		w.log.Warn("engine not ready; out of routing until a canary passes", "reason", why,
			"timeout", w.cfg.HealthCheckTimeout)
	}
	w.syncReady()
}

// canaryDone records a canary's outcome in the metrics.
func (w *Worker) canaryDone(ok bool, at time.Time) {
	outcome := "success"
	if ok {
		w.metrics.canaryOK.Set(float64(at.UnixNano()) / 1e9)
	} else {
		outcome = "failure"
		w.log.Warn("canary failed")
	}
	w.metrics.canaries.WithLabelValues(w.cfg.Model, outcome).Inc()
}

// syncReady makes the current lease's NotReady flag match the engine's
// health, so that discovery takes a not-ready worker out of routing and puts
// it back once it is healthy again.
func (w *Worker) syncReady() {
	w.readyMu.Lock()
	defer w.readyMu.Unlock()
	healthy, reason := w.health.state()
	l := w.currentLease()
	if l == nil {
		return // re-registering: register reads the health itself
	}
	if healthy {
		reason = ""
	} else if up := w.health.upstreamReason(); up != "" {
		reason = up // the upstream's words say more than "upstream_not_ready"
	}
	if err := l.setReadiness(!healthy, reason, w.capabilities()); err != nil {
		w.log.Warn("mark lease readiness", "lease_id", l.ID(), "not_ready", !healthy, "err", err)
	}
}

// serveStatus starts the status server if it is configured; stop closes it.
func (w *Worker) serveStatus() (stop func(), err error) {
	if _, err := w.Listen(); err != nil {
		return nil, err
	}
	w.mu.Lock()
	l := w.listener
	w.mu.Unlock()
	if l == nil {
		return func() {}, nil
	}
	srv := &http.Server{Handler: w.Handler(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			w.log.Error("status server", "err", err)
		}
	}()
	w.log.Info("status server listening", "addr", l.Addr().String())
	return func() {
		_ = srv.Close() // probes are short; nothing to drain
		<-done
	}, nil
}

// connInfo fills in the connection's current client id and server, which
// change on a reconnect.
func (w *Worker) connInfo(v *events.Lease) {
	if id, err := w.nc.GetClientID(); err == nil {
		v.ClientID = id
	}
	v.Server = w.nc.ConnectedServerId()
}

func (w *Worker) currentLease() *lease {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lease
}

// appendWorker appends a lifecycle event; failures are logged, since the
// lease (not the event) is the authority on liveness.
func (w *Worker) appendWorker(ctx context.Context, what string, ev events.Event) {
	id := events.ID(w.cfg.ID, what, uuid.NewString())
	if _, err := w.events.Append(ctx, streams.WorkerEvents(w.cfg.ID), w.events.Envelope(id, w.cfg.ID, ev), -1); err != nil {
		w.log.Warn("append worker event", "event", ev.EventType(), "err", err)
	}
}

// reportLoad publishes the engine's load when it changes, in a
// streams.Session with the lease's TTL that renews it, so a crashed worker's
// load disappears with its lease. A change in the number of active requests
// (one started or ended) is published at once, so that a finished request
// never shows as running for longer than a publish takes; the other figures
// (KV blocks, queued prefill tokens), which move with every token, at most
// once per LoadInterval. The load is read again every LeaseTTL/3 too, in case
// a change came without a notification. On return the session stops without
// deleting the key (shutdown deletes it).
func (w *Worker) reportLoad(ctx context.Context) {
	refresh := time.NewTicker(w.cfg.LeaseTTL / 3)
	defer refresh.Stop()
	hold := time.NewTimer(time.Hour)
	hold.Stop()
	defer hold.Stop()
	var holdC <-chan time.Time // set while a report waits for LoadInterval
	var s *streams.Session[events.Load]
	defer func() {
		if s != nil {
			s.Close()
		}
	}()
	var lastAt time.Time
	for {
		force := false
		select {
		case <-ctx.Done():
			return
		case <-w.loadCh:
		case <-holdC:
			holdC = nil
		case <-refresh.C:
			force = true
		}
		st := w.eng.Stats()
		l := events.Load{WorkerID: w.cfg.ID, ActiveRequests: st.ActiveRequests, KVBlocksUsed: st.KVBlocksUsed,
			KVBlocksTotal: st.KVBlocksTotal, QueuedPrefillTokens: st.QueuedPrefillTokens}
		l.Busy, _ = w.busy()
		var last events.Load
		if s != nil {
			last = s.Value()
		}
		switch {
		case s == nil || l.ActiveRequests != last.ActiveRequests || l.Busy != last.Busy:
		case l == last:
			continue // the session renews it
		case !force && time.Since(lastAt) < w.cfg.LoadInterval:
			if holdC == nil {
				hold.Reset(w.cfg.LoadInterval - time.Since(lastAt))
				holdC = hold.C
			}
			continue
		}
		var err error
		if s == nil {
			s, err = w.startLoad(ctx, l)
		} else {
			err = s.Update(func(v *events.Load) { *v = l })
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.log.Warn("report load", "err", err)
			if holdC == nil { // try again, even if nothing changes
				hold.Reset(w.cfg.LoadInterval)
				holdC = hold.C
			}
			continue
		}
		lastAt = time.Now()
	}
}

// startLoad puts the first load report and starts renewing it.
func (w *Worker) startLoad(ctx context.Context, l events.Load) (*streams.Session[events.Load], error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	return streams.NewSession(ctx, w.js, w.loadKV, w.cfg.ID, l,
		streams.SessionConfig[events.Load]{TTL: w.cfg.LeaseTTL, Log: w.log})
}

// notifyLoad tells the load reporter that the load may have changed; it
// never blocks, notifications coalesce.
func (w *Worker) notifyLoad() {
	select {
	case w.loadCh <- struct{}{}:
	default:
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
