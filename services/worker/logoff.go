package worker

import (
	"context"
	"strconv"
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
// A logOff is used by one goroutine at a time (the attempt's).
type logOff struct {
	nc   *nats.Conn
	log  *streams.Log
	seq  *atomic.Uint64 // the worker's synthetic sequence
	last uint64         // the last synthetic sequence on this attempt's subject
}

func (l *logOff) Envelope(id, subject string, ev events.Event) events.Envelope {
	return l.log.Envelope(id, subject, ev)
}

// AppendAsync publishes e; the future is already resolved.
func (l *logOff) AppendAsync(subject string, e events.Envelope) (jetstream.PubAckFuture, error) {
	m, err := l.publish(subject, e)
	f := &doneFuture{msg: m, ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	if err != nil {
		f.err <- err
	} else {
		f.ok <- &jetstream.PubAck{Sequence: l.last}
	}
	return f, nil
}

// Append publishes e; expectLast is not checked (nothing is stored).
func (l *logOff) Append(_ context.Context, subject string, e events.Envelope, _ int64) (uint64, error) {
	_, err := l.publish(subject, e)
	return l.last, err
}

func (l *logOff) publish(subject string, e events.Envelope) (*nats.Msg, error) {
	m, err := streams.NewMsg(streams.LiveSubject(subject), e)
	if err != nil {
		return nil, err
	}
	seq := logOffSeqBase + l.seq.Add(1)
	m.Header.Set(jetstream.SequenceHeader, strconv.FormatUint(seq, 10))
	if l.last != 0 {
		m.Header.Set(jetstream.LastSequenceHeader, strconv.FormatUint(l.last, 10))
	}
	l.last = seq
	return m, l.nc.PublishMsg(m)
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
