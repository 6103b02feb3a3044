package streams

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The ends place (docs/internals.md, "Terminal facts always fit"): a
// request log at its byte limit refuses every message, whatever its type,
// so a request whose deltas filled it could not store its end there, and
// stayed in flight to every reader for good. Its owner stores such an end
// (events.RequestEnded) in a stream of its own, BATON_ENDS, which token
// deltas never fill: only frontends write it, one message per request at
// most, and it discards its oldest when full rather than refusing.

// EndsStream is the stream of the ends place.
const EndsStream = "BATON_ENDS"

const (
	endsPrefix     = "baton.ends."
	liveEndsPrefix = "baton.live.ends."
)

// EndsLive matches the republished copies of the ends place's messages
// (baton.live.ends.<slot>.<id>): a frontend's followers of a request read
// the log again when its end is stored there.
func EndsLive() string { return liveEndsPrefix + ">" }

// RequestIDOfEnd is the request id of a stored or republished ends place
// subject; ok is false for any other subject.
func RequestIDOfEnd(subj string) (id string, ok bool) {
	rest, ok := strings.CutPrefix(subj, endsPrefix)
	if !ok {
		if rest, ok = strings.CutPrefix(subj, liveEndsPrefix); !ok {
			return "", false
		}
	}
	slot, id, ok := strings.Cut(rest, ".")
	if !ok || !ValidID(id) || slot != strconv.Itoa(Slot(id)) {
		return "", false
	}
	return id, true
}

// Limits of BATON_ENDS. An end is a few hundred bytes and a request has one
// at most, removed when its request is evicted: 64 MiB holds the ends of
// some 100,000 requests, and when full the stream drops its oldest
// (DiscardOld), so an end always fits.
const EndsMaxBytes = 64 << 20

// RequestEnd is the subject of request id's end in the ends place:
// baton.ends.<slot>.<id>.
func RequestEnd(id string) string { return endsPrefix + strconv.Itoa(Slot(id)) + "." + id }

// IsEndSubject reports whether subj is a subject of the ends place.
func IsEndSubject(subj string) bool { return strings.HasPrefix(subj, endsPrefix) }

// EndsConfig is the definition of BATON_ENDS: the request log's replicas,
// storage, age and message size; a limit of its own (EndsMaxBytes) with
// DiscardOld; one message per subject.
func (c Config) EndsConfig() jetstream.StreamConfig {
	c = c.withDefaults()
	return jetstream.StreamConfig{
		Name:              EndsStream,
		Description:       "baton ends: the ends of requests that the request log could not store (or not as their last word), one per request",
		Subjects:          []string{endsPrefix + ">"},
		Storage:           c.storage(),
		Replicas:          c.Replicas,
		MaxAge:            c.RequestsMaxAge,
		MaxBytes:          EndsMaxBytes,
		Discard:           jetstream.DiscardOld,
		MaxMsgsPerSubject: 1,
		MaxMsgSize:        c.MaxMsgSize,
		Duplicates:        2 * time.Minute,
		AllowDirect:       true,
		RePublish:         &jetstream.RePublish{Source: endsPrefix + ">", Destination: liveEndsPrefix + ">"},
	}
}

// StoreEnd stores ev, the end of a request its owner ended, in the ends
// place, under event id evid (so a retry is deduplicated), unless an end
// of the same request is stored there already: the first end stands (one
// writer per decision), except one older than the request (Through below
// acceptedSeq, the sequence of the request's accepted event), left by an
// earlier request of the same id, which it replaces. It reports whether ev
// (or its earlier try) is the end stored; transient failures are retried
// as Append retries them.
func StoreEnd(ctx context.Context, log *Log, evid string, ev events.RequestEnded, acceptedSeq uint64) (bool, error) {
	subj := RequestEnd(ev.RequestID)
	env := log.Envelope(evid, ev.RequestID, ev)
	expect := int64(0)
	for range 3 {
		_, err := log.Append(ctx, subj, env, expect)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, ErrConflict) {
			return false, err
		}
		have, seq, rerr := readEnd(ctx, log.JetStream(), ev.RequestID)
		switch {
		case rerr != nil:
			return false, rerr
		case have == nil:
			expect = 0 // removed meanwhile
		case have.ID == evid:
			return true, nil // an earlier try, stored after the dedup window
		case have.Event.(events.RequestEnded).Through < acceptedSeq:
			expect = int64(seq) // an earlier request's: replace it
		default:
			return false, nil
		}
	}
	return false, nil
}

// ReadEnd returns the end of request id stored in the ends place (an
// events.RequestEnded), or nil when there is none or the ends place does
// not exist (a log provisioned by a release before it). It asks the
// stream's leader. The envelope's Seq is 0: its sequence is the ends
// place's, which no reader of the request log may compare with its own.
func ReadEnd(ctx context.Context, js jetstream.JetStream, id string) (*events.Envelope, error) {
	e, _, err := readEnd(ctx, js, id)
	return e, err
}

func readEnd(ctx context.Context, js jetstream.JetStream, id string) (*events.Envelope, uint64, error) {
	subj := RequestEnd(id)
	m, err := leaderGet(ctx, js, EndsStream, subj, 0, true)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) || strings.Contains(err.Error(), "stream not found") {
			return nil, 0, nil
		}
		return nil, 0, fmt.Errorf("read the end of %s: %w", id, err)
	}
	if m == nil {
		return nil, 0, nil
	}
	e, err := events.Unmarshal(events.Header(m.Header), m.Data)
	if err != nil {
		return nil, 0, nil // not an end this build reads: as if none
	}
	ended, ok := e.Event.(events.RequestEnded)
	if !ok || ended.RequestID != id {
		return nil, 0, nil
	}
	e.Stored, e.Header = m.Subject, events.Header(m.Header)
	return &e, m.Sequence, nil
}

// PurgeEnd removes request id's end from the ends place (eviction, after
// the request's own subjects). It is idempotent; a log without an ends
// place has nothing to purge.
func PurgeEnd(ctx context.Context, js jetstream.JetStream, id string) error {
	_, err := purge(ctx, js, EndsStream, RequestEnd(id))
	if err != nil && strings.Contains(err.Error(), "stream not found") {
		return nil
	}
	return err
}

// EndsLastSeq is the ends place's last sequence (0 when it is empty or does
// not exist): what changed there since the last look.
func EndsLastSeq(ctx context.Context, js jetstream.JetStream) (uint64, error) {
	u, err := ReadUsage(ctx, js, EndsStream)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return 0, nil
		}
		return 0, err
	}
	return u.LastSeq, nil
}
