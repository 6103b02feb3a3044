package worker

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// logOffSeqBase is where the synthetic sequences of Config.BenchLogOff start:
// above any real sequence of a benchmark's stream, so that a frontend applies
// what comes after the request's stored lifecycle events.
const logOffSeqBase = 1 << 50

// logOff is the appender of one attempt in the benchmark-only mode with the
// log off (Config.BenchLogOff): its deltas and outcome go over core NATS
// straight to the subject a frontend follows (the RePublish destination),
// with a synthetic Nats-Sequence and Nats-Last-Sequence, and are never
// stored. Nothing is durable: no resume, replay or migration can see them.
// The price of durability is the difference between this and the log.
//
// Flow control matches the log's: the log's async window bounds the appends
// not yet acknowledged by the stream; the worker's flowWindow bounds the
// publishes not yet confirmed by the server (a flush: PING, PONG), and a
// producer waits for room the same way.
//
// A logOff is used by one goroutine at a time (the attempt's).
type logOff struct {
	win  *flowWindow
	log  *streams.Log
	seq  *atomic.Uint64 // the worker's synthetic sequence
	last uint64         // the last synthetic sequence on this attempt's subject
}

func (l *logOff) Envelope(id, subject string, ev events.Event) events.Envelope {
	return l.log.Envelope(id, subject, ev)
}

// AppendMsgAsync publishes m; the future is already resolved.
func (l *logOff) AppendMsgAsync(m *nats.Msg) (jetstream.PubAckFuture, error) {
	err := l.publish(m)
	f := &doneFuture{msg: m, ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	if err != nil {
		f.err <- err
	} else {
		f.ok <- &jetstream.PubAck{Sequence: l.last}
	}
	return f, nil
}

// AppendMsg publishes m; expectLast is not checked (nothing is stored).
func (l *logOff) AppendMsg(_ context.Context, m *nats.Msg, _ int64) (uint64, error) {
	return l.last, l.publish(m)
}

// Append publishes e; expectLast is not checked.
func (l *logOff) Append(ctx context.Context, subject string, e events.Envelope, expectLast int64) (uint64, error) {
	m, err := streams.NewMsg(subject, e)
	if err != nil {
		return 0, err
	}
	return l.AppendMsg(ctx, m, expectLast)
}

// publish sends m, a message built for this one append, to its live subject.
func (l *logOff) publish(m *nats.Msg) error {
	m.Subject = streams.LiveSubject(m.Subject)
	seq := logOffSeqBase + l.seq.Add(1)
	m.Header.Set(jetstream.SequenceHeader, strconv.FormatUint(seq, 10))
	if l.last != 0 {
		m.Header.Set(jetstream.LastSequenceHeader, strconv.FormatUint(l.last, 10))
	}
	l.last = seq
	return l.win.publish(m)
}

// logOffMode is the worker's state in the benchmark-only mode with the log
// off (Config.BenchLogOff): the synthetic sequences and the flow control
// its attempts' logOff appenders share. A nil *logOffMode is the mode off.
type logOffMode struct {
	win *flowWindow
	seq atomic.Uint64
}

func newLogOffMode(nc *nats.Conn) *logOffMode {
	return &logOffMode{win: newFlowWindow(nc, logOffWindow)}
}

// sink is what one attempt appends to: log, or with the mode on, a logOff
// beside it.
func (m *logOffMode) sink(log *streams.Log) appender {
	if m == nil {
		return log
	}
	return &logOff{win: m.win, log: log, seq: &m.seq}
}

// logOffWindow is how many core-NATS publishes of a worker may be
// unconfirmed by the server in the log-off mode.
const logOffWindow = 1024

// flowWindow bounds a connection's publishes not yet confirmed by the
// server: once max are out, the publisher that filled it flushes (a round
// trip to the server, which has then processed every earlier publish) and
// the others wait for that. It is safe for concurrent use.
type flowWindow struct {
	nc       *nats.Conn
	max      int
	mu       sync.Mutex
	cond     sync.Cond
	out      int  // published since the last confirmation started
	flushing bool // a publisher is confirming the window
}

func newFlowWindow(nc *nats.Conn, max int) *flowWindow {
	f := &flowWindow{nc: nc, max: max}
	f.cond.L = &f.mu
	return f
}

func (f *flowWindow) publish(m *nats.Msg) error {
	f.mu.Lock()
	for f.out >= f.max && f.flushing {
		f.cond.Wait()
	}
	f.out++
	flush := f.out >= f.max
	if flush {
		f.flushing = true
	}
	n := f.out
	f.mu.Unlock()
	err := f.nc.PublishMsg(m)
	if !flush {
		return err
	}
	ferr := f.nc.FlushTimeout(streams.DefaultTimeout)
	f.mu.Lock()
	f.out -= n
	f.flushing = false
	f.cond.Broadcast()
	f.mu.Unlock()
	if err == nil {
		err = ferr
	}
	return err
}

// doneFuture is a resolved jetstream.PubAckFuture.
type doneFuture struct {
	msg *nats.Msg
	ok  chan *jetstream.PubAck
	err chan error
}

func (f *doneFuture) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f *doneFuture) Err() <-chan error            { return f.err }
func (f *doneFuture) Msg() *nats.Msg               { return f.msg }
