package streams

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A worker's output stream (docs/internals.md, "Where a worker's output
// lives"): BATON_OUT_<worker> holds that worker's batches
// (WorkerOutput(worker, owner)) and nothing else, bounded by a MaxBytes of
// its own, so a worker credential can fill its own stream and no other. A
// worker asks for it on OutputsSubject(worker), a frontend answers
// (OutputsReply) and creates it (EnsureWorkerOutput); a frontend deletes it
// once the worker's lease has been gone for the stream's MaxAge. Nothing is
// created while the switch (--batched-output) is off.
const (
	// WorkerOutputPrefix starts the name of every worker's output stream.
	WorkerOutputPrefix = "BATON_OUT_"
	outputsPrefix      = "baton.outputs."

	// DefaultWorkerOutputMaxBytes is --worker-output-max-bytes' default.
	DefaultWorkerOutputMaxBytes = 256 << 20
	// WorkerOutputMaxMsgSize is the largest batch a worker's stream takes
	// (a batch's body is about 64 KiB at most, worker/batch.go).
	WorkerOutputMaxMsgSize = 1 << 20
	// WorkerOutputGrace is what a worker's stream's MaxAge adds to the
	// detach timeout: an attempt lives at most that long without a client,
	// so by then every attempt in the stream is closed.
	WorkerOutputGrace = 60 * time.Second

	// metaWorker names the worker a stream holds the output of;
	// metaAsked is the last time (RFC 3339, UTC) a worker asked for it,
	// so that a frontend does not delete a stream that its worker, back
	// after its MaxAge, has just asked for again.
	metaWorker = "baton.worker"
	metaAsked  = "baton.asked"
)

// WorkerOutputStream is the name of worker's output stream. A ValidID is a
// valid stream name part (no '.', '*', '>', space or path separator), and
// the name is at most 138 bytes, under JetStream's 255.
func WorkerOutputStream(worker string) string { return WorkerOutputPrefix + worker }

// WorkerOfOutputStream returns the worker whose output stream name is;
// ok is false for any other stream.
func WorkerOfOutputStream(name string) (worker string, ok bool) {
	worker, ok = strings.CutPrefix(name, WorkerOutputPrefix)
	return worker, ok && ValidID(worker)
}

// WorkerOutputSubjects are the subjects of worker's output stream: all of
// baton.out.<worker>, so that a batch to any owner lands in it.
func WorkerOutputSubjects(worker string) string { return outPrefix + worker + ".>" }

// AllWorkerOutputs matches the subjects of every worker's output stream:
// the filter that lists them.
const AllWorkerOutputs = outPrefix + ">"

// OutputsSubject is the core-NATS request subject on which worker asks a
// frontend for its output stream; frontends answer it in the queue group
// CheckQueue, reading the worker from the subject (NATS permissions let a
// worker publish only its own).
func OutputsSubject(worker string) string { return outputsPrefix + worker }

// OutputsSubjects matches every worker's OutputsSubject (a frontend's queue
// subscription).
const OutputsSubjects = outputsPrefix + "*"

// OutputsWorker returns the worker an OutputsSubject names.
func OutputsWorker(subject string) (string, error) {
	id, ok := strings.CutPrefix(subject, outputsPrefix)
	if !ok || !ValidID(id) {
		return "", fmt.Errorf("streams: not an outputs subject: %q", subject)
	}
	return id, nil
}

// OutputsReply is a frontend's answer to a worker's ask: its stream, or
// why there is none.
type OutputsReply struct {
	Stream   string `json:"stream,omitempty"`
	MaxBytes int64  `json:"max_bytes,omitempty"`
	// Used is the bytes the stream holds at the answer: a worker whose
	// stream is (nearly) full refuses batched dispatches until an answer
	// shows room. Absent from earlier frontends.
	Used  uint64 `json:"used,omitempty"`
	Error string `json:"error,omitempty"`
}

// WorkerOutputConfig is the definition of worker's output stream: the
// request log's replicas and storage, maxBytes (0: the default),
// MaxMsgSize WorkerOutputMaxMsgSize, MaxAge maxAge (the detach timeout +
// WorkerOutputGrace), DiscardNew (a full stream refuses its worker's next
// batch, never drops a stored one), direct gets, and RePublish to
// baton.live.out.>. asked goes in its metadata (zero: none).
func (c Config) WorkerOutputConfig(worker string, maxBytes int64, maxAge time.Duration, asked time.Time) jetstream.StreamConfig {
	c = c.withDefaults()
	if maxBytes <= 0 {
		maxBytes = DefaultWorkerOutputMaxBytes
	}
	meta := map[string]string{metaWorker: worker}
	if !asked.IsZero() {
		meta[metaAsked] = asked.UTC().Format(time.RFC3339Nano)
	}
	return jetstream.StreamConfig{
		Name:        WorkerOutputStream(worker),
		Description: "baton worker output: the batches of worker " + worker + ", bounded by their own limit",
		Subjects:    []string{WorkerOutputSubjects(worker)},
		Metadata:    meta,
		Storage:     c.storage(),
		Replicas:    c.Replicas,
		MaxAge:      maxAge,
		MaxBytes:    maxBytes,
		MaxMsgSize:  WorkerOutputMaxMsgSize,
		Discard:     jetstream.DiscardNew,
		Duplicates:  min(2*time.Minute, maxAge),
		AllowDirect: true,
		RePublish: &jetstream.RePublish{
			Source:      AllWorkerOutputs,
			Destination: liveOutPrefix + ">",
		},
	}
}

// EnsureWorkerOutput creates the stream sc (a WorkerOutputConfig) or, if
// it exists, updates it to sc: the frontend answering a worker's ask
// imposes its own limits and stamps the ask's time. It is idempotent and
// safe to race (the last writer's definition stays). A stream of that name
// with other subjects (not made by baton) is not touched: an error.
func EnsureWorkerOutput(ctx context.Context, js jetstream.JetStream, sc jetstream.StreamConfig) error {
	_, err := EnsureWorkerOutputUsed(ctx, js, sc)
	return err
}

// EnsureWorkerOutputUsed is EnsureWorkerOutput that also returns the bytes
// the stream holds (0 for a stream it created): a frontend's answer to an
// ask tells the worker how full its stream is.
func EnsureWorkerOutputUsed(ctx context.Context, js jetstream.JetStream, sc jetstream.StreamConfig) (used uint64, err error) {
	for range 3 {
		_, err := js.CreateStream(ctx, sc)
		if err == nil {
			return 0, nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return 0, fmt.Errorf("streams: create stream %s: %w", sc.Name, translateCreate(err))
		}
		s, err := js.Stream(ctx, sc.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue // deleted meanwhile: create it again
		}
		if err != nil {
			return 0, fmt.Errorf("streams: look up stream %s: %w", sc.Name, err)
		}
		have := s.CachedInfo().Config
		if len(have.Subjects) != 1 || have.Subjects[0] != sc.Subjects[0] {
			return 0, fmt.Errorf("streams: stream %s has subjects %v, not %s: not a worker's output stream", sc.Name, have.Subjects, sc.Subjects[0])
		}
		up, err := js.UpdateStream(ctx, sc)
		if err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				continue
			}
			return 0, fmt.Errorf("streams: update stream %s: %w", sc.Name, err)
		}
		return up.CachedInfo().State.Bytes, nil
	}
	return 0, fmt.Errorf("streams: create stream %s: still racing", sc.Name)
}

// WorkerOutputInfo is what a frontend needs of a worker's output stream to
// decide whether to delete it.
type WorkerOutputInfo struct {
	Worker  string
	Created time.Time
	Asked   time.Time // zero: no ask recorded
	Last    time.Time // the last message's time; zero: empty
	MaxAge  time.Duration
}

// Idle is the latest of its creation, the last ask and the last message:
// the stream has not been wanted since.
func (i WorkerOutputInfo) Idle() time.Time {
	t := i.Created
	for _, u := range []time.Time{i.Asked, i.Last} {
		if u.After(t) {
			t = u
		}
	}
	return t
}

func outputInfo(si *jetstream.StreamInfo) (WorkerOutputInfo, bool) {
	w, ok := WorkerOfOutputStream(si.Config.Name)
	if !ok || si.Config.Metadata[metaWorker] != w {
		return WorkerOutputInfo{}, false // not one baton made
	}
	info := WorkerOutputInfo{Worker: w, Created: si.Created, Last: si.State.LastTime, MaxAge: si.Config.MaxAge}
	if t, err := time.Parse(time.RFC3339Nano, si.Config.Metadata[metaAsked]); err == nil {
		info.Asked = t
	}
	return info, true
}

// WorkerOutputs lists every worker's output stream on the server (one
// stream list filtered by AllWorkerOutputs: $JS.API.STREAM.LIST).
func WorkerOutputs(ctx context.Context, js jetstream.JetStream) ([]WorkerOutputInfo, error) {
	var out []WorkerOutputInfo
	l := js.ListStreams(ctx, jetstream.WithStreamListSubject(AllWorkerOutputs))
	for si := range l.Info() {
		if info, ok := outputInfo(si); ok {
			out = append(out, info)
		}
	}
	if err := l.Err(); err != nil {
		return nil, fmt.Errorf("streams: list worker output streams: %w", err)
	}
	return out, nil
}

// LookupWorkerOutput reads worker's output stream's info; ok is false when it
// does not exist.
func LookupWorkerOutput(ctx context.Context, js jetstream.JetStream, worker string) (info WorkerOutputInfo, ok bool, err error) {
	s, err := js.Stream(ctx, WorkerOutputStream(worker))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return WorkerOutputInfo{}, false, nil
	}
	if err != nil {
		return WorkerOutputInfo{}, false, fmt.Errorf("streams: look up stream %s: %w", WorkerOutputStream(worker), err)
	}
	info, ok = outputInfo(s.CachedInfo())
	return info, ok, nil
}

// DeleteWorkerOutput deletes worker's output stream; one already gone is
// not an error.
func DeleteWorkerOutput(ctx context.Context, js jetstream.JetStream, worker string) error {
	err := js.DeleteStream(ctx, WorkerOutputStream(worker))
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("streams: delete stream %s: %w", WorkerOutputStream(worker), err)
	}
	return nil
}
