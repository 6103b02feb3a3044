package fleet

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/migrations"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
)

// Config configures the fleet view and its routing. Zero values mean the
// documented defaults (CONTRACT.md names the flags and variables).
type Config struct {
	// InhibitedDuration is how long a worker that failed a request leaves
	// this frontend's routing (DYN_RUNTIME_INHIBITED_DURATION_SECS); default
	// 5s, negative: inhibition off.
	InhibitedDuration time.Duration
	// ActiveDecodeBlocksThreshold: a worker is busy past this share of used
	// KV blocks (0..1); nil: unset.
	ActiveDecodeBlocksThreshold *float64
	// ActivePrefillTokensThreshold: a worker is busy past this many queued
	// prefill tokens; nil: unset.
	ActivePrefillTokensThreshold *int
	// SystemURL (a NATS URL with system-account credentials) and SystemTLS,
	// if set, receive disconnect advisories: the fast path for crashes.
	SystemURL string
	SystemTLS *tls.Config
}

// DefaultInhibitedDuration is Config.InhibitedDuration's default.
const DefaultInhibitedDuration = 5 * time.Second

func (c Config) withDefaults() Config {
	if c.InhibitedDuration == 0 {
		c.InhibitedDuration = DefaultInhibitedDuration
	}
	return c
}

// Validate reports every problem with c.
func (c Config) Validate() error {
	var errs []error
	if t := c.ActiveDecodeBlocksThreshold; t != nil && (*t < 0 || *t > 1) {
		errs = append(errs, fmt.Errorf("active decode blocks threshold %v: want 0 to 1", *t))
	}
	if t := c.ActivePrefillTokensThreshold; t != nil && *t < 0 {
		errs = append(errs, fmt.Errorf("active prefill tokens threshold %d: must not be negative", *t))
	}
	return errors.Join(errs...)
}

// Admission and routing errors.
var (
	// ErrUnknownModel: no worker serves the model, nor has one since start.
	ErrUnknownModel = errors.New("fleet: unknown model")
	// ErrWorkerNotFound: the pinned worker is not in discovery for the model.
	ErrWorkerNotFound = errors.New("fleet: pinned worker not found")
	// ErrNoWorkers: no worker of the model is routable.
	ErrNoWorkers = errors.New("fleet: no worker is ready")
	// ErrAllBusy: every routable worker is over a load threshold.
	ErrAllBusy = errors.New("fleet: all workers are busy")
)

// Fleet is one frontend's view of the workers and the frontends, and its
// routing. Create it with New and run it with Run; its reads are safe for
// concurrent use at any time, and see the fleet once Ready is closed.
type Fleet struct {
	id     string // the frontend's: its own key is not expired on its advisory
	cfg    Config
	log    *slog.Logger
	js     jetstream.JetStream
	events *streams.Log // worker lifecycle events: lost, quarantined
	disc   *discovery
	fronts *frontends
	router *router
	m      *metrics
	ready  chan struct{} // closed once Run loaded the view
}

// New builds the fleet view of frontend frontendID on connection nc, its
// metrics registered on reg (none if nil).
func New(nc *nats.Conn, frontendID string, log *slog.Logger, reg prometheus.Registerer, cfg Config) (*Fleet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("fleet: config: %w", err)
	}
	cfg = cfg.withDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("fleet: metrics: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("fleet: jetstream: %w", err)
	}
	return &Fleet{
		id: frontendID, cfg: cfg, log: log, js: js,
		events: streams.NewLog(js, "baton/frontend/"+frontendID),
		disc:   newDiscovery(log), fronts: newFrontends(), router: newRouter(cfg, time.Now), m: m,
		ready: make(chan struct{}),
	}, nil
}

// Run follows the fleet until ctx is done, then returns nil. It first loads
// the view (the leases, the load reports, the workers' events, the
// frontends' keys) and subscribes to disconnect advisories, retrying within
// streams.StartBudget (and waiting, within it, for the streams and buckets
// to be provisioned), and closes Ready. A non-nil error means the view
// could not be loaded.
func (f *Fleet) Run(ctx context.Context) error {
	wctx, stop := context.WithCancel(ctx)
	var g errgroup.Group
	err := f.start(wctx, &g)
	if err == nil {
		close(f.ready)
		<-ctx.Done()
	}
	stop()
	_ = g.Wait()
	if ctx.Err() != nil {
		return nil // stopped, if need be before the view was loaded
	}
	return err
}

func (f *Fleet) start(ctx context.Context, g *errgroup.Group) error {
	pctx, cancel := context.WithTimeout(ctx, streams.StartBudget)
	defer cancel()
	if err := retry(pctx, func(tctx context.Context) error { return f.disc.start(ctx, tctx, f.js, g) }); err != nil {
		return err
	}
	if err := retry(pctx, func(tctx context.Context) error { return f.fronts.start(ctx, tctx, f.js, g) }); err != nil {
		return err
	}
	return f.watchDisconnects(ctx, g)
}

// provisionPoll is how often Run looks again for streams and buckets that
// are not provisioned yet.
const provisionPoll = 20 * time.Millisecond

// retry runs f with streams.Retry, and again while what it opens does not
// exist yet: the runtime beside the fleet view provisions the streams and
// buckets as it starts, and the view may start first.
func retry(ctx context.Context, f func(context.Context) error) error {
	for {
		err := streams.Retry(ctx, f)
		if !errors.Is(err, jetstream.ErrBucketNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return err
		}
		t := time.NewTimer(provisionPoll)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
	}
}

// Ready is closed once Run has loaded the view: before, it holds no worker
// and no frontend.
func (f *Fleet) Ready() <-chan struct{} { return f.ready }

// Admit checks that model is served and that some worker can take a request
// for it (worker pinned, if set), before anything is written to the log. It
// returns ErrUnknownModel, ErrWorkerNotFound, ErrNoWorkers or ErrAllBusy.
func (f *Fleet) Admit(model, pinned string) error {
	var known, routable bool
	var pinnedWorker projections.Worker
	var pinnedOK bool
	var cands []projections.Worker
	f.disc.read(func(v *projections.Discovery) {
		for _, w := range v.Workers() {
			if w.Model == model {
				known = true
			}
		}
		cands = v.Routable(model)
		routable = len(cands) > 0
		if pinned != "" {
			pinnedWorker, pinnedOK = v.Get(pinned)
		}
	})
	if !known && !f.disc.hasServed(model) {
		return ErrUnknownModel
	}
	if pinned != "" {
		if !pinnedOK || pinnedWorker.Model != model {
			return ErrWorkerNotFound
		}
		return nil
	}
	if !routable {
		return ErrNoWorkers
	}
	if _, err := f.router.pick(cands, nil); errors.Is(err, ErrAllBusy) {
		return ErrAllBusy
	}
	return nil
}

// Free reports whether a routable worker of model could take a new request
// now, as Admit would let one through, and its last load report already
// counts every request this frontend runs on it: a worker this frontend
// just dispatched to, whose report does not show it yet, is not free. The
// fair admission queue admits on it, one request at a time, so that one
// free worker is not given to several queued requests before its report.
func (f *Fleet) Free(model string) bool {
	var cands []projections.Worker
	f.disc.read(func(v *projections.Discovery) { cands = v.Routable(model) })
	return f.router.free(cands)
}

// Pick chooses the worker of dispatch d (worker pinned, if set; never one of
// exclude) and counts a dispatch to it until done is called, so that
// concurrent dispatches see each other's choices; done is nil on error. A
// migration (d.Attempt > 0) whose every candidate is inhibited goes to the
// least recently failed rather than fail. Unpinned, it picks from the
// highest priority tier that has a worker able to take d (see router); a
// pick from a lower tier than the highest routable one is counted in
// baton_frontend_fallback_dispatches_total. A pinned dispatch ignores tiers.
func (f *Fleet) Pick(d events.Dispatch, pinned string, exclude []string) (w projections.Worker, done func(), err error) {
	if pinned != "" {
		w, ok := f.disc.get(pinned)
		if !ok || !w.Routable() || w.Model != d.Model {
			return projections.Worker{}, nil, fmt.Errorf("%w: %s", errNotPinned, pinned)
		}
		return w, f.router.track(w.ID), nil
	}
	var cands []projections.Worker
	f.disc.read(func(v *projections.Discovery) { cands = v.Routable(d.Model) })
	top := topTier(cands)
	cands, err = capable(cands, d.Endpoint, d.StartOffset, d.GeneratedIDs != nil)
	if err == nil && d.ExactOnly {
		cands, err = exactly(cands, d)
	}
	if err != nil {
		return projections.Worker{}, nil, err
	}
	skip := make(map[string]bool, len(exclude))
	for _, id := range exclude {
		skip[id] = true
	}
	w, done, err = f.router.reserve(cands, skip, d.Attempt > 0)
	if err == nil && w.Priority < top {
		f.m.fallbacks.WithLabelValues(d.Model).Inc()
	}
	return w, done, err
}

// topTier is the highest priority of ws; 0 if ws is empty.
func topTier(ws []projections.Worker) int {
	if len(ws) == 0 {
		return 0
	}
	top := ws[0].Priority
	for _, w := range ws[1:] {
		top = max(top, w.Priority)
	}
	return top
}

// IsNotCapable reports whether err (of Pick) says that workers are
// routable but none of their engines can run the dispatch: serve its
// endpoint, continue it, or continue it exactly.
func IsNotCapable(err error) bool { return errors.Is(err, errNotCapable) }

// exactly keeps the workers that continue d exactly by construction
// (migrations.ContinuesExactly: --migration-exact-only), failing with
// errNotCapable when none does.
func exactly(ws []projections.Worker, d events.Dispatch) ([]projections.Worker, error) {
	out := ws[:0:0]
	for _, w := range ws {
		if migrations.ContinuesExactly(w, d) {
			out = append(out, w)
		}
	}
	if len(out) == 0 && len(ws) > 0 {
		return nil, fmt.Errorf("%w: %d routable, none can continue it exactly at token %d (--migration-exact-only: needs token ids; these would continue by prefill)",
			errNotCapable, len(ws), d.StartOffset)
	}
	return out, nil
}

// Inhibit drops worker w from this frontend's routing for d (the inhibition
// window when d is zero) and reports whether it did: not while inhibition
// is off. A worker that registers again (a new lease) is routable again.
func (f *Fleet) Inhibit(w projections.Worker, d time.Duration) bool { return f.router.inhibit(w, d) }

// Worker returns a copy of worker id as the view holds it.
func (f *Fleet) Worker(id string) (projections.Worker, bool) { return f.disc.get(id) }

// Workers returns the view's workers.
func (f *Fleet) Workers() []projections.Worker {
	var ws []projections.Worker
	f.disc.read(func(v *projections.Discovery) { ws = v.Workers() })
	return ws
}

// LostWorkers returns the workers the view saw leave without deregistering
// (projections.Discovery.Lost), since this frontend started.
func (f *Fleet) LostWorkers() []projections.Worker {
	var ws []projections.Worker
	f.disc.read(func(v *projections.Discovery) { ws = v.Lost() })
	return ws
}

// Models returns the models the view's workers serve.
func (f *Fleet) Models() []string {
	var models []string
	f.disc.read(func(v *projections.Discovery) { models = v.Models() })
	return models
}

// WorkersChanged returns a channel closed at the next change of the
// workers, load reports included.
func (f *Fleet) WorkersChanged() <-chan struct{} { return f.disc.changed.C() }

// MembersChanged returns a channel closed at the next change of the workers
// but a load report: one came, left, drained or renewed its lease.
func (f *Fleet) MembersChanged() <-chan struct{} { return f.disc.members.C() }

// FrontendAlive reports whether frontend id holds a live presence key.
func (f *Fleet) FrontendAlive(id string) bool { return f.fronts.isAlive(id) }

// Frontends returns the live frontends, from their presence keys.
func (f *Fleet) Frontends() []projections.Frontend { return f.fronts.members() }

// KnownFrontends returns the live frontends and those that departed.
func (f *Fleet) KnownFrontends() []projections.Frontend { return f.fronts.known() }

// FrontendsChanged returns a channel closed at the next change of the
// frontends' membership: a request's owner may have gone.
func (f *Fleet) FrontendsChanged() <-chan struct{} { return f.fronts.changed.C() }
