package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/services/worker"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

const workerSummary = `Runs a worker: it holds a lease in the baton_leases bucket, accepts
dispatches from frontends, runs them on its engine, appends token deltas to
the log, and reports its load. On SIGTERM/SIGINT it stops taking requests,
drains for up to DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS, then hands what is
left off to be migrated. Exits 1 if the engine fails.
The mock engine's output is deterministic; its --mock-* flags simulate timing,
a KV cache and scripted faults. --engine openai runs requests on an
OpenAI-compatible server (vLLM, SGLang, llama.cpp, Ollama): it sends each
client's request as sent (chat to /v1/chat/completions, completions to
/v1/completions), probes the server at start (chat, completions, token ids,
prefill), and continues a migrated request from token ids where the server
takes them, else by prefill. A server that answers 401, 403 or 404 makes the
worker not ready (reason in /health) until a probe passes again.
An openai engine's server is watched with GET /v1/models every 2 s, traffic
or not: refused or reset makes the worker not ready within 2 s, no answer
within 1 s (and no token meanwhile) too, and what runs there is handed back
to migrate at once. A probe answered 429 or 503 leaves the worker ready but
busy until Retry-After (5 s without one), then probes again.
With DYN_HEALTH_CHECK_ENABLED (default true), an idle worker sends its engine a
one-token canary every DYN_CANARY_WAIT_TIME seconds; a canary that fails or takes longer
than DYN_HEALTH_CHECK_REQUEST_TIMEOUT, or in-flight requests that produce no
token for that long, make the worker not ready: /health answers 503 and
frontends stop routing to it until a canary passes again. Time the engine
waits for the worker to take a token (the worker's writes to the log behind)
is not counted: that is no stall of the engine's.`

// workerFlags are a worker's flags that `baton up` passes through to the
// workers it starts.
type workerFlags struct {
	model          string
	leaseTTL       time.Duration
	maxConcurrent  int
	mock           engine.MockConfig
	shutdownBudget time.Duration // DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS
	healthCheck    bool          // DYN_HEALTH_CHECK_ENABLED
	canaryWait     time.Duration // DYN_CANARY_WAIT_TIME
	healthTimeout  time.Duration // DYN_HEALTH_CHECK_REQUEST_TIMEOUT
}

// passThrough names the flags of workerFlags, for `baton up`.
var passThrough = []string{
	"model", "lease-ttl", "max-concurrent-requests",
	"mock-tokens-per-sec", "mock-ttft", "mock-kv-blocks", "mock-block-size", "mock-speedup-ratio",
	"mock-crash-after-tokens", "mock-stall-after-tokens", "mock-engine-error-after", "mock-hold-at-token",
	"batched-output",
}

func addWorkerFlags(f *flagSet) *workerFlags {
	w := &workerFlags{healthCheck: true} // DYN_HEALTH_CHECK_ENABLED, as Dynamo's operator sets it
	f.StringVar(&w.model, "model", worker.DefaultModel, "model `name` served")
	f.DurationVar(&w.leaseTTL, "lease-ttl", worker.DefaultLeaseTTL, "lease TTL, renewed at a third of it; at least 1s")
	f.bindEnvSeconds("lease-ttl", "DYN_LEASE_TTL_SECS")
	f.IntVar(&w.maxConcurrent, "max-concurrent-requests", 0, "refuse more in-flight requests than this (the frontend tries another worker); 0 unlimited")
	f.showDefault("max-concurrent-requests", "unlimited")
	m := &w.mock
	f.Float64Var(&m.TokensPerSec, "mock-tokens-per-sec", engine.DefaultMockTokensPerSec, "mock: decode `rate` per request, tokens per second")
	f.DurationVar(&m.TTFT, "mock-ttft", engine.DefaultMockTTFT, "mock: time to first token")
	f.IntVar(&m.KVBlocks, "mock-kv-blocks", engine.DefaultMockKVBlocks, "mock: KV-cache `blocks`")
	f.IntVar(&m.BlockSize, "mock-block-size", engine.DefaultMockBlockSize, "mock: `tokens` per KV block")
	f.Float64Var(&m.SpeedupRatio, "mock-speedup-ratio", 1, "mock: divide every delay by this `ratio`; a huge value runs at full speed")
	f.IntVar(&m.CrashAfterTokens, "mock-crash-after-tokens", 0, "mock: die abruptly (as by SIGKILL) after emitting `N` tokens in total; 0 off")
	f.IntVar(&m.StallAfterTokens, "mock-stall-after-tokens", 0, "mock: stop emitting after `N` tokens in total, staying connected and leased; 0 off")
	f.IntVar(&m.EngineErrorAfter, "mock-engine-error-after", 0, "mock: after `N` requests the engine fails: the worker shuts down gracefully and exits 1; 0 off")
	f.IntVar(&m.HoldAtToken, "mock-hold-at-token", 0, "mock (tests): every request pauses before its token at offset `N` until the worker gets SIGUSR1; 0 off")
	for _, name := range []string{"mock-crash-after-tokens", "mock-stall-after-tokens", "mock-engine-error-after", "mock-hold-at-token"} {
		f.showDefault(name, "off")
	}
	f.documentEnv("DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS", "seconds of drain budget on SIGTERM/SIGINT; what still runs at the end is handed off and migrates", "30")
	f.documentEnv("DYN_HEALTH_CHECK_ENABLED", "false to send no idle canaries to the engine and not watch in-flight requests for progress (a failure makes the worker not ready: out of routing); the engine watch (GET /v1/models every 2 s) runs either way", "true")
	f.documentEnv("DYN_CANARY_WAIT_TIME", "seconds without request activity before a canary request", "10")
	f.documentEnv("DYN_HEALTH_CHECK_REQUEST_TIMEOUT", "seconds a canary may take, and in-flight requests may go without a token, before the worker is not ready", "3")
	return w
}

// check validates the flags and reads the environment-only variables.
func (w *workerFlags) check(lookup lookupFunc) error {
	var errs []error
	if w.mock.TokensPerSec <= 0 {
		errs = append(errs, fmt.Errorf("--mock-tokens-per-sec %v: must be positive", w.mock.TokensPerSec))
	}
	if w.mock.SpeedupRatio <= 0 {
		errs = append(errs, fmt.Errorf("--mock-speedup-ratio %v: must be positive", w.mock.SpeedupRatio))
	}
	for name, n := range map[string]int{
		"--mock-crash-after-tokens": w.mock.CrashAfterTokens,
		"--mock-stall-after-tokens": w.mock.StallAfterTokens,
		"--mock-engine-error-after": w.mock.EngineErrorAfter,
		"--mock-hold-at-token":      w.mock.HoldAtToken,
	} {
		if n < 0 {
			errs = append(errs, fmt.Errorf("%s %d: must not be negative", name, n))
		}
	}
	if err := w.mock.Validate(); err != nil {
		errs = append(errs, err)
	}
	if raw, ok := lookupSet(lookup, "DYN_HEALTH_CHECK_ENABLED"); ok {
		v, err := strconv.ParseBool(raw)
		if err != nil {
			errs = append(errs, usagef("DYN_HEALTH_CHECK_ENABLED=%q: want true or false", raw))
		}
		w.healthCheck = v
	}
	for _, e := range []struct {
		key string
		dst *time.Duration
	}{{"DYN_CANARY_WAIT_TIME", &w.canaryWait}, {"DYN_HEALTH_CHECK_REQUEST_TIMEOUT", &w.healthTimeout}} {
		switch d, ok, err := envSeconds(lookup, e.key); {
		case err != nil:
			errs = append(errs, err)
		case ok && d == 0:
			errs = append(errs, usagef("%s=0: must be positive", e.key))
		case ok:
			*e.dst = d
		}
	}
	d, ok, err := envSeconds(lookup, "DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS")
	switch {
	case err != nil:
		errs = append(errs, err)
	case ok && d == 0:
		// Zero in Config means the default: the smallest budget hands
		// everything off at once.
		w.shutdownBudget = time.Nanosecond
	case ok:
		w.shutdownBudget = d
	default:
		w.shutdownBudget = worker.DefaultShutdownTimeout
	}
	return badConfig(errors.Join(errs...))
}

// workerOptions are the flags of `baton worker`.
type workerOptions struct {
	common     *commonFlags
	nats       *natsFlags
	streams    *streamFlags
	w          *workerFlags
	engine     string
	openai     engine.OpenAIConfig
	id         string
	systemPort int
	systemHost string
	priority   int
	pprof      *string
	benchEmit  bool
	benchOff   bool
	batched    bool
	cfg        worker.Config
}

func parseWorker(env *environment, args []string) (*workerOptions, error) {
	f := newFlagSet("worker", workerSummary, env.lookup, env.stdout)
	o := &workerOptions{
		common:  addCommonFlags(f),
		pprof:   addPprofFlag(f),
		nats:    addNATSFlags(f),
		streams: addStreamFlags(f),
	}
	f.StringVar(&o.engine, "engine", "mock", "engine: `mock` or openai (an OpenAI-compatible server, see --openai-url)")
	f.StringVar(&o.openai.URL, "openai-url", "", "engine openai: base `URL` of the OpenAI-compatible server, such as http://127.0.0.1:8001; required with --engine openai")
	f.StringVar(&o.openai.Model, "openai-model", "", "engine openai: model `name` sent to the server")
	f.showDefault("openai-model", "the value of --model")
	f.documentEnv("OPENAI_API_KEY", "engine openai: bearer token sent to the server", "none")
	f.DurationVar(&o.openai.FirstTokenTimeout, "first-token-timeout", engine.DefaultFirstTokenTimeout, "engine openai: a request whose first token (response headers included) takes longer than this `duration` fails, and migrates")
	f.bindEnvSeconds("first-token-timeout", "DYN_FIRST_TOKEN_TIMEOUT_SECS")
	f.StringVar(&o.id, "worker-id", "", "worker `id` (letters, digits, '-', '_')")
	f.showDefault("worker-id", "w-<random>")
	f.IntVar(&o.systemPort, "system-port", 0, "status server `port` (/health, /live, /metrics); 0 off")
	f.bindEnv("system-port", "DYN_SYSTEM_PORT", nil)
	f.showDefault("system-port", "off")
	f.StringVar(&o.systemHost, "system-host", "127.0.0.1", "status server listen `address`; 0.0.0.0 or :: for every interface (a Prometheus on another host)")
	f.bindEnv("system-host", "DYN_SYSTEM_HOST", nil)
	f.IntVar(&o.priority, "priority", 0, "routing `tier`: frontends pick among the highest tier's routable workers of the model, a lower tier only when none of a higher one can take the request")
	f.bindEnv("priority", "BATON_PRIORITY", nil)
	f.BoolVar(&o.benchEmit, "bench-emit-time", false, "benchmarks only: the mock engine writes each token's emit time as its text, \"@<unix ns> \", so that a client measures emit-to-read latency (the output is no longer the mock's deterministic one)")
	f.BoolVar(&o.benchOff, "bench-log-off", false, "benchmarks only: send token deltas over core NATS instead of the log (nothing is durable: no resume, replay or migration), for the log-off baseline")
	f.BoolVar(&o.batched, "batched-output", false, "not for production yet (issue 33): before listening for dispatches (and at each re-registration) ask a frontend for an output stream of this worker's own, and say writes_batched in the lease once it exists; then write in batches there the attempts whose dispatch asks for it; with no answer, run as without it and ask again every lease TTL")
	f.bindEnv("batched-output", "BATON_BATCHED_OUTPUT", nil)
	o.w = addWorkerFlags(f)
	if err := f.parse(args); err != nil {
		return nil, err
	}
	if err := o.engineConfig(env); err != nil {
		return nil, err
	}
	if err := o.nats.validate(); err != nil {
		return nil, err
	}
	var errs []error
	if o.systemPort < 0 || o.systemPort > 65535 {
		errs = append(errs, fmt.Errorf("--system-port %d out of range", o.systemPort))
	}
	if o.w.leaseTTL <= 0 {
		errs = append(errs, fmt.Errorf("--lease-ttl %v: must be positive", o.w.leaseTTL))
	}
	if err := o.w.check(env.lookup); err != nil {
		errs = append(errs, err)
	}
	o.cfg = worker.Config{
		ID:                    o.id,
		Model:                 o.w.model,
		LeaseTTL:              o.w.leaseTTL,
		MaxConcurrentRequests: o.w.maxConcurrent,
		ShutdownTimeout:       o.w.shutdownBudget,
		HealthCheck:           o.w.healthCheck,
		CanaryWait:            o.w.canaryWait,
		HealthCheckTimeout:    o.w.healthTimeout,
		BenchLogOff:           o.benchOff,
		Priority:              o.priority,
		BatchedOutput:         o.batched,
	}
	if o.systemPort != 0 {
		o.cfg.SystemAddr = net.JoinHostPort(o.systemHost, strconv.Itoa(o.systemPort))
	}
	o.cfg.Streams = o.streams.config()
	if err := o.cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	return o, badConfig(errors.Join(errs...))
}

// engineConfig completes and checks the flags of the engine --engine names.
func (o *workerOptions) engineConfig(env *environment) error {
	switch o.engine {
	case "mock":
		o.w.mock.EmitTime = o.benchEmit
	case "openai":
		if o.benchEmit {
			return usagef("--bench-emit-time: the mock engine's, not --engine openai's")
		}
		if o.openai.Model == "" {
			o.openai.Model = o.w.model
		}
		o.openai.APIKey, _ = lookupSet(env.lookup, "OPENAI_API_KEY")
		if o.openai.FirstTokenTimeout <= 0 {
			return badConfig(fmt.Errorf("--first-token-timeout %v: must be positive", o.openai.FirstTokenTimeout))
		}
		if err := o.openai.Validate(); err != nil {
			return badConfig(fmt.Errorf("--engine openai: %w", err))
		}
	default:
		return usagef("--engine %q: want mock or openai", o.engine)
	}
	return nil
}

func runWorker(ctx context.Context, env *environment, args []string) error {
	o, err := parseWorker(env, args)
	if err != nil {
		return err
	}
	log := o.common.logger(env.stderr, "worker") // the worker adds its worker_id
	if err := servePprof(ctx, *o.pprof, log); err != nil {
		return err
	}
	var eng engine.Engine
	if o.engine == "openai" {
		eng, err = engine.NewOpenAI(o.openai)
	} else {
		var m *engine.Mock
		if m, err = engine.NewMock(o.w.mock); err == nil {
			eng = m
			if o.w.mock.HoldAtToken > 0 {
				defer releaseOnSIGUSR1(m)()
			}
		}
	}
	if err != nil {
		return badConfig(err)
	}
	if o.cfg.ID == "" {
		o.cfg.ID = worker.NewID()
	}
	// The worker's inboxes are its own: its NATS user may subscribe to
	// nothing else (a frontend's inbox receives prompts in direct gets).
	opts := append(o.nats.options(), nats.CustomInboxPrefix(streams.WorkerInboxPrefix(o.cfg.ID)))
	nc, err := connectNATS(ctx, o.nats.urls, "baton-worker", natsConnectTimeout, log, opts...)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting for the server
		}
		return err
	}
	defer nc.close()
	reg := prometheus.NewRegistry()
	registerRuntime(reg)
	w, err := worker.New(nc.Conn, eng, log, reg, o.cfg)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	return runLogged(log, "worker", func() error { return w.Run(ctx) })
}

// releaseOnSIGUSR1 releases the mock's hold (--mock-hold-at-token) when the
// process gets SIGUSR1, until the returned func is called. It outlives the
// signal context on purpose: a test may hold requests until after its
// SIGTERM, to see them drain.
func releaseOnSIGUSR1(m *engine.Mock) (stop func()) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGUSR1)
	done := make(chan struct{})
	go func() {
		select {
		case <-c:
			m.Release()
		case <-done:
		}
	}()
	return func() { signal.Stop(c); close(done) }
}

// runLogged runs a component's Run and describes a failure: an engine
// failure and any other error both end the process with exit code 1.
func runLogged(log *slog.Logger, what string, run func() error) error {
	err := run()
	switch {
	case err == nil:
		log.Info(what + " stopped")
		return nil
	case errors.Is(err, engine.ErrFatal):
		return fmt.Errorf("%s: engine failed: %w", what, err)
	default:
		return fmt.Errorf("%s: %w", what, err)
	}
}
