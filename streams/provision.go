package streams

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Config sets the retention of baton's streams and buckets. Zero values mean
// the documented defaults (see Defaults).
type Config struct {
	Replicas          int           // R for streams and buckets (1, or 3 in a cluster); default 1
	MemoryStorage     bool          // keep streams in memory instead of files (tests, benchmarks)
	RequestsMaxAge    time.Duration // how long a request's events stay; default 24h
	RequestsMaxBytes  int64         // size cap of each request stream (partition); default 1 GiB
	MaxMsgsPerSubject int64         // cap on one subject (one attempt's deltas); default 100000
	MaxMsgSize        int32         // largest event; default 1 MiB
	WorkersMaxAge     time.Duration // how long worker lifecycle events stay; default 7 days
	MarkerTTL         time.Duration // how long lease-expiry markers stay; default 5m
	// RequestPartitions is the number of streams the request log is split
	// into (see Partitions), 1 to MaxPartitions. 0 means: whatever the
	// existing streams have, and 1 if they do not exist yet. A number that
	// differs from the existing streams' is a PartitionsMismatchError.
	RequestPartitions int
}

// Defaults of Config.
const (
	DefaultRequestsMaxAge    = 24 * time.Hour
	DefaultRequestsMaxBytes  = 1 << 30
	DefaultMaxMsgsPerSubject = 100_000
	DefaultMaxMsgSize        = 1 << 20
	DefaultWorkersMaxAge     = 7 * 24 * time.Hour
	DefaultMarkerTTL         = 5 * time.Minute
)

func (c Config) withDefaults() Config {
	c.Replicas = cmp.Or(c.Replicas, 1)
	c.RequestsMaxAge = cmp.Or(c.RequestsMaxAge, DefaultRequestsMaxAge)
	c.RequestsMaxBytes = cmp.Or(c.RequestsMaxBytes, DefaultRequestsMaxBytes)
	c.MaxMsgsPerSubject = cmp.Or(c.MaxMsgsPerSubject, DefaultMaxMsgsPerSubject)
	c.MaxMsgSize = cmp.Or(c.MaxMsgSize, DefaultMaxMsgSize)
	c.WorkersMaxAge = cmp.Or(c.WorkersMaxAge, DefaultWorkersMaxAge)
	c.MarkerTTL = cmp.Or(c.MarkerTTL, DefaultMarkerTTL)
	return c
}

// Validate reports every problem with c.
func (c Config) Validate() error {
	var errs []error
	if c.Replicas < 0 || c.Replicas > 5 {
		errs = append(errs, fmt.Errorf("replicas %d: want 1 to 5", c.Replicas))
	}
	if c.RequestPartitions != 0 {
		if err := Partitions(c.RequestPartitions).Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.RequestsMaxAge < 0 || c.RequestsMaxBytes < 0 || c.MaxMsgsPerSubject < 0 || c.MaxMsgSize < 0 || c.WorkersMaxAge < 0 || c.MarkerTTL < 0 {
		errs = append(errs, errors.New("retention limits must not be negative"))
	}
	return errors.Join(errs...)
}

func (c Config) storage() jetstream.StorageType {
	if c.MemoryStorage {
		return jetstream.MemoryStorage
	}
	return jetstream.FileStorage
}

// RequestsConfig is the definition of partition k of a request log of p
// partitions: BATON_REQUESTS when p is 1. Every partition has the same
// limits (each its own MaxBytes), and republishes to baton.live.requests.>.
func (c Config) RequestsConfig(p Partitions, k int) jetstream.StreamConfig {
	c = c.withDefaults()
	desc := "baton requests: lifecycle events and token deltas, one subject tree per request"
	if p.n() > 1 {
		desc = fmt.Sprintf("baton requests, partition %d of %d: the requests whose hash slot s has s %% %d == %d", k, p.n(), p.n(), k)
	}
	return jetstream.StreamConfig{
		Name:        p.Stream(k),
		Description: desc,
		Subjects:    p.Subjects(k),
		Metadata:    map[string]string{metaPartitions: strconv.Itoa(p.n()), metaPartition: strconv.Itoa(k)},
		Storage:     c.storage(),
		Replicas:    c.Replicas,
		MaxAge:      c.RequestsMaxAge,
		MaxBytes:    c.RequestsMaxBytes,
		// A full stream refuses new writes rather than silently dropping the
		// oldest tokens of a live request.
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		MaxMsgsPerSubject:    c.MaxMsgsPerSubject,
		MaxMsgSize:           c.MaxMsgSize,
		Duplicates:           2 * time.Minute,
		AllowDirect:          true,
		RePublish: &jetstream.RePublish{
			Source:      requestsPrefix + ">",
			Destination: livePrefix + ">",
		},
	}
}

// Limits of BATON_WORKERS. A worker may write only its own events subject,
// so what one worker credential can store there is bounded by
// WorkersMaxMsgsPerSubject × WorkersMaxMsgSize (4 MiB), and a flood only
// rotates its own subject's history (the per-subject limit discards the
// subject's oldest); WorkersMaxBytes bounds the stream as a whole. A
// lifecycle event is a few hundred bytes, and readers need only each
// worker's latest (discovery reads the last per subject).
const (
	WorkersMaxBytes          = 256 << 20
	WorkersMaxMsgSize        = 16 << 10
	WorkersMaxMsgsPerSubject = 256
)

// WorkersConfig is the definition of BATON_WORKERS. Its limits are fixed
// (not taken from the request log's --stream-* flags).
func (c Config) WorkersConfig() jetstream.StreamConfig {
	c = c.withDefaults()
	return jetstream.StreamConfig{
		Name:              WorkersStream,
		Description:       "baton workers: registration, draining, deregistration, loss",
		Subjects:          []string{workersPrefix + ">"},
		Storage:           c.storage(),
		Replicas:          c.Replicas,
		MaxAge:            c.WorkersMaxAge,
		MaxBytes:          WorkersMaxBytes,
		MaxMsgsPerSubject: WorkersMaxMsgsPerSubject,
		Discard:           jetstream.DiscardOld,
		MaxMsgSize:        WorkersMaxMsgSize,
		Duplicates:        2 * time.Minute,
		AllowDirect:       true,
	}
}

// legacyWorkersConfig is BATON_WORKERS as releases before issue 23 defined
// it (no MaxBytes, 10,000 messages per subject, the request log's message
// size): Provision updates such a stream to WorkersConfig in place, and a
// worker accepts it until then, so that an upgrade needs no operator.
func (c Config) legacyWorkersConfig() jetstream.StreamConfig {
	sc := c.WorkersConfig()
	sc.MaxBytes, sc.MaxMsgsPerSubject, sc.MaxMsgSize = -1, 10_000, c.withDefaults().MaxMsgSize
	return sc
}

func (c Config) bucketConfig(name, desc string) jetstream.KeyValueConfig {
	c = c.withDefaults()
	return jetstream.KeyValueConfig{
		Bucket:         name,
		Description:    desc,
		History:        1,
		Storage:        c.storage(),
		Replicas:       c.Replicas,
		LimitMarkerTTL: c.MarkerTTL,
	}
}

// Provision creates baton's streams and buckets if they do not exist, and
// returns the request log's partitions. It is idempotent and safe to race:
// whichever component starts first creates them, and an existing definition
// is never weakened or replaced: one that differs from cfg's is a
// *DefinitionError (see Verify). The number of partitions is
// the existing streams' (cfg.RequestPartitions 0 adopts it; another number
// is a *PartitionsMismatchError). In a cluster that is still forming (no meta
// leader yet, a node restarting) transient failures (see Transient) are
// retried until ctx ends, each try bounded by DefaultTimeout.
//
// When this call created request partitions with replicas, it then spreads
// their leaders over the cluster's nodes (SpreadLeaders); if that fails the
// streams still work, and the error wraps ErrLeadersNotSpread with the layout.
func Provision(ctx context.Context, js jetstream.JetStream, cfg Config) (Partitions, error) {
	if err := cfg.Validate(); err != nil {
		return 0, fmt.Errorf("streams: config: %w", err)
	}
	var p Partitions
	created := false
	err := Retry(ctx, func(ctx context.Context) error {
		var c bool
		var err error
		p, c, err = provision(ctx, js, cfg)
		created = created || c
		return err
	})
	if err != nil {
		return 0, err
	}
	if created && p.n() > 1 && cfg.withDefaults().Replicas > 1 {
		sctx, cancel := context.WithTimeout(ctx, SpreadBudget)
		defer cancel()
		if err := SpreadLeaders(sctx, js, p); err != nil {
			return p, fmt.Errorf("%w: %w", ErrLeadersNotSpread, err)
		}
	}
	return p, nil
}

// StartBudget is how long a component starting up keeps retrying JetStream
// calls that fail transiently: a cluster still forming, or electing a leader
// (5-7 s), answers within it.
const StartBudget = 60 * time.Second

// Retry runs f until it succeeds, fails with an error that is not
// Transient, or ctx is done, spacing tries with a backoff (50 ms doubling to
// 1 s). Each try gets at most DefaultTimeout: a request sent before the
// cluster has a leader is dropped unanswered.
func Retry(ctx context.Context, f func(ctx context.Context) error) error {
	return poll(ctx, appendBackoffMax, func(ctx context.Context) (bool, error) {
		err := f(ctx)
		return err == nil, err
	})
}

// provision makes sure every stream and bucket exists, then that each is
// defined as cfg defines it (verify); created says whether it created a
// request partition.
func provision(ctx context.Context, js jetstream.JetStream, cfg Config) (p Partitions, created bool, err error) {
	if p, created, err = provisionRequests(ctx, js, cfg); err != nil {
		return 0, false, err
	}
	have, err := ensureStream(ctx, js, cfg.WorkersConfig())
	if err != nil {
		return 0, false, err
	}
	if have != nil && Diff(cfg.WorkersConfig(), *have) != nil && Diff(cfg.legacyWorkersConfig(), *have) == nil {
		if _, err := js.UpdateStream(ctx, cfg.WorkersConfig()); err != nil {
			return 0, false, fmt.Errorf("streams: bound %s (an earlier release's definition): %w", WorkersStream, err)
		}
	}
	for _, kc := range cfg.buckets() {
		if err := ensureBucket(ctx, js, kc); err != nil {
			return 0, false, err
		}
	}
	if _, err := ensureStream(ctx, js, cfg.EndsConfig()); err != nil {
		return 0, false, err
	}
	if _, err := verify(ctx, js, cfg); err != nil {
		return 0, false, err
	}
	return p, created, nil
}

// ensureStream creates sc if no stream of its name exists. It returns the
// existing stream's definition, or nil when it created it.
func ensureStream(ctx context.Context, js jetstream.JetStream, sc jetstream.StreamConfig) (*jetstream.StreamConfig, error) {
	for range 3 {
		if s, err := js.Stream(ctx, sc.Name); err == nil {
			return &s.CachedInfo().Config, nil
		} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("streams: look up stream %s: %w", sc.Name, err)
		}
		_, err := js.CreateStream(ctx, sc)
		if err == nil {
			return nil, nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, fmt.Errorf("streams: create stream %s: %w", sc.Name, translateCreate(err))
		}
		// Lost a race with another component: look again.
	}
	return nil, fmt.Errorf("streams: create stream %s: still racing", sc.Name)
}

func ensureBucket(ctx context.Context, js jetstream.JetStream, kc jetstream.KeyValueConfig) error {
	for range 3 {
		if _, err := js.KeyValue(ctx, kc.Bucket); err == nil {
			return nil
		} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("streams: look up bucket %s: %w", kc.Bucket, err)
		}
		_, err := js.CreateKeyValue(ctx, kc)
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrBucketExists) && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("streams: create bucket %s: %w", kc.Bucket, err)
		}
	}
	return fmt.Errorf("streams: create bucket %s: still racing", kc.Bucket)
}
