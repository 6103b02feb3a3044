package frontend

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/baton-dev/baton/services/fleet"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/services/frontend/tenants"
)

// Config configures a frontend: its HTTP edge, the request runtime it runs
// (Runtime), the fleet view the runtime routes with (Fleet) and its
// tenants (Tenants). Zero values
// mean the documented defaults (CONTRACT.md); flags and DYN_* environment
// variables bind into it in cmd/baton. Each part applies its own defaults:
// the edge's in New, the runtime's in runner.New, the fleet's in fleet.New,
// the tenants' in tenants.New.
type Config struct {
	// Runtime configures the request runtime: the frontend's id, migration,
	// routing, a running request's timers, the log and its lifecycle
	// (runner.Config). Its ID names this replica in events (owner, source);
	// default "fe-" + random.
	Runtime runner.Config
	// Fleet configures the fleet view and routing: local inhibition, the
	// busy thresholds, the disconnect advisories' system account
	// (fleet.Config).
	Fleet fleet.Config

	// HTTPAddr is the listen address of the API; default ":8000".
	HTTPAddr string

	// ClientModel makes answers name the model as the client sent it
	// (the alias of --model) rather than as the upstream server that
	// produced them streamed it, the default (--client-model).
	ClientModel bool

	// ShutdownTimeout is how long open streams may continue after SIGTERM;
	// default 5s (DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS).
	ShutdownTimeout time.Duration

	// DefaultMaxTokens is max_tokens when a request does not set it; default 64.
	DefaultMaxTokens int
	// MaxTokensLimit is the largest max_tokens accepted; default 32768.
	MaxTokensLimit int
	// MaxBodyBytes is the largest request body accepted (413 beyond); default 1 MiB.
	MaxBodyBytes int64

	// ConsoleWindow is how far back a frontend starts reading the log for
	// the console (the first time someone opens it there); default 15m.
	ConsoleWindow time.Duration
	// ConsoleRequests is how many recent requests the console keeps; it
	// keeps four times as many feed events. Default 500.
	ConsoleRequests int
	// ConsoleLostWorkers is how long the console lists a worker after its
	// lease ended without its deregistering, marked lost; default 5m.
	ConsoleLostWorkers time.Duration

	// APIKeysFile, if set, holds the API keys ("TENANT SECRET" lines):
	// every endpoint but /live, /health and /metrics then needs
	// "Authorization: Bearer SECRET", and requests belong to tenants. Unset,
	// the API is open (and the frontend says so once at start).
	APIKeysFile string

	// ReadHeaderTimeout bounds the reading of a request's headers; default 10s.
	ReadHeaderTimeout time.Duration
	// BodyTimeout bounds the reading of a request's body (408 beyond); default 30s.
	BodyTimeout time.Duration
	// IdleTimeout closes a keep-alive connection idle this long; default 120s.
	IdleTimeout time.Duration
	// MaxConnections caps open connections: beyond it requests get 503, with
	// httpguard.ProbeHeadroom more kept for /live and /health; default 4096.
	MaxConnections int
	// MaxConnectionsPerAddress caps the open connections of one remote
	// address (an IPv4 address, an IPv6 /64): a connection past it is
	// answered 503 too_many_connections and closed, as past the headroom of
	// MaxConnections. Default 256; negative means none (behind a proxy,
	// where every connection comes from the proxy's address).
	MaxConnectionsPerAddress int
	// WriteTimeout bounds each write of a streamed response: a client that
	// stops reading is disconnected this long after its last write could
	// not go out, freeing its connection; default 30s.
	WriteTimeout time.Duration
	// Tenants configures the tenants' limits, budgets and fair admission
	// (tenants.Config). Its MaxConcurrent's default, 0, is a quarter of
	// MaxConnections when APIKeysFile is set (so that no tenant holds every
	// connection), none without keys (every caller is one tenant, bounded
	// by MaxConnections); negative means unlimited.
	Tenants tenants.Config
	// TLSCertFile and TLSKeyFile, if set, serve the API over TLS.
	TLSCertFile, TLSKeyFile string
}

// Defaults of the edge's fields of Config; the runtime's are runner's
// (runner.DefaultStallTimeout, ...).
const (
	DefaultHTTPAddr          = ":8000"
	DefaultShutdownTimeout   = 5 * time.Second
	DefaultMaxTokens         = 64
	DefaultMaxTokensLimit    = 32768
	DefaultMaxBodyBytes      = 1 << 20
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultBodyTimeout       = 30 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxConnections    = 4096
	// DefaultMaxConnectionsPerAddress is MaxConnectionsPerAddress's default.
	DefaultMaxConnectionsPerAddress = 256
	DefaultWriteTimeout             = 30 * time.Second
	DefaultConsoleWindow            = 15 * time.Minute
	DefaultConsoleRequests          = 500
	DefaultConsoleLostWorkers       = 5 * time.Minute
)

// withDefaults applies the edge's defaults; runner.New applies the
// runtime's to c.Runtime.
func (c Config) withDefaults() Config {
	c.HTTPAddr = cmp.Or(c.HTTPAddr, DefaultHTTPAddr)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.DefaultMaxTokens = cmp.Or(c.DefaultMaxTokens, DefaultMaxTokens)
	c.MaxTokensLimit = cmp.Or(c.MaxTokensLimit, DefaultMaxTokensLimit)
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, DefaultMaxBodyBytes)
	c.ReadHeaderTimeout = cmp.Or(c.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	c.BodyTimeout = cmp.Or(c.BodyTimeout, DefaultBodyTimeout)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, DefaultIdleTimeout)
	c.MaxConnections = cmp.Or(c.MaxConnections, DefaultMaxConnections)
	c.MaxConnectionsPerAddress = cmp.Or(c.MaxConnectionsPerAddress, DefaultMaxConnectionsPerAddress)
	if c.Tenants.MaxConcurrent == 0 && c.APIKeysFile != "" {
		c.Tenants.MaxConcurrent = max(1, c.MaxConnections/4)
	}
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	c.ConsoleWindow = cmp.Or(c.ConsoleWindow, DefaultConsoleWindow)
	c.ConsoleRequests = cmp.Or(c.ConsoleRequests, DefaultConsoleRequests)
	c.ConsoleLostWorkers = cmp.Or(c.ConsoleLostWorkers, DefaultConsoleLostWorkers)
	return c
}

// Validate reports every problem with c: the runtime's fields
// (runner.Config.Validate) and the HTTP edge's.
func (c Config) Validate() error {
	errs := []error{c.Runtime.Validate(), c.Fleet.Validate(), c.Tenants.Validate()}
	for name, d := range map[string]time.Duration{
		"shutdown timeout":    c.ShutdownTimeout,
		"read header timeout": c.ReadHeaderTimeout, "body timeout": c.BodyTimeout, "idle timeout": c.IdleTimeout,
		"console window": c.ConsoleWindow, "console lost workers": c.ConsoleLostWorkers,
	} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s %v: must not be negative", name, d))
		}
	}
	if c.DefaultMaxTokens < 0 || c.MaxTokensLimit < 0 || c.MaxBodyBytes < 0 || c.ConsoleRequests < 0 {
		errs = append(errs, errors.New("size limits must not be negative"))
	}
	if c.MaxConnections < 0 || c.WriteTimeout < 0 {
		errs = append(errs, errors.New("max connections and the write timeout must not be negative"))
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		errs = append(errs, errors.New("a TLS certificate and key go together"))
	}
	return errors.Join(errs...)
}
