package frontend

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/services/retention"
	"github.com/baton-dev/baton/streams"
)

// Config configures a frontend. Zero values mean the documented defaults
// (CONTRACT.md); flags and DYN_* environment variables map onto it in cmd/baton.
type Config struct {
	// ID names this replica in events (owner, source); default "fe-" + random.
	ID string
	// HTTPAddr is the listen address of the API; default ":8000".
	HTTPAddr string

	// ClientModel makes answers name the model as the client sent it
	// (the alias of --model) rather than as the upstream server that
	// produced them streamed it, the default (--client-model).
	ClientModel bool

	// MigrationLimit is how many times one request may be re-dispatched; 0
	// disables migration (DYN_MIGRATION_LIMIT).
	MigrationLimit int
	// MigrationMaxSeqLen disables migration for a request once prompt +
	// generated tokens strictly exceed it; 0 means unset
	// (DYN_MIGRATION_MAX_SEQ_LEN).
	MigrationMaxSeqLen int
	// InhibitedDuration is how long a worker that failed on the request path
	// leaves this frontend's routing set (DYN_RUNTIME_INHIBITED_DURATION_SECS,
	// default 5s; negative disables).
	InhibitedDuration time.Duration
	// ActiveDecodeBlocksThreshold marks a worker busy when used / total KV
	// blocks exceeds it (0..1); nil means unset.
	ActiveDecodeBlocksThreshold *float64
	// ActivePrefillTokensThreshold marks a worker busy when its queued prefill
	// tokens exceed it; nil means unset.
	ActivePrefillTokensThreshold *int

	// StallTimeout treats an in-flight request whose worker produces nothing
	// for this long as a worker failure; default 30s.
	StallTimeout time.Duration
	// DetachTimeout is how long a request with no attached client keeps
	// generating before it is cancelled; default 120s.
	DetachTimeout time.Duration
	// ShutdownTimeout is how long open streams may continue after SIGTERM;
	// default 5s (DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS).
	ShutdownTimeout time.Duration
	// DispatchTimeout bounds a worker's answer to a dispatch; default 2s.
	DispatchTimeout time.Duration

	// DefaultMaxTokens is max_tokens when a request does not set it; default 64.
	DefaultMaxTokens int
	// MaxTokensLimit is the largest max_tokens accepted; default 32768.
	MaxTokensLimit int
	// MaxPromptTokens is the largest prompt, in whitespace-separated words,
	// accepted (413 beyond); default 32768.
	MaxPromptTokens int
	// MaxBodyBytes is the largest request body accepted (413 beyond); default 1 MiB.
	MaxBodyBytes int64

	// SystemURL, if set, is a NATS URL with system-account credentials used to
	// receive disconnect advisories (the fast path for worker crashes).
	SystemURL string
	// SystemTLS, if set, secures the system-account connection (as the
	// component's own connection is); its credentials are in SystemURL.
	SystemTLS *tls.Config

	// ConsoleWindow is how far back a frontend starts reading the log for
	// the console (the first time someone opens it there); default 15m.
	ConsoleWindow time.Duration
	// ConsoleRequests is how many recent requests the console keeps; it
	// keeps four times as many feed events. Default 500.
	ConsoleRequests int
	// ConsoleLostWorkers is how long the console lists a worker after its
	// lease ended without its deregistering, marked lost; default 5m.
	ConsoleLostWorkers time.Duration

	// Streams sets provisioning and retention of the log.
	Streams streams.Config
	// Log sets the request log's lifecycle: the high-water mark above which
	// new requests get 503 log_full, and eviction (retention.Config).
	Log retention.Config
	// NoCompaction keeps a finished request's deltas instead of folding
	// them into its compact record (debugging; `baton compact` does it by
	// hand).
	NoCompaction bool

	// APIKeysFile, if set, holds the API keys ("TENANT SECRET" lines):
	// every endpoint but /live, /health and /metrics then needs
	// "Authorization: Bearer SECRET", and requests belong to tenants. Unset,
	// the API is open (and the frontend says so once at start).
	APIKeysFile string
	// MaxChildren caps the children of one request (400 beyond); default 1024.
	MaxChildren int

	// ReadHeaderTimeout bounds the reading of a request's headers; default 10s.
	ReadHeaderTimeout time.Duration
	// BodyTimeout bounds the reading of a request's body (408 beyond); default 30s.
	BodyTimeout time.Duration
	// IdleTimeout closes a keep-alive connection idle this long; default 120s.
	IdleTimeout time.Duration
	// MaxConnections caps open connections: beyond it requests get 503, with
	// ProbeHeadroom more kept for /live and /health; default 4096.
	MaxConnections int
	// MaxConnectionsPerAddress caps the open connections of one remote
	// address (an IPv4 address, an IPv6 /64): a connection past it is
	// answered 503 too_many_connections and closed, as past the headroom of
	// MaxConnections. Default 256; negative means none (behind a proxy,
	// where every connection comes from the proxy's address).
	MaxConnectionsPerAddress int
	// TenantMaxConcurrent caps one tenant's open completions and resumes
	// (429 beyond). 0 means the default: a quarter of MaxConnections when
	// APIKeysFile is set (so that no tenant holds every connection), none
	// without keys (every caller is one tenant, bounded by MaxConnections);
	// negative means unlimited.
	TenantMaxConcurrent int
	// WriteTimeout bounds each write of a streamed response: a client that
	// stops reading is disconnected this long after its last write could
	// not go out, freeing its connection; default 30s.
	WriteTimeout time.Duration
	// TenantRPS caps one tenant's API requests per second (429 beyond, with
	// a burst of max(1, TenantRPS)); 0 means unlimited.
	TenantRPS float64
	// TLSCertFile and TLSKeyFile, if set, serve the API over TLS.
	TLSCertFile, TLSKeyFile string
}

// Defaults of Config; those of the runtime's fields are the runtime's.
const (
	DefaultHTTPAddr          = ":8000"
	DefaultInhibitedDuration = runner.DefaultInhibitedDuration
	DefaultStallTimeout      = runner.DefaultStallTimeout
	DefaultDetachTimeout     = runner.DefaultDetachTimeout
	DefaultShutdownTimeout   = 5 * time.Second
	DefaultDispatchTimeout   = runner.DefaultDispatchTimeout
	DefaultMaxTokens         = 64
	DefaultMaxTokensLimit    = 32768
	DefaultMaxPromptTokens   = runner.DefaultMaxPromptTokens
	DefaultMaxBodyBytes      = 1 << 20
	DefaultMaxChildren       = runner.DefaultMaxChildren
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

func (c Config) withDefaults() Config {
	if c.HTTPAddr == "" {
		c.HTTPAddr = DefaultHTTPAddr
	}
	if c.InhibitedDuration == 0 {
		c.InhibitedDuration = DefaultInhibitedDuration
	}
	if c.StallTimeout == 0 {
		c.StallTimeout = DefaultStallTimeout
	}
	if c.DetachTimeout == 0 {
		c.DetachTimeout = DefaultDetachTimeout
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.DispatchTimeout == 0 {
		c.DispatchTimeout = DefaultDispatchTimeout
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = DefaultMaxTokens
	}
	if c.MaxTokensLimit == 0 {
		c.MaxTokensLimit = DefaultMaxTokensLimit
	}
	if c.MaxPromptTokens == 0 {
		c.MaxPromptTokens = DefaultMaxPromptTokens
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxChildren == 0 {
		c.MaxChildren = DefaultMaxChildren
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if c.BodyTimeout == 0 {
		c.BodyTimeout = DefaultBodyTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.MaxConnectionsPerAddress == 0 {
		c.MaxConnectionsPerAddress = DefaultMaxConnectionsPerAddress
	}
	if c.TenantMaxConcurrent == 0 && c.APIKeysFile != "" {
		c.TenantMaxConcurrent = max(1, c.MaxConnections/4)
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.ConsoleWindow == 0 {
		c.ConsoleWindow = DefaultConsoleWindow
	}
	if c.ConsoleRequests == 0 {
		c.ConsoleRequests = DefaultConsoleRequests
	}
	if c.ConsoleLostWorkers == 0 {
		c.ConsoleLostWorkers = DefaultConsoleLostWorkers
	}
	return c
}

// runtimeConfig is the part of c the request runtime takes.
func (c Config) runtimeConfig() runner.Config {
	return runner.Config{
		ID: c.ID, MigrationLimit: c.MigrationLimit, MigrationMaxSeqLen: c.MigrationMaxSeqLen,
		InhibitedDuration:           c.InhibitedDuration,
		ActiveDecodeBlocksThreshold: c.ActiveDecodeBlocksThreshold, ActivePrefillTokensThreshold: c.ActivePrefillTokensThreshold,
		StallTimeout: c.StallTimeout, DetachTimeout: c.DetachTimeout, DispatchTimeout: c.DispatchTimeout,
		MaxPromptTokens: c.MaxPromptTokens, MaxChildren: c.MaxChildren,
		SystemURL: c.SystemURL, SystemTLS: c.SystemTLS, Streams: c.Streams,
		Log: c.Log, NoCompaction: c.NoCompaction,
	}
}

// Validate reports every problem with c: the runtime's fields
// (runner.Config.Validate) and the HTTP edge's.
func (c Config) Validate() error {
	errs := []error{c.runtimeConfig().Validate()}
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
	if c.MaxConnections < 0 || c.WriteTimeout < 0 || c.TenantRPS < 0 {
		errs = append(errs, errors.New("max connections, the write timeout and tenant limits must not be negative"))
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		errs = append(errs, errors.New("a TLS certificate and key go together"))
	}
	return errors.Join(errs...)
}
