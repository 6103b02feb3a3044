package streams

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// DefaultTimeout bounds a network call whose ctx has no deadline.
const DefaultTimeout = 5 * time.Second

// Errors translated at the package edge.
var (
	// ErrRevisionMismatch means a write that expected a subject's (or a KV
	// key's) last sequence found another there: someone else wrote first.
	ErrRevisionMismatch = errors.New("streams: revision mismatch")
	// ErrConflict is ErrRevisionMismatch on an append: another frontend
	// decided first.
	ErrConflict = ErrRevisionMismatch
	// ErrNotFound means the request has no events in the log (never existed,
	// or its retention expired).
	ErrNotFound = errors.New("streams: not found")
	// ErrStreamFull means the stream refused a write because a limit is reached.
	ErrStreamFull = errors.New("streams: stream full")
)

// NewMsg builds the NATS message of an event on subject.
func NewMsg(subject string, e events.Envelope) (*nats.Msg, error) {
	h, data, err := events.Marshal(e)
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: subject, Header: nats.Header(h), Data: data}, nil
}

// Decode reads an event from a stored message, a direct-get reply or a
// republished copy, filling in Seq and LastSeq from JetStream headers when present.
func Decode(m *nats.Msg) (events.Envelope, error) {
	e, err := events.Unmarshal(events.Header(m.Header), m.Data)
	e.Stored, e.Header = StoredSubject(m.Subject), events.Header(m.Header)
	if h := m.Header; h != nil {
		if v := h.Get(jetstream.SequenceHeader); v != "" {
			e.Seq, _ = strconv.ParseUint(v, 10, 64)
		}
		if v := h.Get("Nats-Last-Sequence"); v != "" {
			e.LastSeq, _ = strconv.ParseUint(v, 10, 64)
		}
	}
	return e, err
}

// DecodeRaw reads an event from a message fetched with (batch) direct get.
func DecodeRaw(m *jetstream.RawStreamMsg) (events.Envelope, error) {
	e, err := events.Unmarshal(events.Header(m.Header), m.Data)
	e.Seq = m.Sequence
	e.Stored, e.Header = m.Subject, events.Header(m.Header)
	return e, err
}

// Log appends events to baton's streams. It is safe for concurrent use.
type Log struct {
	js     jetstream.JetStream
	source string
	parts  Partitions // the request log's layout (SetPartitions); one stream by default
	async  asyncAppends
}

// NewLog returns a Log whose events name source as their producer
// (e.g. "baton/frontend/fe-1").
func NewLog(js jetstream.JetStream, source string) *Log {
	return &Log{js: js, source: source}
}

// JetStream returns the underlying JetStream context.
func (l *Log) JetStream() jetstream.JetStream { return l.js }

// Source returns the producer name stamped on events.
func (l *Log) Source() string { return l.source }

// Envelope wraps ev with this log's source, the given id and subject, and now.
func (l *Log) Envelope(id, subject string, ev events.Event) events.Envelope {
	return events.Envelope{ID: id, Source: l.source, Subject: subject, Time: time.Now(), Event: ev}
}

// Retry bounds of Append. A stream-leader election in a 3-node cluster after
// the leader is killed takes about 5-7 s; AppendBudget rides it out with room.
const (
	// AppendBudget is how long Append keeps retrying a transient failure
	// (no responders, no ack, no leader) when ctx allows that long.
	AppendBudget = 20 * time.Second
	// appendTryTimeout bounds one try: an append sent to a leader that died
	// never gets an answer.
	appendTryTimeout = 2 * time.Second
	appendBackoffMin = 50 * time.Millisecond
	appendBackoffMax = time.Second
)

// Append stores e on subject and waits for the acknowledgement. With
// expectLast >= 0 the append succeeds only if the subject's last sequence is
// expectLast (0: the subject is empty); otherwise it returns ErrConflict.
//
// A transient failure (no server answers for the stream, no acknowledgement,
// no stream leader or the cluster is unavailable, the connection is
// reconnecting) is retried with backoff for up to AppendBudget, or until ctx
// ends if sooner (a ctx without a deadline gets AppendBudget). Every try sends
// the same message, whose Nats-Msg-Id is the event id, so JetStream stores
// it at most once: a try that was stored but whose ack was lost comes back
// as a duplicate with the original sequence, and an expected-sequence
// append that already landed is not mistaken for a conflict.
func (l *Log) Append(ctx context.Context, subject string, e events.Envelope, expectLast int64) (uint64, error) {
	m, err := NewMsg(subject, e)
	if err != nil {
		return 0, err
	}
	return l.AppendMsg(ctx, m, expectLast)
}

// AppendMsg is Append of a message already encoded (events.Marshal or an
// events.DeltaEncoder), with the same retries and the same guarantees.
func (l *Log) AppendMsg(ctx context.Context, m *nats.Msg, expectLast int64) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, AppendBudget)
	defer cancel()
	var opts []jetstream.PublishOpt
	if expectLast >= 0 {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(uint64(expectLast)))
	}
	typ := m.Header.Get(events.HeaderType)
	backoff := appendBackoffMin
	for try := 1; ; try++ {
		tctx, tcancel := context.WithTimeout(ctx, appendTryTimeout)
		ack, err := l.js.PublishMsg(tctx, m, opts...)
		tcancel()
		if err == nil {
			return ack.Sequence, nil
		}
		if try > 1 && expectLast >= 0 && errors.Is(translate(err), ErrRevisionMismatch) {
			// The server checks the expected sequence before it deduplicates:
			// an earlier try that was stored but whose ack was lost makes
			// this one a conflict with itself.
			if seq, ok := l.storedAlready(ctx, m); ok {
				return seq, nil
			}
		}
		if !Transient(err) || ctx.Err() != nil {
			return 0, fmt.Errorf("append %s to %s (%d tries): %w", typ, m.Subject, try, translate(err))
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return 0, fmt.Errorf("append %s to %s (%d tries): %w", typ, m.Subject, try, translate(err))
		}
		backoff = min(2*backoff, appendBackoffMax)
	}
}

// SetPartitions tells the log the request log's layout (Provision's
// answer), before its first append: a retried expected-sequence append then
// looks for its first try in the request's own stream, by name, with no
// STREAM.NAMES lookup (which the least-privilege sets do not grant).
func (l *Log) SetPartitions(p Partitions) { l.parts = p }

// storedAlready reports whether the last message on m's subject is m
// itself (the same Nats-Msg-Id), and its sequence. Only request subjects
// are appended with an expected sequence.
func (l *Log) storedAlready(ctx context.Context, m *nats.Msg) (uint64, bool) {
	id := m.Header.Get(jetstream.MsgIDHeader)
	if id == "" {
		return 0, false
	}
	subj, err := ParseRequestSubject(m.Subject)
	if err != nil {
		return 0, false
	}
	s, err := l.js.Stream(ctx, l.parts.StreamOf(subj.ID))
	if err != nil {
		return 0, false
	}
	last, err := s.GetLastMsgForSubject(ctx, m.Subject)
	if err != nil || last.Header.Get(jetstream.MsgIDHeader) != id {
		return 0, false
	}
	return last.Sequence, true
}

// JetStream API error codes of a cluster in transition (nats-server
// JSClusterNotAvailErr, JSClusterNotLeaderErr, JSStreamOfflineErr).
const (
	jsErrCodeClusterNotAvail  jetstream.ErrorCode = 10008
	jsErrCodeClusterNotLeader jetstream.ErrorCode = 10009
	jsErrCodeStreamOffline    jetstream.ErrorCode = 10118
)

// Transient reports whether err is a failure that a retry of the same
// operation may not see: no server answered for the stream (its leader is
// being elected, or the connection moves to another node), the answer did
// not come in time, or the cluster said it is not ready.
func Transient(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jsErrCodeClusterNotAvail, jsErrCodeClusterNotLeader, jsErrCodeStreamOffline:
			return true
		}
		return false
	}
	return errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, jetstream.ErrAsyncPublishTimeout) ||
		errors.Is(err, jetstream.ErrTooManyStalledMsgs) ||
		errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrDisconnected)
}

// jsErrCodeStoreFailed is the server's JSStreamStoreFailedF: a publish the
// stream refused to store, with the store's error as the description.
const jsErrCodeStoreFailed jetstream.ErrorCode = 10077

// streamLimits are the store errors of a DiscardNew stream at a limit
// (nats-server ErrMaxMsgs, ErrMaxBytes, ErrMaxMsgsPerSubject).
var streamLimits = map[string]bool{
	"maximum messages exceeded":             true,
	"maximum bytes exceeded":                true,
	"maximum messages per subject exceeded": true,
}

// Translate maps a JetStream error to this package's sentinels (wrapping
// it): ErrRevisionMismatch, ErrStreamFull. Others are returned as they are.
func Translate(err error) error { return translate(err) }

func translate(err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
			return fmt.Errorf("%w: %w", ErrRevisionMismatch, err)
		case jsErrCodeStoreFailed:
			// The server reports every refused store with this code; only the
			// limits (not an oversized message or a storage fault) mean full.
			if streamLimits[apiErr.Description] {
				return fmt.Errorf("%w: %w", ErrStreamFull, err)
			}
		}
	}
	return err
}

// readable is what a reader of the log yields for a decoded message: the
// event, or an events.Unreadable (a type this build does not know, data that
// does not decode) so that the reader steps over it knowingly, with its
// sequence; ok is false only for a message that is not a baton event.
func readable(e events.Envelope, err error) (events.Envelope, bool) {
	if err == nil {
		return e, true
	}
	_, ok := e.Event.(events.Unreadable)
	return e, ok
}

// batchSize and batchBytes bound one batch direct get of a read. Without
// the byte bound, a request whose subject holds large messages (a
// quarantined worker's 1 MiB junk on its own attempt) came back as one
// answer of hundreds of MiB: the server disconnected the reader as a slow
// consumer, its reconnect read the request again, and so on for as long as
// the junk stayed.
const (
	batchSize  = 1000
	batchBytes = 8 << 20
)

// ReadRequest yields the stored events of request id in stream order, starting
// at stream sequence from (1 for the whole history), using batch direct get: no
// consumer is created. p is the request log's layout (Provision, Discover):
// the request is read from its partition, p.StreamOf(id). Messages that are
// not baton events are skipped; an event this build cannot read (an unknown
// type, a newer version, data that does not decode) is yielded as an
// events.Unreadable, which folds step over with its reason. It returns
// ErrNotFound (as the iterator's error) when nothing is stored at or after
// from.
//
// The request's end in the ends place (ReadEnd), if any, is yielded in its
// position: after the stored events up to its Through and before any later
// one (with Seq 0: its sequence is not the request log's). It is not
// yielded for a request of which the log holds nothing (from 1).
func ReadRequest(ctx context.Context, js jetstream.JetStream, p Partitions, id string, from uint64) iter.Seq2[events.Envelope, error] {
	return ReadRequestPast(ctx, js, p, id, from, nil)
}

// ReadRequestPast is ReadRequest that also sets *past to the last stream
// sequence it read, a message that is no baton event included (a worker's
// junk on the request's subjects, skipped). A reader that reads again from
// *past + 1 does not read what it skipped twice: formerly each catch-up of
// a request whose attempt subject held 1 MiB junk read all of it again
// from the last event it had applied, timed out, and applied nothing.
func ReadRequestPast(ctx context.Context, js jetstream.JetStream, p Partitions, id string, from uint64, past *uint64) iter.Seq2[events.Envelope, error] {
	stored := readSubject(ctx, js, p.StreamOf(id), RequestAll(id), from, past)
	return func(yield func(events.Envelope, error) bool) {
		end, _ := ReadEnd(ctx, js, id) // an ends place that does not answer: the log's word stands
		var through uint64
		if end != nil {
			through = end.Event.(events.RequestEnded).Through
		}
		yieldEnd := func() bool {
			e := *end
			end = nil
			return yield(e, nil)
		}
		any := false
		for e, err := range stored {
			if errors.Is(err, ErrNotFound) && end != nil && from > 1 {
				yieldEnd()
				return
			}
			if err == nil && end != nil && e.Seq > through && !yieldEnd() {
				return
			}
			if !yield(e, err) || err != nil {
				return
			}
			any = true
		}
		if end != nil && any {
			yieldEnd()
		}
	}
}

func readSubject(ctx context.Context, js jetstream.JetStream, stream, subject string, from uint64, past *uint64) iter.Seq2[events.Envelope, error] {
	if past == nil {
		past = new(uint64)
	}
	return func(yield func(events.Envelope, error) bool) {
		if from == 0 {
			from = 1
		}
		any := false
		for {
			msgs, err := jetstreamext.GetBatch(ctx, js, stream, batchSize,
				jetstreamext.GetBatchSubject(subject), jetstreamext.GetBatchSeq(from), jetstreamext.GetBatchMaxBytes(batchBytes))
			if err != nil {
				yield(events.Envelope{}, fmt.Errorf("read %s: %w", subject, err))
				return
			}
			n, pending := 0, ""
			for m, err := range msgs {
				if errors.Is(err, jetstreamext.ErrNoMessages) {
					break
				}
				if err != nil {
					yield(events.Envelope{}, fmt.Errorf("read %s: %w", subject, err))
					return
				}
				n++
				any = true
				from, *past = m.Sequence+1, m.Sequence
				pending = m.Header.Get("Nats-Num-Pending")
				e, ok := readable(DecodeRaw(m))
				if !ok {
					continue // not a baton event
				}
				if !yield(e, nil) {
					return
				}
			}
			// The server may cut a batch short (max bytes); only an empty batch
			// or nothing pending past the last message ends the read.
			if n == 0 || pending == "0" {
				if read, ok := readBehind(ctx, js, stream, subject, from, past, yield); !ok {
					return
				} else if read {
					any = true
				}
				if !any {
					yield(events.Envelope{}, ErrNotFound)
				}
				return
			}
		}
	}
}

// readBehind reads what is stored on subject from sequence from on that
// the replica which answered the direct gets had not returned: appended
// since (a request in flight), or not yet applied there (see leader.go).
// It asks the stream's leader for the subject's last message, then reads
// up to it with one more batched direct get (the leader itself, or a
// replica that has caught up, answers it at once), and what that still
// lacks from the leader a message at a time. read says whether it yielded
// anything; ok is false when the reader stopped or an error was yielded.
func readBehind(ctx context.Context, js jetstream.JetStream, stream, subject string, from uint64, past *uint64,
	yield func(events.Envelope, error) bool) (read, ok bool) {
	last, err := leaderGet(ctx, js, stream, subject, 0, true)
	if err != nil {
		// No leader to ask (an election) or no answer in time: the replica's
		// answer stands, as it would without this check. A reader that missed
		// something still learns of it from the next live message's gap.
		return false, true
	}
	if last == nil || from > last.Sequence {
		return false, true
	}
	// Formerly every message appended during the read cost a question to
	// the leader: a takeover's catch-up of a fast stream, on a loaded
	// server, ran out of its 5 s that way (TestRollingRestartOfFrontends).
	if msgs, err := jetstreamext.GetBatch(ctx, js, stream, batchSize, jetstreamext.GetBatchSubject(subject),
		jetstreamext.GetBatchSeq(from), jetstreamext.GetBatchMaxBytes(batchBytes)); err == nil {
		for m, err := range msgs {
			if err != nil {
				break // the leader's answers below stand for it
			}
			read, from, *past = true, m.Sequence+1, m.Sequence
			if e, isEvent := readable(DecodeRaw(m)); isEvent && !yield(e, nil) {
				return read, false
			}
		}
	}
	for from <= last.Sequence {
		m, err := leaderGet(ctx, js, stream, subject, from, false)
		if err != nil {
			// As above: what was read stands, a prefix of the subject in
			// order, and the rest comes as it would have without this check.
			// A leader slow to answer one question (a loaded server) is no
			// reason to fail a read the replica answered.
			if ctx.Err() != nil {
				yield(events.Envelope{}, fmt.Errorf("read %s: %w", subject, err))
				return read, false
			}
			return read, true
		}
		if m == nil {
			break
		}
		read, from, *past = true, m.Sequence+1, m.Sequence
		e, ok := readable(DecodeRaw(m))
		if !ok {
			continue // not a baton event
		}
		if !yield(e, nil) {
			return read, false
		}
	}
	return read, true
}
