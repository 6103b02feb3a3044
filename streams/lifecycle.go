package streams

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A request's events have a lifecycle (docs/internals.md, "The log's
// lifecycle"): hot while it runs (every delta), compact once it is finished
// (one record on its events subject, its tokens subjects purged), evicted
// oldest first when the log needs room (every subject purged). These are
// the log operations of that lifecycle; the decisions are the frontend's.

// PurgeSubjectsThrough removes the messages up to stream sequence through
// from each of subjects, tokens subjects of request id (compaction: the
// messages the compact record covers, so that what was stored after them
// stays). It is idempotent, and retried through a leader election.
//
// One purge a literal subject, not one of the request's tokens.> wildcard:
// the file store finds what to purge by reading every message stored
// between a subject's first and last in each block, the other requests'
// interleaved with it, and matches a wildcard against each by splitting
// its subject into tokens; with a literal subject each is one string
// comparison. At 1,000 streams × 50 tokens/s the wildcard purges were
// half of the NATS server's CPU (BENCHMARKS.md).
func PurgeSubjectsThrough(ctx context.Context, js jetstream.JetStream, p Partitions, id string, subjects []string, through uint64) (uint64, error) {
	var n uint64
	for _, subj := range subjects {
		if rs, err := ParseRequestSubject(subj); err != nil || rs.ID != id || rs.Kind != "tokens" {
			return n, fmt.Errorf("purge %s: %q is not one of its tokens subjects", id, subj)
		}
		k, err := purgeBefore(ctx, js, p.StreamOf(id), subj, through+1)
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// Evict removes every event of request id from the log. It is idempotent,
// and retried through a leader election.
func Evict(ctx context.Context, js jetstream.JetStream, p Partitions, id string) (uint64, error) {
	return purge(ctx, js, p.StreamOf(id), RequestAll(id))
}

// apiAnswer is what every JetStream API answer carries: its error, if any.
type apiAnswer struct {
	Error *jetstream.APIError `json:"error,omitempty"`
}

// purgeResponse is the answer to $JS.API.STREAM.PURGE.
type purgeResponse struct {
	apiAnswer
	Success bool   `json:"success"`
	Purged  uint64 `json:"purged"`
}

// purge removes subject's messages from stream with the stream purge API
// and a subject filter: one request, no stream info looked up first.
func purge(ctx context.Context, js jetstream.JetStream, stream, subject string) (uint64, error) {
	return purgeBefore(ctx, js, stream, subject, 0)
}

// purgeBefore is purge of the messages below stream sequence before only
// (0: all of them).
func purgeBefore(ctx context.Context, js jetstream.JetStream, stream, subject string, before uint64) (uint64, error) {
	req := map[string]any{"filter": subject}
	if before > 0 {
		req["seq"] = before
	}
	body, err := json.Marshal(req)
	if err != nil {
		return 0, err
	}
	var purged uint64
	err = Retry(ctx, func(ctx context.Context) error {
		m, err := js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.PURGE."+stream, body)
		if err != nil {
			return err
		}
		var resp purgeResponse
		if err := json.Unmarshal(m.Data, &resp); err != nil {
			return err
		}
		if resp.Error != nil {
			return resp.Error
		}
		purged = resp.Purged
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("purge %s from %s: %w", subject, stream, err)
	}
	return purged, nil
}

// Usage is how full one request stream is.
type Usage struct {
	Stream   string
	Bytes    uint64 // stored
	MaxBytes int64  // its limit (≤ 0: none)
	Msgs     uint64
	FirstSeq uint64
	LastSeq  uint64
}

// Ratio is Bytes over MaxBytes, 0 when the stream has no byte limit.
func (u Usage) Ratio() float64 {
	if u.MaxBytes <= 0 {
		return 0
	}
	return float64(u.Bytes) / float64(u.MaxBytes)
}

// ReadUsage reads how full stream is (one stream info request).
func ReadUsage(ctx context.Context, js jetstream.JetStream, stream string) (Usage, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return Usage{}, fmt.Errorf("usage of %s: %w", stream, err)
	}
	info := s.CachedInfo()
	return Usage{Stream: stream, Bytes: info.State.Bytes, MaxBytes: info.Config.MaxBytes, Msgs: info.State.Msgs,
		FirstSeq: info.State.FirstSeq, LastSeq: info.State.LastSeq}, nil
}

// Stored is the first message of a stream at or after a sequence, as
// NextStored finds it: its subject, its sequence, and the request it
// belongs to ("" when the subject is not a well-formed request subject,
// such as one with the wrong slot, which no reader folds).
type Stored struct {
	Subject   string
	Seq       uint64
	RequestID string
}

// NextStored returns the first message of stream at or after seq; ok is
// false when there is none. It asks the stream's leader, which holds what
// every replica will.
func NextStored(ctx context.Context, js jetstream.JetStream, stream string, seq uint64) (Stored, bool, error) {
	return nextStored(ctx, js, stream, requestsPrefix+">", seq)
}

// NextStoredEvents is NextStored of the requests' events subjects only: a
// request's first message there is its accepted decision, and a finished
// one keeps its record there, so the oldest requests are found without
// stepping over every delta of the requests in flight.
func NextStoredEvents(ctx context.Context, js jetstream.JetStream, stream string, seq uint64) (Stored, bool, error) {
	return nextStored(ctx, js, stream, requestsPrefix+"*.*.events", seq)
}

func nextStored(ctx context.Context, js jetstream.JetStream, stream, filter string, seq uint64) (Stored, bool, error) {
	m, err := leaderGet(ctx, js, stream, filter, seq, false)
	if err != nil || m == nil {
		return Stored{}, false, err
	}
	st := Stored{Subject: m.Subject, Seq: m.Sequence}
	if s, perr := ParseRequestSubject(m.Subject); perr == nil {
		st.RequestID = s.ID
	}
	return st, true, nil
}

// PurgeSubject removes what one subject of stream holds (a subject no
// reader folds, say). It is idempotent.
func PurgeSubject(ctx context.Context, js jetstream.JetStream, stream, subject string) (uint64, error) {
	return purge(ctx, js, stream, subject)
}

func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, DefaultTimeout)
}

// NextOfWorker returns the first message stream holds on worker's tokens
// subjects (WorkerTokens), of any request, at or after seq: what the worker
// wrote first since then. ok is false when it wrote nothing there since. It
// asks the stream's leader. The server finds it by reading the stream from
// seq on until a message matches, so a recent seq makes it cheap: a
// worker's last message (last_by_subj of the same filter) is found by
// matching every request's subjects instead, tens of milliseconds at 100,000
// of them with the stream's writes held meanwhile.
func NextOfWorker(ctx context.Context, js jetstream.JetStream, stream, worker string, seq uint64) (m *jetstream.RawStreamMsg, ok bool, err error) {
	m, err = leaderGet(ctx, js, stream, WorkerTokens(worker), seq, false)
	return m, m != nil, err
}

// NextOfWorkerBare is NextOfWorker without the message's headers: its
// subject, sequence and data, a fraction of a delta's bytes (nats-server
// 2.11 and later; an earlier one sends the headers too).
func NextOfWorkerBare(ctx context.Context, js jetstream.JetStream, stream, worker string, seq uint64) (m *jetstream.RawStreamMsg, ok bool, err error) {
	m, err = leaderAsk(ctx, js, stream, WorkerTokens(worker), map[string]any{"next_by_subj": WorkerTokens(worker), "seq": seq, "no_hdr": true})
	return m, m != nil, err
}

// NextTokensBare returns the first message stream holds on any worker's
// tokens subjects at or after seq, without its headers (ok false: none):
// whose it is, the subject says (ParseRequestSubject's Worker), whether or
// not that worker holds a lease. It asks the stream's leader.
func NextTokensBare(ctx context.Context, js jetstream.JetStream, stream string, seq uint64) (m *jetstream.RawStreamMsg, ok bool, err error) {
	filter := WorkerTokens("*")
	m, err = leaderAsk(ctx, js, stream, filter, map[string]any{"next_by_subj": filter, "seq": seq, "no_hdr": true})
	return m, m != nil, err
}

// NextOnSubjectBare is NextOnSubject without the message's headers.
func NextOnSubjectBare(ctx context.Context, js jetstream.JetStream, stream, subject string, seq uint64) (*jetstream.RawStreamMsg, error) {
	return leaderAsk(ctx, js, stream, subject, map[string]any{"next_by_subj": subject, "seq": seq, "no_hdr": true})
}

// DeleteMsg removes the message at seq from stream (its place kept: a
// reader that asks for it finds it gone), for a message no reader folds.
// Deleting one already gone is not an error.
func DeleteMsg(ctx context.Context, js jetstream.JetStream, stream string, seq uint64) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	body, err := json.Marshal(map[string]any{"seq": seq, "no_erase": true})
	if err != nil {
		return err
	}
	m, err := js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.DELETE."+stream, body)
	if err != nil {
		return fmt.Errorf("delete %d of %s: %w", seq, stream, err)
	}
	var resp apiAnswer
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return fmt.Errorf("delete %d of %s: %w", seq, stream, err)
	}
	if resp.Error != nil && resp.Error.ErrorCode != jetstream.JSErrCodeMessageNotFound && resp.Error.ErrorCode != msgDeleteFailed {
		return fmt.Errorf("delete %d of %s: %s", seq, stream, resp.Error.Description)
	}
	return nil
}

// msgDeleteFailed is the server's answer to a delete of a message already
// gone (JSStreamMsgDeleteFailedF).
const msgDeleteFailed jetstream.ErrorCode = 10057

// MsgAt returns the message at seq of stream (nil when there is none),
// from the stream's leader.
func MsgAt(ctx context.Context, js jetstream.JetStream, stream string, seq uint64) (*jetstream.RawStreamMsg, error) {
	return leaderAsk(ctx, js, stream, fmt.Sprintf("sequence %d", seq), map[string]any{"seq": seq})
}

// WorkerSubjects lists worker's tokens subjects in stream with the number
// of messages each holds (one stream info request, paged by the client).
func WorkerSubjects(ctx context.Context, js jetstream.JetStream, stream, worker string) (map[string]uint64, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("subjects of %s in %s: %w", worker, stream, err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(WorkerTokens(worker)))
	if err != nil {
		return nil, fmt.Errorf("subjects of %s in %s: %w", worker, stream, err)
	}
	return info.State.Subjects, nil
}

// PurgeWorker removes everything stream holds on worker's tokens subjects,
// of every request, with one purge request. Only for a worker none of whose
// output any reader still needs (a quarantined one, once its requests are
// over).
func PurgeWorker(ctx context.Context, js jetstream.JetStream, stream, worker string) (uint64, error) {
	return purge(ctx, js, stream, WorkerTokens(worker))
}

// NextOnSubject returns the first message of stream on subject at or after
// seq (nil when there is none), from the stream's leader.
func NextOnSubject(ctx context.Context, js jetstream.JetStream, stream, subject string, seq uint64) (*jetstream.RawStreamMsg, error) {
	return leaderGet(ctx, js, stream, subject, seq, false)
}

// LastOnSubject returns the last message of stream on subject (nil when
// there is none), from the stream's leader: a replica's direct get may not
// hold yet what was just stored, and a decision to purge must not rest on
// that.
func LastOnSubject(ctx context.Context, js jetstream.JetStream, stream, subject string) (*jetstream.RawStreamMsg, error) {
	return leaderGet(ctx, js, stream, subject, 0, true)
}

// NextStoredEventsBatch is NextStoredEvents of up to n messages at once,
// in stream order (one direct get of a batch: nats-server 2.11 and later;
// a replica answers, so it may lag the leader by what was just stored). It
// returns fewer when the stream holds fewer, or when maxBytes of theirs
// were sent.
func NextStoredEventsBatch(ctx context.Context, js jetstream.JetStream, stream string, seq uint64, n, maxBytes int) ([]Stored, error) {
	var out []Stored
	_, err := directBatch(ctx, js, stream, map[string]any{"seq": seq, "next_by_subj": requestsPrefix + "*.*.events", "batch": n, "max_bytes": maxBytes},
		fmt.Sprintf("batch of %s from %d", stream, seq), func(m *nats.Msg) error {
			subject := m.Header.Get("Nats-Subject")
			s, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
			if err != nil || subject == "" {
				return errors.New("a message without its subject or sequence")
			}
			st := Stored{Subject: subject, Seq: s}
			if rs, perr := ParseRequestSubject(subject); perr == nil {
				st.RequestID = rs.ID
			}
			out = append(out, st)
			return nil
		})
	return out, err
}

// directBatch sends one batched direct get of stream (req, its request)
// and calls each with every message of the answer, in order, until the
// answer's end, whose header it returns (nil: nothing there, 404). about
// names the question in errors.
func directBatch(ctx context.Context, js jetstream.JetStream, stream string, req map[string]any, about string, each func(*nats.Msg) error) (nats.Header, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	nc := js.Conn()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+stream, inbox, body); err != nil {
		return nil, err
	}
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", about, err)
		}
		switch status := m.Header.Get("Status"); status {
		case "":
		case "204": // the end of the answer
			return m.Header, nil
		case "404": // nothing there
			return nil, nil
		default:
			return nil, fmt.Errorf("%s: status %s %s", about, status, m.Header.Get("Description"))
		}
		if err := each(m); err != nil {
			return nil, fmt.Errorf("%s: %w", about, err)
		}
	}
}

// LastOfEach returns the last message stream holds on each of subjects
// that has one (by subject; headers kept, data dropped unless keepData),
// in batched direct gets of up to LastOfEachBatch subjects (multi_last:
// nats-server 2.11 and later; a replica answers, so it may lag the leader
// by what was just stored). complete is false when an answer was cut short
// (past maxBytes): a subject missing from the map then may still hold
// messages. Asking one by one (LastOnSubject) costs a round trip a
// subject: a quarantined worker's sweep asks about thousands.
func LastOfEach(ctx context.Context, js jetstream.JetStream, stream string, subjects []string, maxBytes int, keepData bool) (map[string]*jetstream.RawStreamMsg, bool, error) {
	out := map[string]*jetstream.RawStreamMsg{}
	complete := true
	for len(subjects) > 0 {
		n := min(len(subjects), LastOfEachBatch)
		full, err := lastOfEach(ctx, js, stream, subjects[:n], maxBytes, keepData, out)
		if err != nil {
			return out, false, err
		}
		complete = complete && full
		subjects = subjects[n:]
	}
	return out, complete, nil
}

// LastOfEachBatch is how many subjects one multi_last direct get asks
// about (the server answers at most 1,024 messages a request).
const LastOfEachBatch = 1024

func lastOfEach(ctx context.Context, js jetstream.JetStream, stream string, subjects []string, maxBytes int, keepData bool, out map[string]*jetstream.RawStreamMsg) (complete bool, err error) {
	got := 0
	end, err := directBatch(ctx, js, stream, map[string]any{"multi_last": subjects, "batch": len(subjects), "max_bytes": maxBytes},
		fmt.Sprintf("last of %d subjects of %s", len(subjects), stream), func(m *nats.Msg) error {
			subject := m.Header.Get("Nats-Subject")
			seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
			if err != nil || subject == "" {
				return errors.New("a message without its subject or sequence")
			}
			raw := &jetstream.RawStreamMsg{Subject: subject, Sequence: seq, Header: m.Header}
			if keepData {
				raw.Data = m.Data
			}
			out[subject] = raw
			got++
			return nil
		})
	if err != nil {
		return false, err
	}
	// Complete unless the answer was cut short with messages left pending.
	return end == nil || end.Get("Nats-Num-Pending") == "0" || got == len(subjects), nil
}

// Sized is a stored message's sequence and the size of its data.
type Sized struct {
	Seq  uint64
	Size int
}

// NextOnSubjectSizes returns up to n messages of stream on subject from
// seq on, as their sequences and sizes, in one batched direct get (its
// answer bounded by maxBytes; nats-server 2.11 and later; a replica
// answers, so it may lag the leader by what was just stored).
func NextOnSubjectSizes(ctx context.Context, js jetstream.JetStream, stream, subject string, seq uint64, n, maxBytes int) ([]Sized, error) {
	var out []Sized
	_, err := directBatch(ctx, js, stream, map[string]any{"seq": seq, "next_by_subj": subject, "batch": n, "max_bytes": maxBytes},
		fmt.Sprintf("sizes on %s of %s from %d", subject, stream, seq), func(m *nats.Msg) error {
			s, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
			if err != nil {
				return errors.New("a message without its sequence")
			}
			out = append(out, Sized{Seq: s, Size: len(m.Data)})
			return nil
		})
	return out, err
}
