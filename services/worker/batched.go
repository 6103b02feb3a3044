package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/every"
	"github.com/baton-dev/baton/streams"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The batched writer (docs/internals.md, "The write path of many tokens
// per message"): an attempt whose dispatch says events.OutputBatched, on a
// worker that has its output stream (output.go), writes its deltas and its
// end through the coalescer (batch.go) as entries of batches on
// streams.WorkerOutput(worker, owner) instead of messages of their own on
// the attempt's tokens subject. Everything else about the attempt is
// unchanged: its deltas (delta.go) hand each message to an appender, and
// the batched one (batchedSink) turns it back into its event and adds it
// to the owner's batch; its future resolves when that batch is
// acknowledged, so the deltas' repairs, settle and log-full rules apply
// per entry as they do per message. A frontend with --batched-output asks
// for it and follows the batches (services/frontend/runner/batched.go).

// batchedOutput is the worker's batched writer: one coalescer for all its
// batched attempts, whose batches it appends to its output stream through
// the log's window of asynchronous appends. It is safe for concurrent use.
type batchedOutput struct {
	worker string
	log    *streams.Log
	co     *coalescer
	// pending are the futures of the entries of each destination's open
	// batch, in order. Guarded by the coalescer's lock: touched only in
	// add's write callback and in flush, which run under it.
	pending map[string][]*batchFuture

	// full is set when the stream refused a batch at its limits (its
	// MaxBytes, filled by what this worker's credential wrote), and
	// cleared once a frontend's answer to an ask shows room again
	// (awaitRoom). Meanwhile the worker refuses the dispatches that ask
	// for batched output (streams.RefusedOutputFull), so that a frontend
	// routes them elsewhere at once: the attempts running when it filled
	// end by their frontends' stall timeout.
	full    atomic.Bool
	askRoom func(context.Context) (room, limit int64, err error) // asks a frontend (outputStream.room)
	logger  *slog.Logger
	ctx     context.Context // done once closed: awaitRoom's end
	stop    context.CancelFunc
}

// roomPoll is how often a worker with a full output stream asks for its
// room (each ask updates the stream's ask time, a write of its
// definition).
const roomPoll = 2 * time.Second

func newBatchedOutput(worker string, log *streams.Log, logger *slog.Logger) (*batchedOutput, error) {
	b := &batchedOutput{worker: worker, log: log, pending: map[string][]*batchFuture{}, logger: logger}
	b.ctx, b.stop = context.WithCancel(context.Background())
	co, err := newCoalescer(coalescerConfig{Source: log.Source(), IDPrefix: worker + "." + uuid.NewString()[:8], FlushIdle: true}, b.flush)
	if err != nil {
		return nil, err
	}
	b.co = co
	return b, nil
}

// add adds e, with the extension attribute ttft when not empty (an
// attempt's first delta), to dest's batch, flushed at once when now.
func (b *batchedOutput) add(dest string, e events.Envelope, ttft string, now bool, m *nats.Msg) (*batchFuture, error) {
	f := &batchFuture{msg: m, ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	err := b.co.add(dest, now, func(enc *events.BatchEncoder) error {
		if ttft != "" {
			if err := enc.AppendAttribute(streams.HeaderUpstreamTTFT, ttft); err != nil {
				return err
			}
		}
		if err := enc.AppendEvent(e); err != nil {
			return err
		}
		b.pending[dest] = append(b.pending[dest], f)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("worker: batch %s of %s: %w", e.Type(), e.Subject, err)
	}
	return f, nil
}

// flush appends one batch to the worker's stream and resolves its
// entries' futures with the outcome. It runs under the coalescer's lock
// and blocks while the log's window is full.
func (b *batchedOutput) flush(dest string, h events.Header, body []byte) {
	fs := b.pending[dest]
	delete(b.pending, dest)
	m := &nats.Msg{Subject: streams.WorkerOutput(b.worker, dest), Header: nats.Header(h), Data: body}
	pf, err := b.log.AppendMsgAsync(m) // serializes m before it returns: h and body are reused
	if err != nil {
		resolve(fs, err)
		go b.co.acked(dest) // not under the coalescer's lock, which flush holds
		return
	}
	go func() {
		select {
		case <-pf.Ok():
			resolve(fs, nil)
		case err := <-pf.Err():
			b.noteFull(err)
			resolve(fs, err)
		}
		b.co.acked(dest)
	}()
}

// close flushes what is left; nothing more is added afterwards.
func (b *batchedOutput) close() error {
	err := b.co.close()
	b.stop()
	return err
}

// isFull reports whether the stream refused a batch at its limits and
// has not shown room since.
func (b *batchedOutput) isFull() bool { return b != nil && b.full.Load() }

// noteFull marks the stream full when err is its refusal at its limits.
func (b *batchedOutput) noteFull(err error) {
	if errors.Is(streams.Translate(err), streams.ErrStreamFull) {
		b.markFull(err)
	}
}

// noteRoom reads the stream's room in an answer to an ask: a worker that
// restarts onto its full stream refuses batched dispatches from the
// start, rather than after an attempt stalled there.
func (b *batchedOutput) noteRoom(r streams.OutputsReply) {
	if b == nil {
		return
	}
	if room, limit := replyRoom(r); room < roomNeeded(limit) {
		b.markFull(fmt.Errorf("%d bytes of room of %d", room, limit))
	}
}

// markFull marks the stream full, for why, and starts waiting for room.
func (b *batchedOutput) markFull(why error) {
	if !b.full.CompareAndSwap(false, true) {
		return
	}
	b.logger.Warn("this worker's output stream is full: refusing batched dispatches until it has room", "stream", streams.WorkerOutputStream(b.worker), "err", why)
	go b.awaitRoom()
}

// roomNeeded is the room a stream of limit bytes needs to take batched
// dispatches: the largest batch, with its headers, or an eighth of a
// stream too small for many of those.
func roomNeeded(limit int64) int64 { return min(defaultBatchMaxBytes+4<<10, limit/8) }

// awaitRoom asks a frontend every roomPoll how full the stream is,
// until it has roomNeeded (its oldest batches go with its MaxAge), then
// clears full.
func (b *batchedOutput) awaitRoom() {
	ctx, roomy := context.WithCancel(b.ctx)
	defer roomy()
	every.Tick(ctx, roomPoll, func() {
		actx, cancel := context.WithTimeout(ctx, roomPoll)
		room, limit, err := b.askRoom(actx)
		cancel()
		if err == nil && room >= roomNeeded(limit) {
			b.full.Store(false)
			b.logger.Info("this worker's output stream has room again: taking batched dispatches", "stream", streams.WorkerOutputStream(b.worker), "room", room)
			roomy()
		}
	})
}

func resolve(fs []*batchFuture, err error) {
	for _, f := range fs {
		f.resolve(err)
	}
}

// batchFuture is the outcome of one entry: its batch's. Outcome reads it
// without consuming it; Ok and Err deliver it once, as the log's futures
// do.
type batchFuture struct {
	msg *nats.Msg
	ok  chan *jetstream.PubAck
	err chan error

	mu   sync.Mutex
	done bool
	e    error
}

func (f *batchFuture) resolve(err error) {
	f.mu.Lock()
	f.done, f.e = true, err
	f.mu.Unlock()
	if err != nil {
		f.err <- err
	} else {
		f.ok <- &jetstream.PubAck{}
	}
}

// Outcome reports whether the entry's batch was answered, and its error.
func (f *batchFuture) Outcome() (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.done, f.e
}

func (f *batchFuture) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f *batchFuture) Err() <-chan error            { return f.err }
func (f *batchFuture) Msg() *nats.Msg               { return f.msg }

// batchedSink is the appender of one batched attempt (see appender): what
// its deltas would append to the attempt's tokens subject goes to the
// owner's batch instead.
type batchedSink struct {
	out  *batchedOutput
	log  *streams.Log // the event envelopes' source
	dest string       // the owning frontend
}

func (s *batchedSink) Envelope(id, subject string, ev events.Event) events.Envelope {
	return s.log.Envelope(id, subject, ev)
}

// AppendMsgAsync adds m's event to the owner's batch; an attempt's first
// delta (the one that carries the upstream's time to first token) is
// flushed at once.
func (s *batchedSink) AppendMsgAsync(m *nats.Msg) (jetstream.PubAckFuture, error) {
	e, err := streams.Decode(m)
	if err != nil {
		return nil, fmt.Errorf("worker: batch entry from %s: %w", m.Subject, err)
	}
	ttft := m.Header.Get(streams.HeaderUpstreamTTFT)
	f, err := s.out.add(s.dest, e, ttft, ttft != "", m)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// AppendMsg adds m's event to the owner's batch, flushes it, and waits for
// its acknowledgement within ctx, trying again as the log's Append does
// (appendEntry). expectLast is not checked: a worker's stream has one
// writer.
func (s *batchedSink) AppendMsg(ctx context.Context, m *nats.Msg, _ int64) (uint64, error) {
	e, err := streams.Decode(m)
	if err != nil {
		return 0, fmt.Errorf("worker: batch entry from %s: %w", m.Subject, err)
	}
	return 0, s.appendEntry(ctx, e, m.Header.Get(streams.HeaderUpstreamTTFT), m)
}

// Append adds e (the attempt's end) to the owner's batch, flushes it, and
// waits for its acknowledgement within ctx, trying again as AppendMsg does.
func (s *batchedSink) Append(ctx context.Context, _ string, e events.Envelope, _ int64) (uint64, error) {
	return 0, s.appendEntry(ctx, e, "", nil)
}

// appendEntry adds e to a batch of its own flush and waits for it; a
// transient failure (an election of the stream's leader, a reconnect) is
// tried again, in a new batch, as streams.Retry does, for up to
// streams.AppendBudget or ctx's end. A batch that was stored but whose
// acknowledgement was lost stores the entry twice, which every reader
// folds once (a delta by its offset, an end once).
func (s *batchedSink) appendEntry(ctx context.Context, e events.Envelope, ttft string, m *nats.Msg) error {
	ctx, cancel := context.WithTimeout(ctx, streams.AppendBudget)
	defer cancel()
	return streams.Retry(ctx, func(ctx context.Context) error {
		f, err := s.out.add(s.dest, e, ttft, true, m)
		if err != nil {
			return err
		}
		return f.wait(ctx)
	})
}

func (f *batchFuture) wait(ctx context.Context) error {
	select {
	case <-f.ok:
		return nil
	case err := <-f.err:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
