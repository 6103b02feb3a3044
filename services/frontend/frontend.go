package frontend

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/baton-dev/baton/services/fleet"
	"github.com/baton-dev/baton/services/frontend/apikeys"
	"github.com/baton-dev/baton/services/frontend/httpguard"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/services/frontend/tenants"
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
	// tenants holds every tenant to its limits, budgets, log share and
	// fair share; started by Run before it serves.
	tenants  *tenants.Gate
	console  *consoleView
	listener net.Listener
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
	if cfg.Tenants.AdmissionQueue > 0 && cfg.Runtime.BusyWait == 0 {
		// An admitted request that finds the pool full again (another
		// frontend took the worker it was admitted on) waits as in the queue.
		cfg.Runtime.BusyWait = cmp.Or(cfg.Tenants.AdmissionWait, tenants.DefaultAdmissionWait)
	}
	rt, err := runner.New(nc, fl, log, reg, cfg.Runtime)
	if err != nil {
		return nil, fmt.Errorf("frontend: %w", err)
	}
	cfg.Runtime = rt.Config() // with the runtime's defaults, which the edge reads too
	fe := &Frontend{
		requests: &requests{id: cfg.Runtime.ID, cfg: cfg, log: log, runtime: rt, metrics: m, drain: newDrain()},
		nc:       nc, js: js, fleet: fl,
	}
	if cfg.APIKeysFile != "" {
		if fe.keys, err = apikeys.Load(cfg.APIKeysFile); err != nil {
			return nil, fmt.Errorf("frontend: %w", err)
		}
		log.Info("API keys loaded: every endpoint but /live, /health, /metrics and the console page needs one", "keys", fe.keys.Size())
	} else {
		log.Warn("no API keys file (--api-keys-file): the API is open to anyone who can reach it")
	}
	fe.tenants, err = tenants.New(cfg.Tenants, tenants.Deps{ID: cfg.Runtime.ID, Log: log, JS: js, Runtime: rt, Fleet: fl,
		Keys: fe.keys, Draining: fe.draining})
	if err != nil {
		return nil, fmt.Errorf("frontend: %w", err)
	}
	fe.responses = &responses{requests: fe.requests, fleet: fl, gate: fe.tenants, tenants: fe}
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
	stopFleet, err := fe.start(ctx)
	if err != nil {
		fe.listener.Close()
		return fmt.Errorf("frontend: start: %w", err)
	}
	defer stopFleet()
	runTenants, err := fe.tenants.Start(ctx)
	if err != nil {
		fe.runtime.Stop()
		fe.listener.Close()
		return fmt.Errorf("frontend: start: %w", err)
	}
	// The console and the tenants' sharing live until cancelRun, which
	// comes at the end of the shutdown, not with ctx: then the budgets'
	// leases are returned and this frontend's keys deleted.
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	var g errgroup.Group
	g.Go(func() error { fe.console.run(runCtx); return nil })
	g.Go(func() error { runTenants(runCtx); return nil })

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

// start runs the fleet view and starts the runtime that routes with it:
// the runtime provisions the log and waits for the view, which waits for
// the buckets; the handlers and the console read both. A view that cannot
// load ends the start with its error. The fleet stops last: Run calls the
// returned stop as it returns.
func (fe *Frontend) start(ctx context.Context) (stop func(), err error) {
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
	stop = func() {
		cancelFleet()
		<-fleetDone
	}
	if err := fe.runtime.Start(startCtx, fe.listener.Addr().String()); err != nil {
		if cause := context.Cause(startCtx); ctx.Err() == nil && cause != nil {
			err = cause
		}
		stop()
		return nil, err
	}
	fe.parts = fe.runtime.Partitions()
	return stop, nil
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
	mux.HandleFunc("GET /v1/tenants/{tenant}/usage", func(w http.ResponseWriter, r *http.Request) {
		fe.tenants.ServeUsage(w, r, tenantOf(r))
	})
	mux.HandleFunc("GET /health", fe.handleHealth)
	mux.HandleFunc("GET /live", fe.handleLive)
	mux.Handle("GET /metrics", promhttp.HandlerFor(fe.gatherer, promhttp.HandlerOpts{}))
	mux.Handle("GET /metrics/tenants", fe.tenants.MetricsHandler()) // the admin's only: adminPath
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
	return httpguard.Overflow(fe.withCORS(fe.authenticate(fe.tenantGate(httpguard.ReadBody(fe.cfg.BodyTimeout, fe.cfg.MaxBodyBytes, mux)))))
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
