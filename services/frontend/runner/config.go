package runner

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/baton-dev/baton/services/retention"
	"github.com/baton-dev/baton/streams"
)

// Config configures the runtime. Zero values mean the documented defaults
// (CONTRACT.md); the frontend maps its own Config onto it.
type Config struct {
	// ID names this frontend in events (owner, source); required.
	ID string

	// MigrationLimit is how many times one request may be re-dispatched; 0
	// disables migration.
	MigrationLimit int
	// MigrationMaxSeqLen disables migration for a request once prompt +
	// generated tokens strictly exceed it; 0 means unset.
	MigrationMaxSeqLen int
	// InhibitedDuration is how long a worker that failed on the request path
	// leaves this frontend's routing set; default 5s; negative disables.
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
	// DispatchTimeout bounds a worker's answer to a dispatch; default 2s.
	DispatchTimeout time.Duration

	// MaxPromptTokens is the largest prompt a worker accepts in a dispatch;
	// default 32768.
	MaxPromptTokens int
	// MaxChildren is the most children one request may have; Start checks
	// that the log keeps room for a cancel after them. Default 1024.
	MaxChildren int

	// SystemURL, if set, is a NATS URL with system-account credentials used to
	// receive disconnect advisories (the fast path for worker crashes).
	SystemURL string
	// SystemTLS, if set, secures the system-account connection.
	SystemTLS *tls.Config

	// Streams sets provisioning and retention of the log.
	Streams streams.Config
	// Log sets the request log's lifecycle: the high-water mark above which
	// new requests are refused (ErrLogFull), and eviction.
	Log retention.Config
	// NoCompaction keeps a finished request's deltas instead of folding
	// them into its compact record (debugging; `baton compact` does it by
	// hand).
	NoCompaction bool
}

// Defaults of Config.
const (
	DefaultInhibitedDuration = 5 * time.Second
	DefaultStallTimeout      = 30 * time.Second
	DefaultDetachTimeout     = 120 * time.Second
	DefaultDispatchTimeout   = 2 * time.Second
	DefaultMaxPromptTokens   = 32768
	DefaultMaxChildren       = 1024
)

func (c Config) withDefaults() Config {
	if c.InhibitedDuration == 0 {
		c.InhibitedDuration = DefaultInhibitedDuration
	}
	if c.StallTimeout == 0 {
		c.StallTimeout = DefaultStallTimeout
	}
	if c.DetachTimeout == 0 {
		c.DetachTimeout = DefaultDetachTimeout
	}
	if c.DispatchTimeout == 0 {
		c.DispatchTimeout = DefaultDispatchTimeout
	}
	if c.MaxPromptTokens == 0 {
		c.MaxPromptTokens = DefaultMaxPromptTokens
	}
	if c.MaxChildren == 0 {
		c.MaxChildren = DefaultMaxChildren
	}
	return c
}

// Validate reports every problem with c. An empty ID is left to New.
func (c Config) Validate() error {
	var errs []error
	if c.ID != "" && !streams.ValidID(c.ID) {
		errs = append(errs, fmt.Errorf("frontend id %q: want letters, digits, '-' or '_'", c.ID))
	}
	if c.MigrationLimit < 0 {
		errs = append(errs, fmt.Errorf("migration limit %d: must not be negative", c.MigrationLimit))
	}
	if c.MigrationMaxSeqLen < 0 {
		errs = append(errs, fmt.Errorf("migration max seq len %d: must not be negative", c.MigrationMaxSeqLen))
	}
	if t := c.ActiveDecodeBlocksThreshold; t != nil && (*t < 0 || *t > 1) {
		errs = append(errs, fmt.Errorf("active decode blocks threshold %v: want 0 to 1", *t))
	}
	if t := c.ActivePrefillTokensThreshold; t != nil && *t < 0 {
		errs = append(errs, fmt.Errorf("active prefill tokens threshold %d: must not be negative", *t))
	}
	for name, d := range map[string]time.Duration{
		"stall timeout": c.StallTimeout, "detach timeout": c.DetachTimeout, "dispatch timeout": c.DispatchTimeout,
	} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s %v: must not be negative", name, d))
		}
	}
	if c.MaxPromptTokens < 0 {
		errs = append(errs, errors.New("size limits must not be negative"))
	}
	if c.MaxChildren < 0 {
		errs = append(errs, errors.New("max children must not be negative"))
	}
	if err := c.Log.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Streams.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
