package worker

import (
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
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.DeltaMaxTokens == 0 {
		c.DeltaMaxTokens = DefaultDeltaMaxTokens
	}
	if c.DeltaMaxDelay == 0 {
		c.DeltaMaxDelay = DefaultDeltaMaxDelay
	}
	if c.LoadInterval == 0 {
		c.LoadInterval = DefaultLoadInterval
	}
	if c.CanaryWait == 0 {
		c.CanaryWait = DefaultCanaryWait
	}
	if c.UpstreamProbeInterval <= 0 {
		c.UpstreamProbeInterval = DefaultUpstreamProbeInterval
	}
	if c.HealthCheckTimeout == 0 {
		c.HealthCheckTimeout = DefaultHealthCheckTimeout
	}
	if c.LivenessInterval == 0 {
		c.LivenessInterval = DefaultLivenessInterval
	}
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
	if c.MaxConcurrentRequests < 0 {
		errs = append(errs, fmt.Errorf("max concurrent requests %d: must not be negative", c.MaxConcurrentRequests))
	}
	if c.ShutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("shutdown timeout %v: must not be negative", c.ShutdownTimeout))
	}
	if c.DeltaMaxTokens < 0 {
		errs = append(errs, fmt.Errorf("delta max tokens %d: must not be negative", c.DeltaMaxTokens))
	}
	if c.DeltaMaxDelay < 0 {
		errs = append(errs, fmt.Errorf("delta max delay %v: must not be negative", c.DeltaMaxDelay))
	}
	if c.LoadInterval < 0 {
		errs = append(errs, fmt.Errorf("load interval %v: must not be negative", c.LoadInterval))
	}
	if c.CanaryWait < 0 {
		errs = append(errs, fmt.Errorf("canary wait %v: must not be negative", c.CanaryWait))
	}
	if c.HealthCheckTimeout < 0 {
		errs = append(errs, fmt.Errorf("health check timeout %v: must not be negative", c.HealthCheckTimeout))
	}
	if err := c.Streams.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
