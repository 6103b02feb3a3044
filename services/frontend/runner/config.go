package runner

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/baton-dev/baton/services/retention"
	"github.com/baton-dev/baton/streams"
)

// Config configures the runtime. Zero values mean the documented defaults,
// applied once, by New (CONTRACT.md names the flags and variables); the
// frontend's Config holds it whole (frontend.Config.Runtime), and cmd/baton
// binds the flags straight into it.
type Config struct {
	ID string // the frontend's id: owner and source of what it decides; required

	// The migration policy (migrations.Policy); routing is the fleet's
	// (fleet.Config).
	MigrationLimit     int // re-dispatches one request may have; 0: migration off
	MigrationMaxSeqLen int // prompt + generated tokens past which a request stops migrating; 0: unset
	// MigrationExactOnly: a continuation is dispatched only to a worker
	// that continues it exactly by construction (token ids; the mock),
	// never by prefill (migrations.Policy.ExactOnly).
	MigrationExactOnly bool

	// Timers of a running request.
	StallTimeout    time.Duration // silence of a worker that counts as its failure; default 30s
	DetachTimeout   time.Duration // life of a request without a client; default 120s
	DispatchTimeout time.Duration // wait for a worker's answer to a dispatch; default 2s
	// BusyWait, if above 0, is how long after its accepted event a request
	// that has produced nothing, whose dispatch found every worker busy
	// (or was refused busy by the one picked: another frontend took the
	// free place first), waits for a place and is dispatched again, rather
	// than fail 503 all_workers_busy. The edge sets it to the admission
	// queue's wait when the queue is on (--admission-wait); 0: fail at once.
	BusyWait time.Duration

	// Limits the runtime enforces.
	// MaxPromptTokens bounds a prompt in the engine's tokens; default 32768.
	// It is sent with each dispatch, and the engine checks it in its own
	// tokens; the edge refuses before dispatch a prompt of more
	// whitespace-separated words than this, a word being at least one token.
	MaxPromptTokens int
	MaxChildren     int // children one request may have; Start checks the log keeps room for a cancel after them; default 1024

	Streams      streams.Config   // provisioning and retention of the log
	Log          retention.Config // the log's lifecycle: the high-water mark above which new requests are refused (ErrLogFull), eviction
	NoCompaction bool             // keep a finished request's deltas rather than fold them into its compact record (debugging; baton compact does it by hand)

	// RouteInAccepted (--route-in-accepted, off by default in this
	// release) stores a request's first routing decision in its accepted
	// event (events.RequestAccepted.Route) while every live frontend says
	// it reads it there: the worker is told after one acknowledgement,
	// not two. Off while a previous release's frontend or baton replay
	// may read the log, which would see attempt 0 unrouted
	// (docs/compatibility.md, rule 3: this release reads it, the next
	// writes it).
	RouteInAccepted bool

	// BatchedOutput (--batched-output, off by default) makes this frontend
	// answer workers' asks for an output stream of their own
	// (streams.WorkerOutputStream) and delete those of workers gone for
	// the stream's MaxAge (outputs.go). Off, it creates, lists and deletes
	// no such stream and subscribes to no ask.
	BatchedOutput bool
	// WorkerOutputMaxBytes bounds each worker's output stream
	// (--worker-output-max-bytes); default streams.DefaultWorkerOutputMaxBytes.
	WorkerOutputMaxBytes int64
	// WorkerOutputMaxAge is a worker output stream's MaxAge, and how long
	// its worker's lease must have been gone before it is deleted; default
	// DetachTimeout + streams.WorkerOutputGrace. No flag: tests shorten it.
	WorkerOutputMaxAge time.Duration
}

// Defaults of Config.
const (
	DefaultStallTimeout    = 30 * time.Second
	DefaultDetachTimeout   = 120 * time.Second
	DefaultDispatchTimeout = 2 * time.Second
	DefaultMaxPromptTokens = 32768
	DefaultMaxChildren     = 1024
)

func (c Config) withDefaults() Config {
	c.StallTimeout = cmp.Or(c.StallTimeout, DefaultStallTimeout)
	c.DetachTimeout = cmp.Or(c.DetachTimeout, DefaultDetachTimeout)
	c.DispatchTimeout = cmp.Or(c.DispatchTimeout, DefaultDispatchTimeout)
	c.MaxPromptTokens = cmp.Or(c.MaxPromptTokens, DefaultMaxPromptTokens)
	c.MaxChildren = cmp.Or(c.MaxChildren, DefaultMaxChildren)
	c.WorkerOutputMaxBytes = cmp.Or(c.WorkerOutputMaxBytes, streams.DefaultWorkerOutputMaxBytes)
	c.WorkerOutputMaxAge = cmp.Or(c.WorkerOutputMaxAge, c.DetachTimeout+streams.WorkerOutputGrace)
	return c
}

// Validate reports every problem with c. An empty ID is left to New (the
// frontend draws one).
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
	if c.WorkerOutputMaxBytes < 0 || c.WorkerOutputMaxAge < 0 {
		errs = append(errs, errors.New("worker output limits must not be negative"))
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
