package frontend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"

	"github.com/baton-dev/baton/services/fleet"
	"github.com/baton-dev/baton/services/frontend/apikeys"
	"github.com/baton-dev/baton/services/frontend/httpguard"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/services/quota"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
)

// Frontend serves the HTTP API: it is the HTTP edge over a request runtime
// (package runner) and the fleet view the runtime routes with (package
// fleet), which it runs and reads and never reaches into. Create it with New
// and run it with Run.
type Frontend struct {
	*requests            // its id, Config, logger, runtime, metrics and drain
	responses *responses // the Responses API's handlers

	nc       *nats.Conn
	js       jetstream.JetStream
	parts    streams.Partitions // the request log's layout, set by Run once the runtime started
	fleet    *fleet.Fleet
	gatherer prometheus.Gatherer
	keys     *apikeys.Keyring // nil: the API is open
	limits   *tenantLimits
	budgets  quota.Budgets  // the budgets file's and the defaults; replaced by ReloadBudgets under mu
	quota    *quota.Limiter // nil without budgets: no call to the budgets bucket; set by Run before it serves
	ledger   *logLedger     // tenants' bytes in the log (log=F); nil without a budgets file; set by Run before it serves
	console  *consoleView
	tenants  *tenantMetrics // per-tenant series, served at /metrics/tenants (the admin's)
	// admission is the fair queue (nil: off, a busy pool answers 503 at once).
	admission *admission
	listener  net.Listener

	mu sync.Mutex // guards budgets and quota against a reload
}

// New builds a frontend on connection nc. reg receives its metrics; if it is
// also a prometheus.Gatherer, /metrics serves it.
func New(nc *nats.Conn, log *slog.Logger, reg prometheus.Registerer, cfg Config) (*Frontend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("frontend: config: %w", err)
	}
	cfg = cfg.withDefaults()
	if cfg.Runtime.ID == "" {
		cfg.Runtime.ID = "fe-" + randomHex(4)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("frontend_id", cfg.Runtime.ID)
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("frontend: metrics: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("frontend: jetstream: %w", err)
	}
	fl, err := fleet.New(nc, cfg.Runtime.ID, log, reg, cfg.Fleet)
	if err != nil {
		return nil, fmt.Errorf("frontend: %w", err)
	}
	rt, err := runner.New(nc, fl, log, reg, cfg.Runtime)
	if err != nil {
		return nil, fmt.Errorf("frontend: %w", err)
	}
	cfg.Runtime = rt.Config() // with the runtime's defaults, which the edge reads too
	fe := &Frontend{
		requests: &requests{id: cfg.Runtime.ID, cfg: cfg, log: log, runtime: rt, metrics: m, drain: newDrain()},
		nc:       nc, js: js, fleet: fl,
		limits: newTenantLimits(cfg.TenantMaxConcurrent, cfg.TenantRPS),
	}
	if cfg.APIKeysFile != "" {
		if fe.keys, err = apikeys.Load(cfg.APIKeysFile); err != nil {
			return nil, fmt.Errorf("frontend: %w", err)
		}
		log.Info("API keys loaded: every endpoint but /live, /health, /metrics and the console page needs one", "keys", fe.keys.Size())
	} else {
		log.Warn("no API keys file (--api-keys-file): the API is open to anyone who can reach it")
	}
	if fe.budgets, err = cfg.loadBudgets(); err != nil {
		return nil, fmt.Errorf("frontend: %w", err)
	}
	fe.limits.setPerTenant(concurrentOf(fe.budgets))
	if fe.tenants, err = newTenantMetrics(); err != nil {
		return nil, fmt.Errorf("frontend: tenant metrics: %w", err)
	}
	if cfg.AdmissionQueue > 0 {
		fe.admission = newAdmission(fe, cfg.AdmissionQueue, cfg.AdmissionWait)
	}
	fe.responses = &responses{requests: fe.requests, fleet: fl, limits: fe.limits, tenants: fe}
	if err := fe.initConsole(reg); err != nil {
		return nil, fmt.Errorf("frontend: console: %w", err)
	}
	if g, ok := reg.(prometheus.Gatherer); ok {
		fe.gatherer = g
	} else {
		fe.gatherer = prometheus.DefaultGatherer
	}
	return fe, nil
}

// ID is this replica's name.
func (fe *Frontend) ID() string { return fe.id }

// Listen binds the HTTP address now (so callers learn the port before Run);
// Run calls it if it was not called.
func (fe *Frontend) Listen() (net.Addr, error) {
	if fe.listener != nil {
		return fe.listener.Addr(), nil
	}
	l, err := net.Listen("tcp", fe.cfg.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("frontend: listen %s: %w", fe.cfg.HTTPAddr, err)
	}
	fe.listener = httpguard.NewListener(l, int64(fe.cfg.MaxConnections), fe.cfg.MaxConnectionsPerAddress, fe.cfg.TLSCertFile == "")
	return l.Addr(), nil
}

// Run serves until ctx is done, then shuts down within the configured budget
// and returns nil. A non-nil error means the frontend cannot do its job.
func (fe *Frontend) Run(ctx context.Context) error {
	if _, err := fe.Listen(); err != nil {
		return err
	}
	// The fleet view and the runtime that routes with it: the runtime
	// provisions the log and waits for the view, which waits for the
	// buckets; the handlers and the console read both. A view that cannot
	// load ends the start with its error. The fleet stops last (stopFleet).
	startCtx, cancelStart := context.WithCancelCause(ctx)
	defer cancelStart(nil)
	fleetCtx, cancelFleet := context.WithCancel(context.WithoutCancel(ctx))
	fleetDone := make(chan struct{})
	go func() {
		defer close(fleetDone)
		if err := fe.fleet.Run(fleetCtx); err != nil {
			cancelStart(fmt.Errorf("fleet: %w", err))
		}
	}()
	stopFleet := func() {
		cancelFleet()
		<-fleetDone
	}
	if err := fe.runtime.Start(startCtx, fe.listener.Addr().String()); err != nil {
		if cause := context.Cause(startCtx); ctx.Err() == nil && cause != nil {
			err = cause
		}
		stopFleet()
		fe.listener.Close()
		return fmt.Errorf("frontend: start: %w", err)
	}
	defer stopFleet()
	fe.parts = fe.runtime.Partitions()
	runBudgets, err := fe.startBudgets(startCtx)
	if err != nil {
		fe.runtime.Stop()
		fe.listener.Close()
		return fmt.Errorf("frontend: start: %w", err)
	}
	runShares, err := fe.startLogShares(startCtx)
	if err != nil {
		fe.runtime.Stop()
		fe.listener.Close()
		return fmt.Errorf("frontend: start: %w", err)
	}
	runAdmission, err := fe.startAdmission(startCtx)
	if err != nil {
		fe.runtime.Stop()
		fe.listener.Close()
		return fmt.Errorf("frontend: start: admission: %w", err)
	}
	// The console lives until cancelRun, which comes at the end of the
	// shutdown, not with ctx.
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	var g errgroup.Group
	g.Go(func() error { fe.console.run(runCtx); return nil })
	if runBudgets != nil { // until the end of the shutdown, then it returns its leases
		g.Go(func() error {
			if err := runBudgets(runCtx); err != nil {
				fe.log.Error("tenant budgets: the other frontends' budgets are not compared", "err", err)
			}
			return nil
		})
	}
	if runShares != nil { // until the end of the shutdown, then it deletes its key
		g.Go(func() error {
			if err := runShares(runCtx); err != nil {
				fe.log.Error("tenant log shares: the other frontends' counts are not read", "err", err)
			}
			return nil
		})
	}
	if runAdmission != nil { // the fair queue's scheduler and its counters, shared with the other frontends
		g.Go(func() error {
			if err := runAdmission(runCtx); err != nil {
				fe.log.Error("fair admission: the other frontends' counters are not seen: tenants are admitted by weight on this frontend alone", "err", err)
			}
			return nil
		})
	}

	srv := &http.Server{
		Handler: fe.Handler(), ReadHeaderTimeout: fe.cfg.ReadHeaderTimeout, IdleTimeout: fe.cfg.IdleTimeout,
		ConnContext: httpguard.ConnContext,
	}
	serveErr := make(chan error, 1)
	go func() {
		if fe.cfg.TLSCertFile != "" {
			serveErr <- srv.ServeTLS(fe.listener, fe.cfg.TLSCertFile, fe.cfg.TLSKeyFile)
			return
		}
		serveErr <- srv.Serve(fe.listener)
	}()
	fe.log.Info("frontend serving", "addr", fe.listener.Addr().String())

	select {
	case err := <-serveErr:
		fe.stopCounting()
		fe.runtime.Stop()
		cancelRun()
		_ = g.Wait()
		return fmt.Errorf("frontend: serve: %w", err)
	case <-ctx.Done():
	}

	return fe.shutdown(ctx, srv, cancelRun, &g)
}

// shutdown stops the frontend once Run's ctx is done: stop answering, then
// stop the runtime. Its order:
// (1) turn /health to 503 and refuse new requests; (2) let open streams run
// for the graceful budget, still accepting connections so that probes see the
// 503 and new requests get a 503 with Retry-After rather than a refused
// connection; (3) stop accepting, and cut what is left at the end of the
// budget without cancelling it (the requests keep generating in the log and
// stay resumable elsewhere); (4) delete this frontend's presence key, so
// another replica may take its requests over at once; (5) stop the runtime's
// runners and watchers, once the watchers of background responses let
// their references go; (6) stop the console (cancelRun, then wait for g);
// Run stops the fleet view after it.
func (fe *Frontend) shutdown(ctx context.Context, srv *http.Server, cancelRun context.CancelFunc, g *errgroup.Group) error {
	close(fe.draining)
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), fe.cfg.ShutdownTimeout)
	defer scancel()
	fe.waitResponses(sctx)
	err := srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		close(fe.closing)
		err = srv.Close()
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), streams.DefaultTimeout)
	if perr := fe.runtime.Deregister(rctx); perr != nil {
		fe.log.Warn("deregister", "err", perr)
	}
	rcancel()
	fe.stopCounting()
	fe.runtime.Stop()
	cancelRun()
	_ = g.Wait()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("frontend: shutdown: %w", err)
	}
	fe.log.Info("frontend stopped")
	return nil
}

// Handler returns the HTTP API.
func (fe *Frontend) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", fe.counted(fe.concurrent(fe.handleCompletion)))
	mux.HandleFunc("POST /v1/completions", fe.counted(fe.concurrent(fe.handleCompletion)))
	mux.HandleFunc("GET /v1/models", fe.handleModels)
	mux.HandleFunc("GET /v1/workers", fe.handleWorkers)
	mux.HandleFunc("GET /v1/requests/{id}", fe.handleRequest)
	mux.HandleFunc("GET /v1/requests/{id}/stream", fe.counted(fe.handleResume)) // counted in it: countUnlessBackground
	mux.HandleFunc("POST /v1/requests/{id}/cancel", fe.handleCancel)
	fe.responses.register(mux)
	mux.HandleFunc("GET /v1/tenants/{tenant}/usage", fe.handleUsage)
	mux.HandleFunc("GET /health", fe.handleHealth)
	mux.HandleFunc("GET /live", fe.handleLive)
	mux.Handle("GET /metrics", promhttp.HandlerFor(fe.gatherer, promhttp.HandlerOpts{}))
	mux.Handle("GET /metrics/tenants", fe.handleTenantMetrics())
	fe.registerConsole(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if notFoundOrMethod(mux, w, r) {
			return
		}
		writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
	// Outermost first: an overflow connection gets 503 (probes excepted);
	// CORS for the console (a preflight carries no key); then the API key
	// (everything but the probes, /metrics and the console's page); then the
	// tenant's budget headers and rate; then the body, read within its timeout.
	// The budget headers go on every answer of a tenant with a budget.
	return httpguard.Overflow(fe.withCORS(fe.authenticate(fe.budgetHeaders(fe.rateLimit(httpguard.ReadBody(fe.cfg.BodyTimeout, fe.cfg.MaxBodyBytes, mux))))))
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
