package streams

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Config sets the retention of baton's streams and buckets. Zero values mean
// the documented defaults (see Defaults).
type Config struct {
	Replicas          int           // R for streams and buckets (1, or 3 in a cluster); default 1
	MemoryStorage     bool          // keep streams in memory instead of files (tests, benchmarks)
	RequestsMaxAge    time.Duration // how long a request's events stay; default 24h
	RequestsMaxBytes  int64         // size cap of BATON_REQUESTS; default 1 GiB
	MaxMsgsPerSubject int64         // cap on one subject (one attempt's deltas); default 100000
	MaxMsgSize        int32         // largest event; default 1 MiB
	WorkersMaxAge     time.Duration // how long worker lifecycle events stay; default 7 days
	MarkerTTL         time.Duration // how long lease-expiry markers stay; default 5m
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
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.RequestsMaxAge == 0 {
		c.RequestsMaxAge = DefaultRequestsMaxAge
	}
	if c.RequestsMaxBytes == 0 {
		c.RequestsMaxBytes = DefaultRequestsMaxBytes
	}
	if c.MaxMsgsPerSubject == 0 {
		c.MaxMsgsPerSubject = DefaultMaxMsgsPerSubject
	}
	if c.MaxMsgSize == 0 {
		c.MaxMsgSize = DefaultMaxMsgSize
	}
	if c.WorkersMaxAge == 0 {
		c.WorkersMaxAge = DefaultWorkersMaxAge
	}
	if c.MarkerTTL == 0 {
		c.MarkerTTL = DefaultMarkerTTL
	}
	return c
}

// Validate reports every problem with c.
func (c Config) Validate() error {
	var errs []error
	if c.Replicas < 0 || c.Replicas > 5 {
		errs = append(errs, fmt.Errorf("replicas %d: want 1 to 5", c.Replicas))
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

// RequestsConfig is the definition of BATON_REQUESTS.
func (c Config) RequestsConfig() jetstream.StreamConfig {
	c = c.withDefaults()
	return jetstream.StreamConfig{
		Name:        RequestsStream,
		Description: "baton requests: lifecycle events and token deltas, one subject tree per request",
		Subjects:    []string{requestsPrefix + ">"},
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

// WorkersConfig is the definition of BATON_WORKERS.
func (c Config) WorkersConfig() jetstream.StreamConfig {
	c = c.withDefaults()
	return jetstream.StreamConfig{
		Name:              WorkersStream,
		Description:       "baton workers: registration, draining, deregistration, loss",
		Subjects:          []string{workersPrefix + ">"},
		Storage:           c.storage(),
		Replicas:          c.Replicas,
		MaxAge:            c.WorkersMaxAge,
		MaxMsgsPerSubject: 10_000,
		Discard:           jetstream.DiscardOld,
		MaxMsgSize:        c.MaxMsgSize,
		Duplicates:        2 * time.Minute,
		AllowDirect:       true,
	}
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

// Provision creates baton's streams and buckets if they do not exist. It is
// idempotent and safe to race: whichever component starts first creates them,
// and an existing definition is kept as it is (never weakened or replaced).
// In a cluster that is still forming (no meta leader yet, a node restarting)
// transient failures (see Transient) are retried until ctx ends, each try
// bounded by DefaultTimeout.
func Provision(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("streams: config: %w", err)
	}
	return Retry(ctx, func(ctx context.Context) error { return provision(ctx, js, cfg) })
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
	backoff := appendBackoffMin
	for {
		tctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
		err := f(tctx)
		cancel()
		if err == nil || !Transient(err) || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
		backoff = min(2*backoff, appendBackoffMax)
	}
}

func provision(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	for _, sc := range []jetstream.StreamConfig{cfg.RequestsConfig(), cfg.WorkersConfig()} {
		if err := ensureStream(ctx, js, sc); err != nil {
			return err
		}
	}
	for _, kc := range []jetstream.KeyValueConfig{
		cfg.bucketConfig(LeasesBucket, "baton worker leases: a key lives while its worker's lease does"),
		cfg.bucketConfig(LoadBucket, "baton worker load reports"),
		cfg.bucketConfig(FrontendsBucket, "baton frontend replicas: a key lives while its frontend does"),
	} {
		if err := ensureBucket(ctx, js, kc); err != nil {
			return err
		}
	}
	return nil
}

func ensureStream(ctx context.Context, js jetstream.JetStream, sc jetstream.StreamConfig) error {
	for range 3 {
		if _, err := js.Stream(ctx, sc.Name); err == nil {
			return nil
		} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("streams: look up stream %s: %w", sc.Name, err)
		}
		_, err := js.CreateStream(ctx, sc)
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("streams: create stream %s: %w", sc.Name, err)
		}
		// Lost a race with another component: look again.
	}
	return fmt.Errorf("streams: create stream %s: still racing", sc.Name)
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
