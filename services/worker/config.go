package worker

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/baton-dev/baton/streams"
)

// Defaults of Config.
const (
	DefaultModel           = "mock"
	DefaultLeaseTTL        = 10 * time.Second
	DefaultShutdownTimeout = 30 * time.Second
	DefaultDeltaMaxTokens  = 16
	DefaultDeltaMaxDelay   = 5 * time.Millisecond
	DefaultLoadInterval    = 100 * time.Millisecond
	// DefaultCanaryWait is DYN_CANARY_WAIT_TIME's default: idleness before a canary.
	DefaultCanaryWait = 10 * time.Second
	// DefaultHealthCheckTimeout is DYN_HEALTH_CHECK_REQUEST_TIMEOUT's default.
	DefaultHealthCheckTimeout = 3 * time.Second

	minLeaseTTL = time.Second
)

// Config describes a worker. Zero values mean the documented defaults.
type Config struct {
	ID                    string         // worker id; default "w-" + 8 random hex digits; must satisfy streams.ValidID
	Model                 string         // model served; default "mock"
	LeaseTTL              time.Duration  // lease TTL, renewed at a third of it; default 10s
	MaxConcurrentRequests int            // refuse more in-flight requests than this; 0 unlimited
	ShutdownTimeout       time.Duration  // total shutdown budget, drain included; default 30s
	DeltaMaxTokens        int            // flush a delta at this many tokens; default 16
	DeltaMaxDelay         time.Duration  // flush a delta this long after its first token; default 5ms
	LoadInterval          time.Duration  // minimum spacing of load reports whose number of active requests is unchanged; default 100ms
	Streams               streams.Config // provisioning of streams and buckets
	Host                  string         // reported host name; default os.Hostname()
	Priority              int            // routing tier announced in the lease (--priority): higher first; default 0
	// BenchLogOff sends token deltas and outcomes over core NATS instead of
	// appending them to the log, for the benchmark's log-off baseline:
	// nothing the worker generates is durable (no resume, replay or
	// migration). A window of unconfirmed publishes (confirmed by a flush)
	// paces it, as acknowledgements pace appends. Never a product setting.
	BenchLogOff bool
	// BatchedOutput (--batched-output, off by default) makes the worker
	// ask a frontend for an output stream of its own before it listens for
	// dispatches and at each re-registration, and say WritesBatched in its
	// lease when it has one (output.go). Off, it asks nothing.
	BatchedOutput bool

	// SystemAddr is the listen address of the status server (/live, /health,
	// /metrics), such as ":9090"; empty means no status server
	// (DYN_SYSTEM_PORT unset or 0).
	SystemAddr string
	// HealthCheck switches on canary health checks and the engine progress
	// check (DYN_HEALTH_CHECK_ENABLED): after CanaryWait without request
	// activity the worker sends its engine a one-token request, and a
	// canary that fails or takes longer than HealthCheckTimeout makes the
	// worker not ready (out of routing) until a canary passes. In-flight
	// requests that produce no token for HealthCheckTimeout make it not
	// ready too, even if canaries would pass.
	HealthCheck        bool
	CanaryWait         time.Duration // DYN_CANARY_WAIT_TIME; default 10s
	HealthCheckTimeout time.Duration // DYN_HEALTH_CHECK_REQUEST_TIMEOUT; default 3s
	// UpstreamProbeInterval is how often an engine whose server refused it
	// (or could not be reached) is probed again; default
	// DefaultUpstreamProbeInterval.
	UpstreamProbeInterval time.Duration
	// LivenessInterval is how often the worker asks an engine that can be
	// pinged (engine.Pinger: the OpenAI engine) whether its server is
	// alive, traffic or not; default DefaultLivenessInterval; negative: never.
	// LivenessTimeout bounds each such request; default
	// DefaultLivenessTimeout.
	LivenessInterval time.Duration
	LivenessTimeout  time.Duration
}

// NewID returns a new random worker id, "w-" and 8 hex digits: the default
// of Config.ID.
func NewID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "w-" + hex.EncodeToString(b[:])
}

func (c Config) withDefaults() Config {
	if c.ID == "" {
		c.ID = NewID()
	}
	c.Model = cmp.Or(c.Model, DefaultModel)
	c.LeaseTTL = cmp.Or(c.LeaseTTL, DefaultLeaseTTL)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.DeltaMaxTokens = cmp.Or(c.DeltaMaxTokens, DefaultDeltaMaxTokens)
	c.DeltaMaxDelay = cmp.Or(c.DeltaMaxDelay, DefaultDeltaMaxDelay)
	c.LoadInterval = cmp.Or(c.LoadInterval, DefaultLoadInterval)
	c.CanaryWait = cmp.Or(c.CanaryWait, DefaultCanaryWait)
	if c.UpstreamProbeInterval <= 0 {
		c.UpstreamProbeInterval = DefaultUpstreamProbeInterval
	}
	c.HealthCheckTimeout = cmp.Or(c.HealthCheckTimeout, DefaultHealthCheckTimeout)
	c.LivenessInterval = cmp.Or(c.LivenessInterval, DefaultLivenessInterval)
	if c.LivenessTimeout <= 0 {
		c.LivenessTimeout = DefaultLivenessTimeout
	}
	if c.Host == "" {
		c.Host, _ = os.Hostname()
	}
	return c
}

// Validate reports every problem with c. Zero values are valid (defaults).
func (c Config) Validate() error {
	var errs []error
	if c.ID != "" && !streams.ValidID(c.ID) {
		errs = append(errs, fmt.Errorf("worker id %q: want 1 to 128 letters, digits, '-' or '_'", c.ID))
	}
	if c.LeaseTTL < 0 || (c.LeaseTTL > 0 && c.LeaseTTL < minLeaseTTL) {
		// The server keeps per-message TTLs in whole seconds, at least one.
		errs = append(errs, fmt.Errorf("lease ttl %v: want at least %v", c.LeaseTTL, minLeaseTTL))
	}
	errs = append(errs,
		negative("max concurrent requests", c.MaxConcurrentRequests),
		negative("shutdown timeout", c.ShutdownTimeout),
		negative("delta max tokens", c.DeltaMaxTokens),
		negative("delta max delay", c.DeltaMaxDelay),
		negative("load interval", c.LoadInterval),
		negative("canary wait", c.CanaryWait),
		negative("health check timeout", c.HealthCheckTimeout),
		c.Streams.Validate(),
	)
	return errors.Join(errs...) // drops the nils
}

// negative is the problem of setting name when v, which must not be
// negative, is; nil when it is not.
func negative[T int | time.Duration](name string, v T) error {
	if v < 0 {
		return fmt.Errorf("%s %v: must not be negative", name, v)
	}
	return nil
}
