package streams

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Whoever provisions decides, and everyone else verifies (issue 23). A
// stream or bucket that exists is compared with the definition this
// component would have created (Definitions): its subjects, RePublish,
// limits, discard and retention policies, storage, replicas and baton's
// metadata. Any difference is a *DefinitionError, which the binary turns
// into exit code 2: a worker credential that pre-created a bucket with an
// extra subject (to capture every prompt), a request stream without
// RePublish (every request hangs) or with a tiny MaxBytes, and two
// components started with different --stream-* flags, are all refused at
// start rather than accepted silently.

// DefinitionError means that existing streams or buckets differ from this
// component's definition of them. Diffs name each difference, one per
// field, with the stream's value and this component's.
type DefinitionError struct {
	Diffs []string
}

func (e *DefinitionError) Error() string {
	return "streams: the log on this server differs from this component's definition: " + strings.Join(e.Diffs, "; ") +
		". Start every component with the same --replicas and --stream-* flags (or environment) as the one that created the log, " +
		"or run `baton provision --update` with this component's flags to change the log to them; " +
		"a stream or bucket that baton did not create (other subjects, no RePublish) must be removed (`nats stream rm NAME`) " +
		"and provisioned again (docs/deployment.md, \"Provisioning\")"
}

// ErrMissing means a stream or bucket does not exist yet: nothing has
// provisioned the log (a worker waits for a frontend or `baton provision`).
var ErrMissing = errors.New("streams: not provisioned yet")

// Definitions are the streams a log of layout p consists of, as this
// configuration defines them: the request partitions, BATON_WORKERS, the
// streams behind the buckets (as nats.go creates them for the bucket's
// KeyValueConfig), and last the ends place (BATON_ENDS).
func (c Config) Definitions(p Partitions) []jetstream.StreamConfig {
	var out []jetstream.StreamConfig
	for k := range p.n() {
		out = append(out, c.RequestsConfig(p, k))
	}
	out = append(out, c.WorkersConfig())
	for _, kc := range c.buckets() {
		out = append(out, bucketStream(kc))
	}
	return append(out, c.EndsConfig())
}

func (c Config) buckets() []jetstream.KeyValueConfig {
	return []jetstream.KeyValueConfig{
		c.bucketConfig(LeasesBucket, "baton worker leases: a key lives while its worker's lease does"),
		c.bucketConfig(LoadBucket, "baton worker load reports"),
		c.bucketConfig(FrontendsBucket, "baton frontend replicas: a key lives while its frontend does"),
		c.budgetsConfig(),
	}
}

// BudgetsTTL is how long a key of BudgetsBucket lives without a write: a
// tenant's budget left alone this long is full again anyway (it refills
// within 60 s), and a frontend republishes its budgets' hash well within it.
const BudgetsTTL = 5 * time.Minute

func (c Config) budgetsConfig() jetstream.KeyValueConfig {
	kc := c.bucketConfig(BudgetsBucket, "baton tenant budgets shared by the frontends: levels, leases, each frontend's budgets hash")
	kc.TTL = BudgetsTTL
	return kc
}

// bucketStream is the stream nats.go's CreateKeyValue defines for kc
// (jetstream's prepareKeyValueConfig, for the fields baton's buckets use);
// TestBucketDefinitionIsNATSs keeps the two equal.
func bucketStream(kc jetstream.KeyValueConfig) jetstream.StreamConfig {
	history := int64(max(kc.History, 1))
	dup := 2 * time.Minute
	if kc.TTL > 0 && kc.TTL < dup {
		dup = kc.TTL
	}
	return jetstream.StreamConfig{
		Name:                   "KV_" + kc.Bucket,
		Description:            kc.Description,
		Subjects:               []string{"$KV." + kc.Bucket + ".>"},
		MaxMsgsPerSubject:      history,
		MaxBytes:               -1,
		MaxAge:                 kc.TTL,
		MaxMsgSize:             -1,
		MaxMsgs:                -1,
		MaxConsumers:           -1,
		Storage:                kc.Storage,
		Replicas:               max(kc.Replicas, 1),
		AllowRollup:            true,
		DenyDelete:             true,
		Duplicates:             dup,
		AllowDirect:            true,
		Discard:                jetstream.DiscardNew,
		AllowMsgTTL:            kc.LimitMarkerTTL != 0,
		SubjectDeleteMarkerTTL: kc.LimitMarkerTTL,
	}
}

// Verify checks, without creating anything, that every stream and bucket of
// the log exists and matches cfg, and returns the layout. A missing one is
// ErrMissing (also when no request stream exists), a different number of
// partitions a *PartitionsMismatchError, any other difference a
// *DefinitionError listing every one. Transient failures are retried until
// ctx ends.
func Verify(ctx context.Context, js jetstream.JetStream, cfg Config) (Partitions, error) {
	if err := cfg.Validate(); err != nil {
		return 0, fmt.Errorf("streams: config: %w", err)
	}
	var p Partitions
	err := Retry(ctx, func(ctx context.Context) error {
		var err error
		p, err = verify(ctx, js, cfg)
		return err
	})
	return p, err
}

func verify(ctx context.Context, js jetstream.JetStream, cfg Config) (Partitions, error) {
	p, err := discover(ctx, js)
	switch {
	case errors.Is(err, ErrNotProvisioned):
		return 0, fmt.Errorf("%w: no request stream (%s)", ErrMissing, RequestsStream)
	case err != nil:
		return 0, err
	case cfg.RequestPartitions != 0 && Partitions(cfg.RequestPartitions) != p:
		return 0, &PartitionsMismatchError{Want: Partitions(cfg.RequestPartitions), Have: p}
	}
	// Two layouts at once (a race of components with different numbers on
	// a standalone server can leave both): refuse rather than read one.
	other := RequestsStream
	if p.n() == 1 {
		other = Partitions(2).Stream(0)
	}
	if _, err := js.Stream(ctx, other); err == nil {
		return 0, &DefinitionError{Diffs: []string{fmt.Sprintf("%s exists beside the request log of %d partition(s) (%s): "+
			"two layouts, left by components started at once with different --request-partitions; remove the one not in use", other, p.n(), layoutNames(p))}}
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, fmt.Errorf("streams: look up stream %s: %w", other, err)
	}
	return p, verifyStreams(ctx, js, cfg.Definitions(p))
}

// verifyStreams checks that every stream of defs exists (else ErrMissing)
// and is defined so (else a *DefinitionError listing every difference).
func verifyStreams(ctx context.Context, js jetstream.JetStream, defs []jetstream.StreamConfig) error {
	var diffs []string
	for _, want := range defs {
		s, err := js.Stream(ctx, want.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("%w: no stream %s", ErrMissing, want.Name)
		}
		if err != nil {
			return fmt.Errorf("streams: look up stream %s: %w", want.Name, err)
		}
		for _, d := range Diff(want, s.CachedInfo().Config) {
			diffs = append(diffs, want.Name+" "+d)
		}
	}
	if diffs != nil {
		return &DefinitionError{Diffs: diffs}
	}
	return nil
}

// WaitProvisioned is Verify for a worker, which may not provision: it
// checks the streams a worker reads and binds, BATON_WORKERS and the
// buckets but the budgets (their definitions do not depend on the request partitions, and
// a worker reads no request stream: the frontends, which do, verify those,
// and a worker holds no grant on their info, which would list every
// request id). While they are missing it calls waiting (at the first try,
// then once a minute) and tries again, until ctx ends. A difference is a
// *DefinitionError at once.
func WaitProvisioned(ctx context.Context, js jetstream.JetStream, cfg Config, waiting func(error)) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("streams: config: %w", err)
	}
	var defs []jetstream.StreamConfig
	for _, d := range cfg.Definitions(1)[1:] { // BATON_WORKERS and the buckets
		// A worker reads neither the ends place nor the tenant budgets (so
		// a worker of this release starts beside frontends of the previous
		// one, which do not create the budgets bucket).
		if d.Name != EndsStream && d.Name != "KV_"+BudgetsBucket {
			defs = append(defs, d)
		}
	}
	var next time.Time
	for {
		err := Retry(ctx, func(ctx context.Context) error {
			err := verifyStreams(ctx, js, defs)
			var de *DefinitionError
			if errors.As(err, &de) && verifyStreams(ctx, js, append([]jetstream.StreamConfig{cfg.legacyWorkersConfig()}, defs[1:]...)) == nil {
				return nil // an earlier release's BATON_WORKERS, which the first new frontend bounds
			}
			return err
		})
		if !errors.Is(err, ErrMissing) {
			return err
		}
		if now := time.Now(); !now.Before(next) {
			waiting(err)
			next = now.Add(time.Minute)
		}
		t := time.NewTimer(250 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (waited until: %w)", err, ctx.Err())
		case <-t.C:
		}
	}
}

// Diff lists how have, an existing stream's definition, differs from want,
// baton's, in every field that decides what the stream captures, keeps,
// refuses or republishes: "max_bytes: the server has 1024, this component
// 1073741824". Limits of 0 and -1 both mean unlimited; metadata keys of the
// server's own (_nats.*) are not compared; a BATON_REQUESTS with no
// partition metadata (created before partitions existed) is one partition.
func Diff(want, have jetstream.StreamConfig) []string {
	var out []string
	add := func(field string, h, w any) {
		out = append(out, fmt.Sprintf("%s: the server has %v, this component %v", field, h, w))
	}
	if a, b := slices.Sorted(slices.Values(have.Subjects)), slices.Sorted(slices.Values(want.Subjects)); !slices.Equal(a, b) {
		add("subjects", a, b)
	}
	if h, w := republish(have.RePublish), republish(want.RePublish); h != w {
		add("republish", h, w)
	}
	if have.Mirror != nil || len(have.Sources) > 0 || have.SubjectTransform != nil {
		add("mirror/sources/subject_transform", "some", "none")
	}
	for _, f := range []struct {
		name string
		h, w any
	}{
		{"retention", have.Retention, want.Retention},
		{"discard", have.Discard, want.Discard},
		{"discard_new_per_subject", have.DiscardNewPerSubject, want.DiscardNewPerSubject},
		{"storage", have.Storage, want.Storage},
		{"replicas", max(have.Replicas, 1), max(want.Replicas, 1)},
		{"max_age", have.MaxAge, want.MaxAge},
		{"max_bytes", limit(have.MaxBytes), limit(want.MaxBytes)},
		{"max_msgs", limit(have.MaxMsgs), limit(want.MaxMsgs)},
		{"max_msgs_per_subject", limit(have.MaxMsgsPerSubject), limit(want.MaxMsgsPerSubject)},
		{"max_msg_size", limit(int64(have.MaxMsgSize)), limit(int64(want.MaxMsgSize))},
		{"max_consumers", limit(int64(have.MaxConsumers)), limit(int64(want.MaxConsumers))},
		{"no_ack", have.NoAck, want.NoAck},
		{"allow_direct", have.AllowDirect, want.AllowDirect},
		{"allow_rollup", have.AllowRollup, want.AllowRollup},
		{"deny_delete", have.DenyDelete, want.DenyDelete},
		{"deny_purge", have.DenyPurge, want.DenyPurge},
		{"sealed", have.Sealed, want.Sealed},
		{"allow_msg_ttl", have.AllowMsgTTL, want.AllowMsgTTL},
		{"subject_delete_marker_ttl", have.SubjectDeleteMarkerTTL, want.SubjectDeleteMarkerTTL},
	} {
		if f.h != f.w {
			add(f.name, f.h, f.w)
		}
	}
	if h, w := batonMetadata(have.Metadata), batonMetadata(want.Metadata); !maps.Equal(h, w) &&
		!(have.Name == RequestsStream && len(h) == 0 && w[metaPartitions] == "1") {
		add("metadata", h, w)
	}
	return out
}

// limit maps the ways of saying unlimited (0, -1) to -1.
func limit(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

func republish(r *jetstream.RePublish) string {
	if r == nil {
		return "none"
	}
	return fmt.Sprintf("%s → %s (headers only %v)", r.Source, r.Destination, r.HeadersOnly)
}

// batonMetadata is m without the server's own keys.
func batonMetadata(m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		if !strings.HasPrefix(k, "_nats.") {
			out[k] = v
		}
	}
	return out
}

// Update changes every existing stream and bucket of the log that differs
// from cfg's definition to that definition (JetStream refuses what it cannot
// change in place, such as storage or retention: remove that stream), then
// provisions what is missing and verifies. It returns a line per stream it
// changed, naming the differences. Only an operator's credential (or a
// frontend's) may do this; every component started with other flags is
// then refused.
func Update(ctx context.Context, js jetstream.JetStream, cfg Config) (Partitions, []string, error) {
	if err := cfg.Validate(); err != nil {
		return 0, nil, fmt.Errorf("streams: config: %w", err)
	}
	p, err := discover(ctx, js)
	switch {
	case errors.Is(err, ErrNotProvisioned):
		p, err = Provision(ctx, js, cfg)
		return p, nil, err
	case err != nil:
		return 0, nil, err
	case cfg.RequestPartitions != 0 && Partitions(cfg.RequestPartitions) != p:
		return 0, nil, &PartitionsMismatchError{Want: Partitions(cfg.RequestPartitions), Have: p}
	}
	var changed []string
	for _, want := range cfg.Definitions(p) {
		s, err := js.Stream(ctx, want.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue // Provision creates it
		}
		if err != nil {
			return 0, changed, fmt.Errorf("streams: look up stream %s: %w", want.Name, err)
		}
		d := Diff(want, s.CachedInfo().Config)
		if d == nil {
			continue
		}
		if _, err := js.UpdateStream(ctx, want); err != nil {
			return 0, changed, fmt.Errorf("streams: update stream %s (%s): %w", want.Name, strings.Join(d, "; "), err)
		}
		changed = append(changed, want.Name+": "+strings.Join(d, "; "))
	}
	c := cfg
	c.RequestPartitions = int(p)
	p, err = Provision(ctx, js, c)
	return p, changed, err
}
