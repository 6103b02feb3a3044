package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/baton-dev/baton/services/frontend"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/services/frontend/tenants"
	"github.com/baton-dev/baton/services/retention"
	"github.com/baton-dev/baton/streams"
	"github.com/prometheus/client_golang/prometheus"
)

const frontendSummary = `Runs the OpenAI-compatible HTTP frontend: /v1/chat/completions,
/v1/completions, resume (/v1/requests/{id}/stream), cancel, /v1/models,
/v1/workers, /health, /live and /metrics. It routes requests to leased
workers, migrates them when a worker fails, and serves streams from the
event log, so any replica can resume any request. Runs until SIGINT/SIGTERM,
then lets open streams continue for the graceful shutdown timeout.`

// frontendFlags are the frontend's flags, shared by `baton frontend` and
// `baton up`. They bind straight into cfg; only the flags that are not one
// field of it (the listen address, the optional thresholds, the inverted
// compaction switch, the security flags) are kept apart until config.
type frontendFlags struct {
	cfg              frontend.Config
	httpPort         int
	httpHost         string
	decodeThreshold  *optional[float64]
	prefillThreshold *optional[int]
	logCompaction    bool
	sec              securityFlags
}

func addFrontendFlags(f *flagSet) *frontendFlags {
	ff := &frontendFlags{}
	rt, fc := &ff.cfg.Runtime, &ff.cfg
	f.IntVar(&ff.httpPort, "http-port", 8000, "HTTP API `port`: /v1, /health, /live, /metrics")
	f.bindEnv("http-port", "DYN_HTTP_PORT", nil)
	f.StringVar(&ff.httpHost, "http-host", "", "HTTP listen `address`")
	f.showDefault("http-host", "all interfaces")
	f.IntVar(&rt.MigrationLimit, "migration-limit", 0, "max times one request may be re-dispatched to another worker; 0 disables migration")
	f.bindEnv("migration-limit", "DYN_MIGRATION_LIMIT", nil)
	f.IntVar(&rt.MigrationMaxSeqLen, "migration-max-seq-len", 0, "disable migration for a request once prompt + generated `tokens` strictly exceed this; 0 unset")
	f.bindEnv("migration-max-seq-len", "DYN_MIGRATION_MAX_SEQ_LEN", nil)
	f.showDefault("migration-max-seq-len", "unset")
	f.BoolVar(&rt.MigrationExactOnly, "migration-exact-only", false, "continue a migrated request only exactly (token ids, or the mock): never by prefill, which an engine may re-tokenize; with no such worker the request fails")
	f.bindEnv("migration-exact-only", "BATON_MIGRATION_EXACT_ONLY", nil)
	ff.decodeThreshold = optionalFloat(f, "active-decode-blocks-threshold", "a worker is busy when used / total KV blocks exceeds this `fraction` (0-1)")
	f.bindEnv("active-decode-blocks-threshold", "DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD", nil)
	ff.prefillThreshold = optionalInt(f, "active-prefill-tokens-threshold", "a worker is busy when its queued prefill `tokens` exceed this")
	f.bindEnv("active-prefill-tokens-threshold", "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD", nil)
	f.DurationVar(&rt.StallTimeout, "stall-timeout", runner.DefaultStallTimeout, "a request whose worker produces nothing for this `duration` is a worker failure")
	f.bindEnvSeconds("stall-timeout", "DYN_STALL_TIMEOUT_SECS")
	f.DurationVar(&rt.DetachTimeout, "detach-timeout", runner.DefaultDetachTimeout, "how long a request with no attached client keeps generating, waiting for a resume")
	f.bindEnvSeconds("detach-timeout", "DYN_DETACH_TIMEOUT_SECS")
	f.IntVar(&fc.DefaultMaxTokens, "default-max-tokens", frontend.DefaultMaxTokens, "max_tokens of a request that does not set it")
	f.IntVar(&fc.MaxTokensLimit, "max-tokens-limit", frontend.DefaultMaxTokensLimit, "largest max_tokens accepted (400 beyond)")
	f.IntVar(&rt.MaxPromptTokens, "max-prompt-tokens", runner.DefaultMaxPromptTokens, "largest prompt accepted, in whitespace-separated words (413 beyond); checked again in the model server's tokens where an OpenAI engine's server reports them")
	f.Int64Var(&fc.MaxBodyBytes, "max-body-bytes", frontend.DefaultMaxBodyBytes, "largest request body accepted, in `bytes` (413 beyond)")
	f.DurationVar(&rt.DispatchTimeout, "dispatch-timeout", runner.DefaultDispatchTimeout, "how long a worker may take to accept a dispatch before it counts as failed; a `duration`")
	f.DurationVar(&fc.ConsoleWindow, "console-window", frontend.DefaultConsoleWindow, "how far back the console starts reading the log; a `duration`")
	f.IntVar(&fc.ConsoleRequests, "console-requests", frontend.DefaultConsoleRequests, "recent requests the console keeps (and 4x as many feed events)")
	f.DurationVar(&fc.ConsoleLostWorkers, "console-lost-workers", frontend.DefaultConsoleLostWorkers, "how long the console lists a worker that was lost (its lease ended without its deregistering); a `duration`")
	f.Float64Var(&rt.Log.HighWater, "log-high-water", retention.DefaultHighWater, "`fraction` of --stream-max-bytes above which new requests get 503 log_full (the rest is the reserve of requests in flight); eviction of finished requests starts 0.1 below it")
	f.bindEnv("log-high-water", "BATON_LOG_HIGH_WATER", nil)
	f.BoolVar(&ff.logCompaction, "log-compaction", true, "fold a finished request's token deltas into one compact record (false keeps every delta until eviction; baton compact does it by hand)")
	f.bindEnv("log-compaction", "BATON_LOG_COMPACTION", nil)
	f.BoolVar(&fc.ClientModel, "client-model", false, "answers name the model as the client sent it, not as the upstream server that produced them streamed it")
	f.bindEnv("client-model", "BATON_CLIENT_MODEL", nil)
	f.IntVar(&fc.Tenants.AdmissionQueue, "admission-queue", 0, "weighted fair admission when every worker is busy: a new request waits in its tenant's queue of at most this many (past it, 503), and the frontends together admit the queued tenants by weight (weight=W in --tenant-budgets-file) as workers free up; running streams are never preempted; 0 off: a busy pool answers 503 at once")
	f.bindEnv("admission-queue", "BATON_ADMISSION_QUEUE", nil)
	f.showDefault("admission-queue", "0 (off)")
	f.DurationVar(&fc.Tenants.AdmissionWait, "admission-wait", 0, "how long a request may wait in the admission queue before it gets 503 with Retry-After, a `duration`")
	f.bindEnv("admission-wait", "BATON_ADMISSION_WAIT", nil)
	f.showDefault("admission-wait", tenants.DefaultAdmissionWait.String()+" with --admission-queue")
	f.BoolVar(&rt.RouteInAccepted, "route-in-accepted", false, "store a request's first routing decision in its accepted event, while every live frontend reads it there: the first token one acknowledgement sooner; leave off while a frontend or baton replay of 9cbe480 reads the log (it would see attempt 0 unrouted); the next release turns it on")
	f.bindEnv("route-in-accepted", "BATON_ROUTE_IN_ACCEPTED", nil)
	f.BoolVar(&rt.BatchedOutput, "batched-output", false, "not for production yet (issue 33): answer workers' asks for an output stream of their own (BATON_OUT_<worker>, created with --worker-output-max-bytes) and delete those of workers gone for the stream's MaxAge (--detach-timeout + 60s); ask such workers for their output in batches while every live frontend has the switch, follow the batches, and copy them to the request log every second; off, no such stream is created, listed or deleted, and every attempt is written per token")
	f.bindEnv("batched-output", "BATON_BATCHED_OUTPUT", nil)
	f.Int64Var(&rt.WorkerOutputMaxBytes, "worker-output-max-bytes", streams.DefaultWorkerOutputMaxBytes, "with --batched-output: size cap of each worker's output stream in `bytes`; a full one refuses that worker's writes only")
	f.bindEnv("worker-output-max-bytes", "BATON_WORKER_OUTPUT_MAX_BYTES", nil)
	f.StringVar(&rt.ID, "frontend-id", "", "this replica's `id` in events (letters, digits, '-', '_')")
	f.showDefault("frontend-id", "fe-<random>")
	f.StringVar(&ff.cfg.Fleet.SystemURL, "nats-system-url", "", "NATS `URL` with system-account credentials, for disconnect advisories (fast crash detection)")
	f.bindEnv("nats-system-url", "BATON_NATS_SYSTEM_URL", nil)
	f.showDefault("nats-system-url", "off")
	ff.sec.add(f, fc)
	f.documentEnv("DYN_RUNTIME_INHIBITED_DURATION_SECS", "seconds a worker that failed on the request path leaves this frontend's routing set; 0 disables", "5")
	f.documentEnv("DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS", "seconds open streams may continue after SIGTERM/SIGINT before the frontend closes them", "5")
	return ff
}

// config completes the frontend's Config from the parsed flags, the
// streams' Config and the environment-only variables, and validates it.
func (ff *frontendFlags) config(lookup lookupFunc, sc streams.Config) (frontend.Config, error) {
	errs := ff.check()
	cfg := ff.cfg
	cfg.HTTPAddr = net.JoinHostPort(ff.httpHost, strconv.Itoa(ff.httpPort))
	cfg.Fleet.ActiveDecodeBlocksThreshold = ff.decodeThreshold.Get()
	cfg.Fleet.ActivePrefillTokensThreshold = ff.prefillThreshold.Get()
	cfg.Runtime.NoCompaction = !ff.logCompaction
	cfg.Runtime.Streams = sc
	if err := ff.sec.apply(&cfg); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, frontendEnv(lookup, &cfg)...)
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return frontend.Config{}, usageError{err}
	}
	return cfg, nil
}

// check returns what is wrong with the frontend's flags on their own.
func (ff *frontendFlags) check() []error {
	var errs []error
	if ff.httpPort < 0 || ff.httpPort > 65535 {
		errs = append(errs, fmt.Errorf("--http-port %d out of range", ff.httpPort))
	}
	if ff.cfg.Runtime.StallTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--stall-timeout %v: must be positive", ff.cfg.Runtime.StallTimeout))
	}
	for name, v := range map[string]int64{
		"--default-max-tokens": int64(ff.cfg.DefaultMaxTokens), "--max-tokens-limit": int64(ff.cfg.MaxTokensLimit),
		"--max-prompt-tokens": int64(ff.cfg.Runtime.MaxPromptTokens), "--max-body-bytes": ff.cfg.MaxBodyBytes,
		"--console-requests": int64(ff.cfg.ConsoleRequests), "--worker-output-max-bytes": ff.cfg.Runtime.WorkerOutputMaxBytes,
	} {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%s %d: must be positive", name, v))
		}
	}
	if ff.cfg.DefaultMaxTokens > ff.cfg.MaxTokensLimit {
		errs = append(errs, fmt.Errorf("--default-max-tokens %d exceeds --max-tokens-limit %d", ff.cfg.DefaultMaxTokens, ff.cfg.MaxTokensLimit))
	}
	if ff.cfg.Runtime.DispatchTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--dispatch-timeout %v: must be positive", ff.cfg.Runtime.DispatchTimeout))
	}
	if ff.cfg.ConsoleWindow <= 0 {
		errs = append(errs, fmt.Errorf("--console-window %v: must be positive", ff.cfg.ConsoleWindow))
	}
	if ff.cfg.ConsoleLostWorkers <= 0 {
		errs = append(errs, fmt.Errorf("--console-lost-workers %v: must be positive", ff.cfg.ConsoleLostWorkers))
	}
	if ff.cfg.Runtime.Log.HighWater <= 0 || ff.cfg.Runtime.Log.HighWater > 1 {
		errs = append(errs, fmt.Errorf("--log-high-water %v: want a fraction above 0, at most 1", ff.cfg.Runtime.Log.HighWater))
	}
	if ff.cfg.Runtime.DetachTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--detach-timeout %v: must be positive", ff.cfg.Runtime.DetachTimeout))
	}
	if ff.cfg.Fleet.SystemURL != "" {
		if err := validateNATSURLs("--nats-system-url", ff.cfg.Fleet.SystemURL); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// frontendEnv applies the frontend's DYN_* environment variables to cfg and
// returns what is wrong with their values.
func frontendEnv(lookup lookupFunc, cfg *frontend.Config) []error {
	var errs []error
	// DYN_RUNTIME_INHIBITED_DURATION_SECS: integer seconds; 0 disables
	// (negative in Config), unset leaves the default.
	if raw, ok := lookupSet(lookup, "DYN_RUNTIME_INHIBITED_DURATION_SECS"); ok {
		n, err := strconv.Atoi(raw)
		switch {
		case err != nil || n < 0:
			errs = append(errs, fmt.Errorf("DYN_RUNTIME_INHIBITED_DURATION_SECS=%q: want a non-negative integer", raw))
		case n == 0:
			cfg.Fleet.InhibitedDuration = -1
		default:
			cfg.Fleet.InhibitedDuration = time.Duration(n) * time.Second
		}
	}
	d, ok, err := envSeconds(lookup, "DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS")
	switch {
	case err != nil:
		errs = append(errs, err)
	case ok && d == 0:
		// Config has no way to say zero (zero means the default): the
		// smallest budget closes open streams at once.
		cfg.ShutdownTimeout = time.Nanosecond
	case ok:
		cfg.ShutdownTimeout = d
	}
	return errs
}

// streamFlags are the definition of the log's streams: a frontend (or
// baton provision) creates them so if they do not exist, and every
// component refuses to start (exit 2) when an existing one differs
// (streams.DefinitionError).
type streamFlags struct {
	replicas          int
	partitions        int
	maxAge            time.Duration
	maxBytes          int64
	maxMsgsPerSubject int64
	maxMsgSize        int
}

func addStreamFlags(f *flagSet) *streamFlags {
	sf := &streamFlags{}
	f.IntVar(&sf.replicas, "replicas", 1, "replicas (R) of the streams and buckets, as created or as verified (another R than the existing ones' exits 2); 3 in a cluster")
	f.IntVar(&sf.partitions, "request-partitions", 0, "`N` streams the request log is split into (1 to 64; a request's hash slot picks one), fixed when the streams are created; "+
		"another number than the existing streams' exits 2")
	f.bindEnv("request-partitions", "BATON_REQUEST_PARTITIONS", nil)
	f.showDefault("request-partitions", "the existing streams', else 1")
	f.DurationVar(&sf.maxAge, "stream-max-age", streams.DefaultRequestsMaxAge, "how long the request log keeps a request's events, a `duration`")
	f.Int64Var(&sf.maxBytes, "stream-max-bytes", streams.DefaultRequestsMaxBytes, "size cap of each request log stream (partition) in `bytes`; when full, new writes are refused")
	f.Int64Var(&sf.maxMsgsPerSubject, "stream-max-msgs-per-subject", streams.DefaultMaxMsgsPerSubject, "cap on the messages of one subject (one attempt's deltas)")
	f.IntVar(&sf.maxMsgSize, "stream-max-msg-size", streams.DefaultMaxMsgSize, "largest event in `bytes`")
	return sf
}

// config is the streams.Config of the flags.
func (sf *streamFlags) config() streams.Config {
	return streams.Config{
		Replicas: sf.replicas, RequestPartitions: sf.partitions, RequestsMaxAge: sf.maxAge, RequestsMaxBytes: sf.maxBytes,
		MaxMsgsPerSubject: sf.maxMsgsPerSubject, MaxMsgSize: int32(min(sf.maxMsgSize, 1<<31-1)),
	}
}

// args are the flags again, for child processes (baton up's workers).
func (sf *streamFlags) args() []string {
	var parts []string
	if sf.partitions != 0 {
		parts = []string{"--request-partitions", strconv.Itoa(sf.partitions)}
	}
	return append(parts,
		"--replicas", strconv.Itoa(sf.replicas), "--stream-max-age", sf.maxAge.String(),
		"--stream-max-bytes", strconv.FormatInt(sf.maxBytes, 10),
		"--stream-max-msgs-per-subject", strconv.FormatInt(sf.maxMsgsPerSubject, 10),
		"--stream-max-msg-size", strconv.Itoa(sf.maxMsgSize),
	)
}

// frontendOptions are the flags of `baton frontend`.
type frontendOptions struct {
	common  *commonFlags
	nats    *natsFlags
	streams *streamFlags
	fe      *frontendFlags
	pprof   *string
	cfg     frontend.Config
}

func parseFrontend(env *environment, args []string) (*frontendOptions, error) {
	f := newFlagSet("frontend", frontendSummary, env.lookup, env.stdout)
	o := &frontendOptions{
		common:  addCommonFlags(f),
		pprof:   addPprofFlag(f),
		nats:    addNATSFlags(f),
		streams: addStreamFlags(f),
		fe:      addFrontendFlags(f),
	}
	if err := f.parse(args); err != nil {
		return nil, err
	}
	if err := o.nats.validate(); err != nil {
		return nil, err
	}
	var err error
	o.cfg, err = o.fe.config(env.lookup, o.streams.config())
	o.cfg.Fleet.SystemTLS = o.nats.tlsConfig()
	return o, err
}

func runFrontend(ctx context.Context, env *environment, args []string) error {
	o, err := parseFrontend(env, args)
	if err != nil {
		return err
	}
	log := o.common.logger(env.stderr, "frontend")
	if err := servePprof(ctx, *o.pprof, log); err != nil {
		return err
	}
	nc, err := connectNATS(ctx, o.nats.urls, "baton-frontend", natsConnectTimeout, log, o.nats.options()...)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting for the server
		}
		return err
	}
	defer nc.close()
	fe, err := newFrontend(nc, log, o.cfg)
	if err != nil {
		return err
	}
	log.Info("frontend starting", "addr", o.cfg.HTTPAddr, "nats", o.nats.urls)
	reloadKeysOnHangup(ctx, fe, log)
	if err := fe.Run(ctx); err != nil {
		return fmt.Errorf("frontend: %w", err)
	}
	return nil
}

// newFrontend builds a frontend with its own metrics registry, which also
// holds the Go runtime and process collectors.
func newFrontend(nc *conn, log *slog.Logger, cfg frontend.Config) (*frontend.Frontend, error) {
	reg := prometheus.NewRegistry()
	registerRuntime(reg)
	fe, err := frontend.New(nc.Conn, log, reg, cfg)
	if err != nil {
		return nil, fmt.Errorf("frontend: %w", err)
	}
	return fe, nil
}
