package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/migrations"
	"github.com/baton-dev/baton/services/retention"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
)

// Runner is the request runtime of one frontend. Create it with New, start it
// with Start and stop it with Stop; every other method is safe for
// concurrent use once Start returned.
//
// It runs the requests it owns (run.go) and drives its parts, each of
// which holds only what it needs: the requests followed here (registry),
// the decisions it appends (decisions), the dispatches and the commands to
// workers (dispatcher, commands), the workers' checks (checks), its part
// in the log's lifecycle (lifecycle) and adoption (adopter).
type Runner struct {
	id       string
	cfg      Config
	log      *slog.Logger
	nc       *nats.Conn
	js       jetstream.JetStream
	parts    streams.Partitions // the request log's layout, set by Start before anything reads it
	events   *streams.Log
	metrics  *metrics
	fleet    Fleet    // the workers to route to, the frontends that own requests
	presence presence // this frontend's own key
	policy   migrations.Policy
	room     *retention.Monitor // how full the request log is; evicts finished requests
	guard    *retention.Guard   // purges workers' junk from the request log, quarantines who writes it
	live     *live              // the one live subscription of every followed request

	requests   *registry   // registry.go
	decisions  decisions   // decisions.go
	batches    *batcher    // batched.go
	dispatcher *dispatcher // dispatch.go
	commands   commands    // commands.go
	checks     *checks     // checks.go
	lifecycle  *lifecycle  // lifecycle.go, ends.go
	adopter    *adopter    // adopt.go
	outputs    *outputs    // outputs.go; nil without Config.BatchedOutput

	cancelRun context.CancelFunc // ends what Start started
	g         errgroup.Group     // what Start started
}

// New builds the runtime of frontend cfg.ID on connection nc, routing with
// fl; reg receives its metrics. The caller runs fl (Start waits until it is
// ready).
func New(nc *nats.Conn, fl Fleet, log *slog.Logger, reg prometheus.Registerer, cfg Config) (*Runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("runner: config: %w", err)
	}
	if cfg.ID == "" {
		return nil, errors.New("runner: config: no frontend id")
	}
	cfg = cfg.withDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("runner: metrics: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("runner: jetstream: %w", err)
	}
	rn := &Runner{
		id: cfg.ID, cfg: cfg, log: log, nc: nc, js: js,
		events: streams.NewLog(js, "baton/frontend/"+cfg.ID), metrics: m,
		fleet: fl,
		policy: migrations.Policy{
			Limit: cfg.MigrationLimit, MaxSeqLen: cfg.MigrationMaxSeqLen, Frontend: cfg.ID,
			StallTimeout: cfg.StallTimeout, DetachTimeout: cfg.DetachTimeout, ExactOnly: cfg.MigrationExactOnly,
		},
		requests: newRegistry(),
		commands: commands{nc: nc, log: log},
	}
	if rn.room, err = retention.NewMonitor(js, reg, log, cfg.Log); err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	rn.decisions = decisions{events: rn.events, log: log}
	rn.batches = &batcher{on: cfg.BatchedOutput, js: js, events: rn.events, decisions: rn.decisions, fleet: fl, log: log}
	rn.dispatcher = &dispatcher{ctl: nc, timeout: cfg.DispatchTimeout, maxPromptTokens: cfg.MaxPromptTokens, commands: rn.commands, log: log}
	rn.checks = &checks{nc: nc, log: log, fleet: fl, requests: rn}
	rn.lifecycle = &lifecycle{id: cfg.ID, log: log, events: rn.events, room: rn.room, fleet: fl,
		decisions: rn.decisions, noCompaction: cfg.NoCompaction}
	rn.adopter = &adopter{id: cfg.ID, log: log, js: js, fleet: fl, presence: &rn.presence,
		listed: newAdoptable(), adopted: m.adoptions, runtime: rn, all: cfg.BatchedOutput}
	// The guard reads at the monitor's pace, and through it: admission
	// answers from its readings too.
	if rn.guard, err = retention.NewGuard(js, rn.room, reg, log, retention.GuardConfig{Interval: cfg.Log.Interval}); err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	if cfg.BatchedOutput {
		rn.outputs = newOutputs(rn)
	}
	if rn.live, err = newLive(nc, rn.guard.Suspect); err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	if cfg.BatchedOutput {
		if err := rn.live.followOutputs(cfg.ID); err != nil {
			return nil, fmt.Errorf("runner: %w", err)
		}
	}
	received := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "baton_frontend_nats_received_bytes_total",
		Help: "Bytes this frontend received from NATS on its main connection: the live traffic of the requests it follows, history reads, watches.",
	}, func() float64 { return float64(nc.Stats().InBytes) })
	receivedMsgs := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "baton_frontend_nats_received_messages_total",
		Help: "Messages this frontend received from NATS on its main connection (see baton_frontend_nats_received_bytes_total).",
	}, func() float64 { return float64(nc.Stats().InMsgs) })
	for _, c := range []prometheus.Collector{received, receivedMsgs} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("runner: metrics: %w", err)
		}
	}
	return rn, nil
}

// Config is the runtime's configuration with its defaults applied.
func (rn *Runner) Config() Config { return rn.cfg }

// Start provisions the streams and learns the request log's layout, opens
// the control connection, and starts the runners and the watchers
// (discovery, presence under addr, disconnect advisories, checks, reconnect
// catch-up). ctx bounds the start only (and streams.StartBudget each step):
// what Start starts runs until Stop.
func (rn *Runner) Start(ctx context.Context, addr string) error {
	// The layout first: everything started below may read the log.
	if err := rn.provision(ctx); err != nil {
		return err
	}
	ctl, err := rn.openControl()
	if err != nil {
		return err
	}
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	rn.cancelRun = func() {
		cancelRun()
		_ = rn.g.Wait()
		_ = rn.live.close()
		ctl.Close() // last, once no runner dispatches
	}
	rn.g.Go(func() error {
		rn.runRunners(runCtx, &rn.g)
		return nil
	})
	rn.g.Go(func() error { return rn.room.Run(runCtx) })
	rn.g.Go(func() error { return rn.guard.Run(runCtx) })
	rn.g.Go(func() error {
		rn.lifecycle.retryEnds(runCtx)
		return nil
	})
	rn.g.Go(func() error {
		rn.live.watchDrops(runCtx)
		return nil
	})
	if err := rn.startWatchers(ctx, runCtx, &rn.g, addr); err != nil {
		rn.cancelRun()
		return err
	}
	return nil
}

// Deregister deletes this frontend's presence key, so another replica may
// take its requests over at once; a shutdown calls it before Stop. Without
// it, Stop leaves the key to expire.
func (rn *Runner) Deregister(ctx context.Context) error { return rn.presence.revoke(ctx) }

// Stop stops the runners and the watchers, waits for them, then closes the
// control connection. The requests keep generating in the log and stay
// resumable elsewhere. Call it once, after Start succeeded.
func (rn *Runner) Stop() { rn.cancelRun() }

// openControl opens the connection dispatches go over (dispatcher.ctl), with
// nc's options: on nc their replies would queue behind the token deltas of
// every open stream, and a reply late by seconds inhibits a healthy worker.
func (rn *Runner) openControl() (*nats.Conn, error) {
	opts := rn.nc.Opts
	opts.Name += " (control)"
	ctl, err := opts.Connect()
	if err != nil {
		return nil, fmt.Errorf("runner: control connection: %w", err)
	}
	rn.dispatcher.ctl = ctl
	return ctl, nil
}

// provision provisions the streams and learns the request log's layout
// (streams.ProvisionAtStart).
func (rn *Runner) provision(ctx context.Context) error {
	parts, err := streams.ProvisionAtStart(ctx, rn.js, rn.cfg.Streams, rn.log)
	if err != nil {
		return err
	}
	rn.parts, rn.lifecycle.parts, rn.adopter.parts = parts, parts, parts
	rn.events.SetPartitions(parts)
	rn.room.SetPartitions(parts)
	rn.guard.SetPartitions(parts)
	rn.guard.SetFleet(rn.fleet.GuardView())
	rn.room.SetEnds(rn.lifecycle)
	rn.log.Info("request log", "partitions", parts.Count(), "streams", strings.Join(parts.Streams(), ","))
	return nil
}

// startWatchers starts the watchers on g, to run until runCtx is done; it
// gives up when ctx is done or after streams.StartBudget.
func (rn *Runner) startWatchers(ctx, runCtx context.Context, g *errgroup.Group, addr string) error {
	pctx, cancel := context.WithTimeout(ctx, streams.StartBudget)
	defer cancel()
	if err := streams.Retry(pctx, rn.checkChildRoom); err != nil {
		return err
	}
	select { // the fleet's Run loads the view
	case <-rn.fleet.Ready():
	case <-pctx.Done():
		return fmt.Errorf("load the fleet view: %w", pctx.Err())
	}
	// The asks are answered before the presence says so (ManagesOutputs):
	// a worker that reads it may ask at once, and a subscription not yet
	// the server's interest gets "no responders".
	if err := rn.checks.answer(runCtx, g); err != nil {
		return err
	}
	if rn.outputs != nil {
		if err := rn.outputs.start(runCtx, g); err != nil {
			return err
		}
	}
	if err := rn.nc.FlushWithContext(pctx); err != nil {
		return fmt.Errorf("subscribe to checks and asks: %w", err)
	}
	earlier := rn.adopter.earlierRun() // before this run's key replaces it
	err := streams.Retry(pctx, func(tctx context.Context) error {
		return rn.presence.start(runCtx, tctx, rn.js, events.FrontendPresence{
			FrontendID: rn.id, Addr: addr,
			ClientID: clientID(rn.nc), Server: rn.nc.ConnectedServerId(), ReadsCompacted: true,
			ReadsAcceptedRoute: true, ManagesOutputs: rn.outputs != nil, ReadsBatched: rn.outputs != nil,
		}, g)
	})
	if err != nil {
		return err
	}
	g.Go(func() error {
		rn.adopter.publish(runCtx)
		return nil
	})
	g.Go(func() error {
		rn.adopter.watch(runCtx, g)
		return nil
	})
	g.Go(func() error {
		rn.adopter.adoptEarlierRun(runCtx, earlier)
		return nil
	})
	rn.catchUpOnReconnect(runCtx, g)
	return nil
}

// lifecycleReserve is how many messages of a request's events subject are
// kept for what is not a child: accepted, routed and migrated per attempt,
// attached, cancelled (once per mode), failed, and the children that
// concurrent requests may link past the MaxChildren check.
const lifecycleReserve = 1024

// errNoRoom means the log's per-subject limit leaves no room for a cancel
// after MaxChildren children.
var errNoRoom = errors.New("runner: no room for a cancel")

// checkChildRoom makes sure that a request's events subject can always take
// its cancel: MaxChildren children plus lifecycleReserve must fit in the
// stream's max messages per subject (whose discard policy is DiscardNew per
// subject, so a full subject refuses new events).
func (rn *Runner) checkChildRoom(ctx context.Context) error {
	name := rn.parts.Stream(0) // every partition has the same limits
	s, err := rn.js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("look up %s: %w", name, err)
	}
	limit := s.CachedInfo().Config.MaxMsgsPerSubject
	if need := int64(rn.cfg.MaxChildren) + lifecycleReserve; limit > 0 && need > limit {
		return fmt.Errorf("%w: --max-children %d plus %d lifecycle events exceed the %d messages per subject of %s",
			errNoRoom, rn.cfg.MaxChildren, lifecycleReserve, limit, name)
	}
	return nil
}

// Partitions is the request log's layout, known once Start returned.
func (rn *Runner) Partitions() streams.Partitions { return rn.parts }

func clientID(nc *nats.Conn) uint64 {
	id, _ := nc.GetClientID()
	return id
}
