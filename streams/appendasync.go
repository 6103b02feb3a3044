package streams

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Bounds of a Log's asynchronous appends (AppendMsgAsync).
const (
	// AppendWindow is how many asynchronous appends of a Log may be
	// unacknowledged at once; when it is full, AppendMsgAsync waits (a
	// generation, and so its engine, waits for the log).
	AppendWindow = 1024
	// AppendStall is how long AppendMsgAsync waits for room in the window
	// before it fails with jetstream.ErrTooManyStalledMsgs.
	AppendStall = DefaultTimeout
	// AppendAckTimeout is how long an asynchronous append waits for its
	// acknowledgement: one unanswered for that long (its stream leader died
	// with it) fails with jetstream.ErrAsyncPublishTimeout and leaves the
	// window.
	AppendAckTimeout = DefaultTimeout
)

// asyncAppends is a Log's window of asynchronous appends. It does what
// nats.go's PublishMsgAsync does for baton's appends (a reply subject per
// append under one wildcard subscription, a bounded window, a failure for
// every append in flight when the connection is lost), for less per append:
// no ack timer of its own (one timer, armed for the oldest append's
// deadline, expires every append unanswered for AppendAckTimeout), no
// channel unless a caller asks for one, and the acknowledgement's JSON read
// without reflection.
//
// Appends are never re-sent here (a re-send behind the caller's back could
// store an append after the ones sent after it): the caller repairs.
type asyncAppends struct {
	max     int           // AppendWindow unless a test set it
	timeout time.Duration // AppendAckTimeout unless a test set it

	// window holds a token per pending append: a full window blocks the
	// next send until one leaves, and wakes one waiter per append that
	// leaves (not every waiter, to race for one place).
	window chan struct{}

	mu      sync.Mutex
	publish func(*nats.Msg) error // nil until started
	prefix  string                // the reply subject of append id is prefix + id
	next    uint64
	pending map[uint64]*asyncAppend
	expiry  *time.Timer // expire, armed (armed) while anything is pending
	armed   bool
	stream  string // the last acknowledgement's stream name (reply's only), so that each does not allocate its own
}

// asyncAppend is the future of one asynchronous append: a
// jetstream.PubAckFuture whose outcome can also be read without a channel
// (Outcome). It is safe for concurrent use.
type asyncAppend struct {
	msg      *nats.Msg
	id       uint64
	deadline time.Time // guarded by asyncAppends.mu

	mu    sync.Mutex
	done  bool
	ack   jetstream.PubAck // held here: one allocation less per append
	err   error
	okCh  chan *jetstream.PubAck // made on the first Ok
	errCh chan error             // made on the first Err
}

// start makes the reply subscription and the connection watch, once.
func (a *asyncAppends) start(nc *nats.Conn) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.publish != nil {
		return nil
	}
	prefix := nc.NewInbox() + "."
	// The subscription lasts as long as the connection, as nats.go's does.
	if _, err := nc.Subscribe(prefix+"*", a.reply); err != nil {
		return fmt.Errorf("subscribe to append acknowledgements: %w", err)
	}
	// An acknowledgement in flight when the connection is lost never comes:
	// every append then pending fails at once (the caller repairs it),
	// as nats.go's does.
	status := nc.StatusChanged(nats.RECONNECTING, nats.CLOSED)
	go func() {
		for s := range status {
			if s == nats.CLOSED {
				a.failAll(nats.ErrConnectionClosed)
				return
			}
			a.failAll(nats.ErrDisconnected)
		}
	}()
	if nc.IsClosed() {
		nc.RemoveStatusListener(status) // closed before the watch: it ends
	}
	a.init(prefix, nc.PublishMsg)
	return nil
}

// init readies a for sending with publish, replies coming to prefix + id.
// a.mu is held.
func (a *asyncAppends) init(prefix string, publish func(*nats.Msg) error) {
	if a.max == 0 {
		a.max = AppendWindow
	}
	if a.timeout == 0 {
		a.timeout = AppendAckTimeout
	}
	a.prefix, a.publish = prefix, publish
	a.window = make(chan struct{}, a.max)
	a.pending = make(map[uint64]*asyncAppend, a.max)
}

// send publishes m with a reply subject of its own (m.Reply is set), after
// waiting for room in the window for at most AppendStall.
func (a *asyncAppends) send(m *nats.Msg) (*asyncAppend, error) {
	select {
	case a.window <- struct{}{}:
	default:
		stall := time.NewTimer(AppendStall)
		defer stall.Stop()
		select {
		case a.window <- struct{}{}:
		case <-stall.C:
			return nil, jetstream.ErrTooManyStalledMsgs
		}
	}
	a.mu.Lock()
	a.next++
	p := &asyncAppend{msg: m, id: a.next, deadline: time.Now().Add(a.timeout)}
	a.pending[p.id] = p
	if !a.armed {
		a.armed = true
		if a.expiry == nil {
			a.expiry = time.AfterFunc(a.timeout, a.expire)
		} else {
			a.expiry.Reset(a.timeout)
		}
	}
	m.Reply = a.prefix + strconv.FormatUint(p.id, 10)
	publish := a.publish
	a.mu.Unlock()
	if err := publish(m); err != nil {
		a.mu.Lock()
		a.remove(p.id)
		a.mu.Unlock()
		return nil, err
	}
	return p, nil
}

// remove takes append id out of the window if it is still there (it may
// have expired, or failed with the connection). a.mu is held.
func (a *asyncAppends) remove(id uint64) {
	if _, ok := a.pending[id]; ok {
		delete(a.pending, id)
		<-a.window
	}
}

// reply takes in the server's answer to an append. The subscription calls
// it from one goroutine at a time.
func (a *asyncAppends) reply(m *nats.Msg) {
	var ack jetstream.PubAck
	var err error
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		err = jetstream.ErrNoStreamResponse
	} else {
		ack, err = parsePubAck(m.Data, &a.stream)
	}
	a.mu.Lock()
	if len(m.Subject) <= len(a.prefix) {
		a.mu.Unlock()
		return
	}
	id, perr := strconv.ParseUint(m.Subject[len(a.prefix):], 10, 64)
	p := a.pending[id]
	if perr != nil || p == nil {
		a.mu.Unlock()
		return // expired, or failed with the connection
	}
	a.remove(id)
	a.mu.Unlock()
	p.resolve(ack, err)
}

// expire fails every append unanswered past its deadline, and arms the
// timer for the next deadline.
func (a *asyncAppends) expire() {
	now := time.Now()
	var late []*asyncAppend
	a.mu.Lock()
	a.armed = false
	var next time.Time
	for id, p := range a.pending {
		switch {
		case !now.Before(p.deadline):
			late = append(late, p)
			a.remove(id)
		case next.IsZero() || p.deadline.Before(next):
			next = p.deadline
		}
	}
	if !next.IsZero() {
		a.armed = true
		a.expiry.Reset(next.Sub(now))
	}
	a.mu.Unlock()
	for _, p := range late {
		p.resolve(jetstream.PubAck{}, jetstream.ErrAsyncPublishTimeout)
	}
}

// failAll fails every pending append with err.
func (a *asyncAppends) failAll(err error) {
	a.mu.Lock()
	var all []*asyncAppend
	for id, p := range a.pending {
		all = append(all, p)
		a.remove(id)
	}
	a.mu.Unlock()
	for _, p := range all {
		p.resolve(jetstream.PubAck{}, err)
	}
}

func (p *asyncAppend) resolve(ack jetstream.PubAck, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done, p.ack, p.err = true, ack, err
	if p.okCh != nil && err == nil {
		p.okCh <- &p.ack
	}
	if p.errCh != nil && err != nil {
		p.errCh <- err
	}
}

// Outcome reports, without waiting, whether the append's outcome is known,
// and if so its error (nil: stored).
func (p *asyncAppend) Outcome() (done bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done, p.err
}

// Ok yields the acknowledgement once the append is stored.
func (p *asyncAppend) Ok() <-chan *jetstream.PubAck {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.okCh == nil {
		p.okCh = make(chan *jetstream.PubAck, 1)
		if p.done && p.err == nil {
			p.okCh <- &p.ack
		}
	}
	return p.okCh
}

// Err yields the error once the append failed.
func (p *asyncAppend) Err() <-chan error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.errCh == nil {
		p.errCh = make(chan error, 1)
		if p.done && p.err != nil {
			p.errCh <- p.err
		}
	}
	return p.errCh
}

// Msg is the appended message, as its sender left it (the worker's deltas
// reuse its header map for the next one once AppendMsgAsync returns).
func (p *asyncAppend) Msg() *nats.Msg { return p.msg }

// AppendAsync stores e on subject without waiting; the future reports the
// outcome. See AppendMsgAsync.
func (l *Log) AppendAsync(subject string, e events.Envelope) (jetstream.PubAckFuture, error) {
	m, err := NewMsg(subject, e)
	if err != nil {
		return nil, err
	}
	return l.AppendMsgAsync(m)
}

// AppendMsgAsync stores m without waiting for its acknowledgement; the future
// reports the outcome, within AppendAckTimeout: an append unanswered for that
// long fails with jetstream.ErrAsyncPublishTimeout. The future also has an
// Outcome() (done bool, err error) method that reads it without a channel.
// AppendMsgAsync sets m.Reply.
//
// The appends unacknowledged at once are bounded by the window,
// AppendWindow: when it is full, AppendMsgAsync blocks until an
// acknowledgement makes room (for at most AppendStall), so a producer slows
// to the rate the log stores at instead of queueing without bound.
//
// An append that finds no stream to answer it (a leader election, a node
// shutting down) fails at once: it is not retried behind the caller's back.
// A retry 250 ms later (nats.go's default) could find the appends sent after
// it stored: the log would then hold them before it, every one acknowledged,
// and readers skip the later ones as gaps that no failure ever made the
// caller repair. A failed future lets the caller re-send in order (the
// worker's deltas do). Every append pending when the connection is lost fails
// with nats.ErrDisconnected.
func (l *Log) AppendMsgAsync(m *nats.Msg) (jetstream.PubAckFuture, error) {
	fail := func(err error) error {
		return fmt.Errorf("append %s to %s: %w", m.Header.Get(events.HeaderType), m.Subject, translate(err))
	}
	if m.Reply != "" {
		return nil, fail(jetstream.ErrAsyncPublishReplySubjectSet)
	}
	if err := l.async.start(l.js.Conn()); err != nil {
		return nil, fail(err)
	}
	f, err := l.async.send(m)
	if err != nil {
		return nil, fail(err)
	}
	return f, nil
}

// parsePubAck reads JetStream's answer to a publish: its acknowledgement,
// or the error it carries. The answer of a stored message (a flat object of
// "stream", "seq", and "domain" or "duplicate" if any) is read in one pass,
// and its stream name reuses *stream when it is the same; any other answer
// (an error, a batch's) goes through encoding/json.
func parsePubAck(data []byte, stream *string) (jetstream.PubAck, error) {
	if ack, ok := parseFlatPubAck(data, stream); ok {
		return ack, nil
	}
	var r struct {
		jetstream.PubAck
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return jetstream.PubAck{}, jetstream.ErrInvalidJSAck
	}
	if r.Error != nil {
		return jetstream.PubAck{}, r.Error
	}
	if r.Stream == "" {
		return jetstream.PubAck{}, jetstream.ErrInvalidJSAck
	}
	return r.PubAck, nil
}

// parseFlatPubAck reads a PubAck of the server's usual form; ok is false
// for anything else.
func parseFlatPubAck(data []byte, stream *string) (ack jetstream.PubAck, ok bool) {
	var a jetstream.PubAck
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return a, false
	}
	for first := true; ; first = false {
		i = skipSpace(data, i+1)
		if i < len(data) && data[i] == '}' && first {
			return a, false // {}: no stream
		}
		key, j, ok := flatString(data, i)
		if !ok {
			return a, false
		}
		i = skipSpace(data, j)
		if i >= len(data) || data[i] != ':' {
			return a, false
		}
		i = skipSpace(data, i+1)
		switch string(key) {
		case "stream", "domain":
			v, j, ok := flatString(data, i)
			if !ok {
				return a, false
			}
			i = j
			if string(key) == "domain" {
				a.Domain = string(v)
			} else if string(v) == *stream {
				a.Stream = *stream
			} else {
				a.Stream = string(v)
				*stream = a.Stream
			}
		case "seq":
			j, seq := i, uint64(0)
			for ; j < len(data) && data[j] >= '0' && data[j] <= '9'; j++ {
				if seq > (1<<64-1-9)/10 {
					return a, false // near overflow: encoding/json decides
				}
				seq = 10*seq + uint64(data[j]-'0')
			}
			if j == i {
				return a, false
			}
			a.Sequence, i = seq, j
		case "duplicate":
			switch {
			case hasAt(data, i, "true"):
				a.Duplicate, i = true, i+4
			case hasAt(data, i, "false"):
				i += 5
			default:
				return a, false
			}
		default:
			return a, false // an error, a batch's fields, a counter's value
		}
		i = skipSpace(data, i)
		if i >= len(data) {
			return a, false
		}
		switch data[i] {
		case ',':
			continue
		case '}':
			if a.Stream == "" || skipSpace(data, i+1) != len(data) {
				return a, false
			}
			return a, true
		default:
			return a, false
		}
	}
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

func hasAt(data []byte, i int, s string) bool {
	return len(data)-i >= len(s) && string(data[i:i+len(s)]) == s
}

// flatString reads the JSON string at data[i], one with no escapes or
// control characters: its content and the index past it.
func flatString(data []byte, i int) ([]byte, int, bool) {
	if i >= len(data) || data[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(data); j++ {
		switch c := data[j]; {
		case c == '"':
			return data[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20:
			return nil, 0, false
		}
	}
	return nil, 0, false
}
