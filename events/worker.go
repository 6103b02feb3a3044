package events

// Worker event types, appended to a worker's events subject.
const (
	TypeWorkerRegistered   = "baton.worker.registered.v1"
	TypeWorkerDraining     = "baton.worker.draining.v1"
	TypeWorkerDeregistered = "baton.worker.deregistered.v1"
	TypeWorkerLost         = "baton.worker.lost.v1"
)

// WorkerRegistered records a worker that took a lease and serves Model.
type WorkerRegistered struct {
	WorkerID      string `json:"worker_id"`
	LeaseID       string `json:"lease_id"`
	Model         string `json:"model"`
	PID           int    `json:"pid"`
	Host          string `json:"host"`
	LeaseTTLMS    int64  `json:"lease_ttl_ms"`
	KVBlocks      int    `json:"kv_blocks"`
	BlockSize     int    `json:"block_size"`
	MaxConcurrent int    `json:"max_concurrent,omitempty"`
}

func (WorkerRegistered) EventType() string { return TypeWorkerRegistered }

// WorkerDraining records that a worker stopped taking new requests.
type WorkerDraining struct {
	WorkerID string `json:"worker_id"`
	LeaseID  string `json:"lease_id"`
	Reason   string `json:"reason"`
}

func (WorkerDraining) EventType() string { return TypeWorkerDraining }

// WorkerDeregistered records a worker that left cleanly.
type WorkerDeregistered struct {
	WorkerID string `json:"worker_id"`
	LeaseID  string `json:"lease_id"`
}

func (WorkerDeregistered) EventType() string { return TypeWorkerDeregistered }

// WorkerLost records a worker that vanished without deregistering: its lease
// expired or the server saw its connection drop. A frontend also records it
// for a worker it takes out of service for writing to the request log
// outside its attempts (junk): then QuarantineMS says for how long, from the
// event's time, the worker id stays out of routing whatever lease it
// registers next. A reader that does not know the field sees a lost worker.
type WorkerLost struct {
	WorkerID     string `json:"worker_id"`
	LeaseID      string `json:"lease_id"`
	Reason       string `json:"reason"`
	QuarantineMS int64  `json:"quarantine_ms,omitempty"`
}

func (WorkerLost) EventType() string { return TypeWorkerLost }

// Lease is the value of a worker's key in the leases bucket. The key's TTL is
// the lease: while the key exists, the worker is live.
type Lease struct {
	WorkerID string `json:"worker_id"`
	LeaseID  string `json:"lease_id"` // new on every registration
	Model    string `json:"model"`
	PID      int    `json:"pid"`
	Host     string `json:"host"`
	TTLMS    int64  `json:"ttl_ms"`
	Draining bool   `json:"draining,omitempty"`
	// NotReady is set while the worker's own health checks fail (a canary
	// timed out or errored, or its engine stopped making progress): the
	// worker is live but must not receive new requests. Cleared when a
	// canary passes again. Absent (false) in leases of older builds.
	NotReady bool `json:"not_ready,omitempty"`
	// NotReadyReason says why, while NotReady: the upstream's own words when
	// it refused the worker (a bad key, an unknown model), else "stalled"
	// (in-flight requests stopped producing) or "canary_failed".
	NotReadyReason string `json:"not_ready_reason,omitempty"`
	// ClientID is the worker's NATS client id on its server, matched against
	// disconnect advisories.
	ClientID uint64 `json:"client_id,omitempty"`
	Server   string `json:"server,omitempty"`
	// Capabilities are what the worker's engine can do, as probed at start;
	// absent: everything (the mock, older builds).
	Capabilities *Capabilities `json:"capabilities,omitempty"`
	// FirstTokenTimeoutMS, when set, is the deadline the worker keeps for an
	// attempt's first token (its engine's --first-token-timeout): until the
	// first token the worker itself fails an attempt that exceeds it, so a
	// frontend does not apply its stall timeout to an engine's queue time.
	// Absent: the mock, older builds.
	FirstTokenTimeoutMS int64 `json:"first_token_timeout_ms,omitempty"`
	// HoldsUntilRouted says the worker honours Dispatch.Hold.
	// Absent: older builds, which store an attempt's output as soon as it
	// comes, so a frontend sends them a dispatch only once its routed
	// decision is stored.
	HoldsUntilRouted bool `json:"holds_until_routed,omitempty"`
	// Priority is the worker's routing tier (--priority): frontends pick
	// among the highest tier's workers that can take a request, a lower
	// tier only when none can. Absent (0): older builds, the default tier.
	Priority int `json:"priority,omitempty"`
	// WritesBatched says the worker has an output stream of its own
	// (streams.WorkerOutputStream, created by a frontend when the worker
	// asked, --batched-output) and writes an attempt's output there in
	// batches when its dispatch says Dispatch.Output "batched". Absent:
	// older builds, and workers without the switch or whose ask no
	// frontend answered; they write per-token messages on the partition.
	WritesBatched bool `json:"writes_batched,omitempty"`
}

// Capabilities is what a worker's engine can do: serve chat and
// completions, continue a migrated request token-exactly from token ids, or
// by assistant prefill.
type Capabilities struct {
	Chat        bool `json:"chat"`
	Completions bool `json:"completions"`
	TokenIDs    bool `json:"token_ids"`
	Prefill     bool `json:"prefill"`
	// CompletionsNotContinuable: a completions prompt plus the text so far
	// does not continue the answer there (the server wraps completions
	// prompts in a chat template, as Ollama does), so a migrated
	// completions request can continue only from token ids. Absent (false)
	// in leases of older builds.
	CompletionsNotContinuable bool `json:"completions_not_continuable,omitempty"`
}

// Load is the value of a worker's key in the load bucket.
type Load struct {
	WorkerID            string `json:"worker_id"`
	ActiveRequests      int    `json:"active_requests"`
	KVBlocksUsed        int    `json:"kv_blocks_used"`
	KVBlocksTotal       int    `json:"kv_blocks_total"`
	QueuedPrefillTokens int    `json:"queued_prefill_tokens"`
	// Busy: the worker's server answered its probe 429 or 503. The worker
	// is ready but takes no new request until a later probe (at the
	// server's Retry-After) passes; every frontend's router treats it as
	// over a load threshold. Absent (false) in older builds' reports.
	Busy bool `json:"busy,omitempty"`
}

func init() {
	register[WorkerRegistered]()
	register[WorkerDraining]()
	register[WorkerDeregistered]()
	register[WorkerLost]()
}

// FrontendPresence is the value of a frontend's key in the frontends bucket.
// The key's TTL is the frontend's liveness: requests owned by a frontend whose
// key is gone may be taken over by another.
type FrontendPresence struct {
	FrontendID string `json:"frontend_id"`
	Addr       string `json:"addr"`
	PID        int    `json:"pid"`
	Host       string `json:"host"`
	ClientID   uint64 `json:"client_id,omitempty"`
	Server     string `json:"server,omitempty"`
	// ReadsCompacted says that this frontend folds compact records
	// (RequestCompacted). A frontend compacts a finished request only
	// while every live frontend says so: an earlier release, which does
	// not, would see a compacted request without its tokens.
	ReadsCompacted bool `json:"reads_compacted,omitempty"`
	// ReadsAcceptedRoute says that this frontend folds the routed
	// decision of attempt 0 stored in a request's accepted event
	// (RequestAccepted.Route). A frontend stores it there only while
	// every live frontend says so.
	ReadsAcceptedRoute bool `json:"reads_accepted_route,omitempty"`
	// Adoptable lists the requests in flight that this frontend owns and
	// that outlive their clients (background responses, X-Resumable), by
	// where their accepted event is stored rather than by id (workers
	// read this bucket, and an id may name a tenant). When the key goes, a
	// live frontend adopts them (docs/fault-tolerance.md).
	Adoptable []StoredAt `json:"adoptable,omitempty"`
	// ManagesOutputs says this frontend answers workers' asks for their
	// output streams and takes its turn deleting those of workers gone
	// for the stream's MaxAge (--batched-output). Absent: older builds and
	// frontends without the switch, which are never ranked to delete.
	ManagesOutputs bool `json:"manages_outputs,omitempty"`
	// ReadsBatched says this frontend follows the batches that workers
	// send it (--batched-output), and closes a batched attempt in its
	// worker's stream before it decides (docs/internals.md, "The write
	// path of many tokens per message"). A frontend asks a worker for
	// batches (Dispatch.Output) only while every live frontend says so.
	ReadsBatched bool `json:"reads_batched,omitempty"`
}

// StoredAt is where a request's accepted event is stored: the partition of
// the request log (0 for a log of one partition) and the stream sequence
// there.
type StoredAt struct {
	Partition int    `json:"p"`
	Seq       uint64 `json:"s"`
}
