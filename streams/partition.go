package streams

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
)

// The request log is split into partitions (issue 10): partition k of N
// owns the hash slots s with s % N == k (Slot), one stream each, so that
// the writes of different requests go to different stream leaders. N is
// fixed when the streams are created and recorded in every partition's
// metadata; readers learn it from the server (Discover), never from a flag.
// The streams and subjects of each N are laid out in docs/internals.md
// ("Partitions and write capacity").
//
// A request's stream is a function of its id alone: PartitionOf(id), and
// all of a request lives in one stream, so its sequences (and a subject's
// Nats-Last-Sequence) are comparable; sequences of different partitions are not.

// MaxPartitions bounds N: each partition owns at least one slot.
const MaxPartitions = Slots

// Metadata keys of a request stream.
const (
	metaPartitions = "baton.request_partitions" // N, on every partition
	metaPartition  = "baton.request_partition"  // k
)

// Partitions is the number of streams the request log is split into. The
// zero value means 1 (BATON_REQUESTS alone).
type Partitions int

func (p Partitions) n() int { return max(int(p), 1) }

// Count is the number of partitions (at least 1).
func (p Partitions) Count() int { return p.n() }

// Validate reports whether p is a number of partitions baton can create.
func (p Partitions) Validate() error {
	if p < 1 || p > MaxPartitions {
		return fmt.Errorf("request partitions %d: want 1 to %d", int(p), MaxPartitions)
	}
	return nil
}

// Stream is the name of partition k's stream.
func (p Partitions) Stream(k int) string {
	if p.n() == 1 {
		return RequestsStream
	}
	return RequestsStream + "_" + strconv.Itoa(k)
}

// Streams are the names of every partition's stream, partition 0 first.
func (p Partitions) Streams() []string {
	out := make([]string, p.n())
	for k := range out {
		out[k] = p.Stream(k)
	}
	return out
}

// PartitionOf is the partition that holds request id.
func (p Partitions) PartitionOf(id string) int { return Slot(id) % p.n() }

// StreamOf is the stream that holds request id.
func (p Partitions) StreamOf(id string) string { return p.Stream(p.PartitionOf(id)) }

// Subjects are the subjects of partition k's stream.
func (p Partitions) Subjects(k int) []string {
	if p.n() == 1 {
		return []string{requestsPrefix + ">"}
	}
	var out []string
	for s := k; s < Slots; s += p.n() {
		out = append(out, requestsPrefix+strconv.Itoa(s)+".>")
	}
	return out
}

// ErrNotProvisioned means the server has no request stream yet.
var ErrNotProvisioned = errors.New("streams: the request log is not provisioned (is anything of baton running against this server?)")

// PartitionsMismatchError means a component was configured with another
// number of request partitions than the existing streams have.
type PartitionsMismatchError struct {
	Want, Have Partitions
}

func (e *PartitionsMismatchError) Error() string {
	return fmt.Sprintf("streams: --request-partitions %d, but the request log on this server has %d partition(s) (%s); "+
		"the number is fixed when the streams are created: start with --request-partitions %d (BATON_REQUEST_PARTITIONS) or leave it unset",
		int(e.Want), e.Have.n(), layoutNames(e.Have), e.Have.n())
}

func layoutNames(p Partitions) string {
	if p.n() <= 2 {
		return fmt.Sprint(p.Streams())
	}
	return fmt.Sprintf("%s .. %s", p.Stream(0), p.Stream(p.n()-1))
}

// Discover reads the number of request partitions from the server: the
// metadata of BATON_REQUESTS, or else of BATON_REQUESTS_0. It returns
// ErrNotProvisioned when neither exists. A BATON_REQUESTS without metadata
// (created before partitions existed) is one partition.
func Discover(ctx context.Context, js jetstream.JetStream) (Partitions, error) {
	var p Partitions
	err := Retry(ctx, func(ctx context.Context) error {
		var err error
		p, err = discover(ctx, js)
		return err
	})
	return p, err
}

func discover(ctx context.Context, js jetstream.JetStream) (Partitions, error) {
	for _, name := range []string{RequestsStream, Partitions(2).Stream(0)} {
		s, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("streams: look up stream %s: %w", name, err)
		}
		meta := s.CachedInfo().Config.Metadata
		if name == RequestsStream && meta[metaPartitions] == "" {
			return 1, nil
		}
		n, err := strconv.Atoi(meta[metaPartitions])
		if err == nil {
			err = Partitions(n).Validate()
		}
		if err == nil && (n == 1) != (name == RequestsStream) {
			err = fmt.Errorf("stream %s says %d partitions", name, n)
		}
		if err != nil {
			return 0, fmt.Errorf("streams: metadata %s of %s: %w", metaPartitions, name, err)
		}
		return Partitions(n), nil
	}
	return 0, ErrNotProvisioned
}

// errLayoutRace means another component created a request log of another
// layout while this one was creating its own.
var errLayoutRace = errors.New("streams: another component created the request log first")

// jsErrCodeSubjectOverlap is the server's JSStreamSubjectOverlapErr: a new
// stream's subjects overlap an existing stream's, here another layout's.
const jsErrCodeSubjectOverlap jetstream.ErrorCode = 10065

func translateCreate(err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeSubjectOverlap {
		return fmt.Errorf("%w: %w", errLayoutRace, err)
	}
	return err
}

// provisionRequests makes sure every partition of the request log exists,
// creating it (with cfg.RequestPartitions, 1 if 0) when there is none, and
// returns its layout; created says whether it created a partition.
func provisionRequests(ctx context.Context, js jetstream.JetStream, cfg Config) (Partitions, bool, error) {
	want := Partitions(cfg.RequestPartitions)
	for range 3 {
		have, err := discover(ctx, js)
		switch {
		case err == nil:
			if want != 0 && want != have {
				return 0, false, &PartitionsMismatchError{Want: want, Have: have}
			}
		case errors.Is(err, ErrNotProvisioned):
			have = Partitions(want.n())
		default:
			return 0, false, err
		}
		created, err := ensurePartitions(ctx, js, cfg, have)
		if !errors.Is(err, errLayoutRace) {
			return have, created, err
		}
		// Another component created another layout first: look again.
	}
	return 0, false, fmt.Errorf("streams: create the request log: %w", errLayoutRace)
}

// ensurePartitions creates the missing partitions of layout p, partition 0
// first (the one Discover reads). An existing partition of another layout is
// errLayoutRace.
func ensurePartitions(ctx context.Context, js jetstream.JetStream, cfg Config, p Partitions) (created bool, err error) {
	for k := range p.n() {
		have, err := ensureStream(ctx, js, cfg.RequestsConfig(p, k))
		if err != nil {
			return created, err
		}
		if have == nil {
			created = true
			continue
		}
		if n := have.Metadata[metaPartitions]; n != strconv.Itoa(p.n()) && (n != "" || p.n() != 1) {
			return created, fmt.Errorf("%w: %s has %s partitions", errLayoutRace, have.Name, n)
		}
	}
	return created, nil
}

// Partition returns k when stream is partition k's stream.
func (p Partitions) Partition(stream string) (k int, ok bool) {
	for k := range p.n() {
		if p.Stream(k) == stream {
			return k, true
		}
	}
	return 0, false
}
