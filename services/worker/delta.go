package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// appender is what deltas needs of the log (a *streams.Log).
type appender interface {
	Envelope(id, subject string, ev events.Event) events.Envelope
	Append(ctx context.Context, subject string, e events.Envelope, expectLast int64) (uint64, error)
	AppendMsg(ctx context.Context, m *nats.Msg, expectLast int64) (uint64, error)
	// AppendMsgAsync blocks while the worker's window of unacknowledged
	// appends is full: the engine waits for the log. Its future resolves
	// within streams.AppendAckTimeout: an append nobody answers fails.
	AppendMsgAsync(m *nats.Msg) (jetstream.PubAckFuture, error)
}

// futureOutcome reports, without waiting, whether f's outcome is known and its
// error. The log's futures answer without a channel (two per append
// otherwise, made on the first look).
func futureOutcome(f jetstream.PubAckFuture) (done bool, err error) {
	if o, ok := f.(interface{ Outcome() (bool, error) }); ok {
		return o.Outcome()
	}
	select {
	case <-f.Ok():
		return true, nil
	case err := <-f.Err():
		return true, err
	default:
		return false, nil
	}
}

// deltas is the token output of one attempt: what was produced, and the
// appends that carry it to the log.
//
// Readers accept a delta only if every token before its offset was stored
// before it, so an append that fails mid-stream (the stream leader died, the
// connection moved to another node) holds every later token back until a
// re-send fills the gap. A re-send (a repair) carries the tokens from the
// failed delta's offset to the last one flushed when the repair began, and no
// further: while it is unacknowledged no new delta is sent (the tokens wait),
// and every try of it is the same message under one id, so JetStream stores it
// at most once. Once it is acknowledged, every token it carries is readable;
// deltas sent before it are no longer waited for. Each token is thus stored at
// most twice, once in its own delta and once in one repair, through any number
// of failed appends.
type deltas struct {
	log       appender
	enc       *events.DeltaEncoder // the attempt's constant headers, formatted once
	encErr    error                // why enc is nil: every append fails with it
	hdr       events.Header        // the last delta's header map, reused by the next (message)
	subject   string
	requestID string
	attempt   int
	start     int      // StartOffset of the attempt
	tokens    []string // every token produced, from start
	ids       []int    // their ids, while every one is known
	idsLost   bool
	details   []json.RawMessage // parallel to tokens once any token had details
	promptIDs []int             // the prompt's ids, from the first token
	model     string            // the server's model name, from the first token
	exact     *bool             // a continuation's verdict for its first delta, when known at its start
	sawToken  bool              // a token arrived (the health monitor's first token)
	flushed   int               // tokens already handed to an append
	stored    int               // tokens [0, stored) are known readable in the log
	sent      []sentDelta       // appends not yet known to be covered, by offset (pushSent, popSent)
	sentArr   []sentDelta       // the array sent slides along
	retryAt   time.Time         // when a repair may try again
	backoff   time.Duration
	started   time.Time     // when the engine was called (newDeltas)
	ttft      time.Duration // from started to the engine's first token
	// full: the log refused an append at a limit (streams.ErrStreamFull):
	// no retry can store it until room is made, so the attempt stops.
	full bool
}

// sentDelta is one append of tokens [offset, end) (attempt-relative indexes
// into deltas.tokens) and its outcome.
type sentDelta struct {
	offset, end int
	repair      bool   // a re-send: its range and id are fixed from its first try
	id          string // the event id of a repair
	future      jetstream.PubAckFuture
	err         error
}

func (d *deltas) add(t engine.Token) {
	if len(d.tokens) == 0 {
		d.promptIDs, d.model = t.PromptIDs, t.Model
		d.ttft = time.Since(d.started)
	}
	switch {
	case d.idsLost:
	case !t.HasID:
		d.idsLost, d.ids = true, nil
	default:
		d.ids = append(d.ids, t.ID)
	}
	if t.Details != nil && d.details == nil {
		d.details = make([]json.RawMessage, len(d.tokens), cap(d.tokens)+1)
	}
	if d.details != nil {
		d.details = append(d.details, t.Details)
	}
	d.tokens = append(d.tokens, t.Text)
}

// drop forgets the tokens not flushed yet: a kill aborts at once.
func (d *deltas) drop() {
	d.tokens = d.tokens[:d.flushed]
	if !d.idsLost {
		d.ids = d.ids[:d.flushed]
	}
	if d.details != nil {
		d.details = d.details[:d.flushed]
	}
}

// event is the delta of the tokens at indexes [from, to) of the attempt.
func (d *deltas) event(from, to int) events.TokensGenerated {
	ev := events.TokensGenerated{RequestID: d.requestID, Attempt: d.attempt, Offset: d.start + from, Tokens: d.tokens[from:to]}
	if !d.idsLost {
		ev.IDs = d.ids[from:to]
	}
	if d.details != nil && slices.ContainsFunc(d.details[from:to], func(r json.RawMessage) bool { return r != nil }) {
		ev.Details = d.details[from:to]
	}
	if from == 0 && d.start == 0 {
		ev.PromptIDs = d.promptIDs // a continuation's are prompt + generated ids: not the request's
	}
	if from == 0 {
		ev.Model, ev.Exact = d.model, d.exact
	}
	return ev
}

func (d *deltas) pending() int { return len(d.tokens) - d.flushed }
func (d *deltas) offset() int  { return d.start + len(d.tokens) }

// id is the event id of the delta at attempt-relative index from.
func (d *deltas) id(from int) string { return events.ID(d.requestID, d.attempt, d.start+from) }

// newDeltas returns the output of attempt of requestID, starting at token
// offset start, appended to subject by source.
func newDeltas(log appender, source, subject, requestID string, attempt, start int) *deltas {
	d := &deltas{log: log, subject: subject, requestID: requestID, attempt: attempt, start: start, started: time.Now()}
	d.enc, d.encErr = events.NewDeltaEncoder(source, requestID, attempt)
	return d
}

// message is the NATS message of a sent delta. Its header map is the last
// message's, cleared (EncodeInto): an append serializes its message before
// it returns (AppendMsgAsync, AppendMsg, the log-off publish), and nothing
// reads a sent message's header after that.
//
// A message sent once (once: a delta's first asynchronous append, which is
// never sent again: when it fails, a repair under an id of its own carries
// its tokens) has no Nats-Msg-Id, so JetStream keeps no deduplication entry
// for it: a map entry per token for the stream's 2-minute window, about 6
// million at 50,000 tokens/s. Repairs, which are tried again under one id,
// and synchronous appends, which Append retries, keep it.
func (d *deltas) message(s *sentDelta, once bool) (*nats.Msg, error) {
	if d.enc == nil {
		return nil, d.encErr
	}
	id := s.id
	if id == "" {
		id = d.id(s.offset)
	}
	h, data, err := d.enc.EncodeInto(d.hdr, id, time.Now(), d.event(s.offset, s.end))
	if err != nil {
		return nil, err
	}
	d.hdr = h
	if once {
		delete(h, events.HeaderMsgID)
	}
	if s.offset == 0 && d.ttft > 0 { // the attempt's first delta
		h[streams.HeaderUpstreamTTFT] = []string{strconv.FormatInt(max(d.ttft.Microseconds(), 1), 10)}
	}
	return &nats.Msg{Subject: d.subject, Header: nats.Header(h), Data: data}, nil
}

// appendAsync starts the append of s.
func (d *deltas) appendAsync(s *sentDelta) {
	m, err := d.message(s, !s.repair)
	if err == nil {
		s.future, err = d.log.AppendMsgAsync(m)
	}
	s.err = err
	d.noteFull(err)
}

// noteFull records that err is the log refusing an append at its limits.
func (d *deltas) noteFull(err error) {
	if err != nil && errors.Is(streams.Translate(err), streams.ErrStreamFull) {
		d.full = true
	}
}

// logFull reports whether the log refused one of the attempt's appends at
// its limits: generating more would only add tokens nobody can store.
func (d *deltas) logFull() bool { return d.full }

// storedOffset waits, within ctx, for the outcomes of the appends in
// flight, and returns the token offset up to which the attempt is
// readable: through the last append stored in order before the first that
// failed. It retries nothing: it is for an attempt the log refused
// (logFull), whose later appends cannot fill the gap.
func (d *deltas) storedOffset(ctx context.Context) int {
	for len(d.sent) > 0 && ctx.Err() == nil {
		s := &d.sent[0]
		if s.end <= d.stored {
			d.popSent()
			continue
		}
		if s.err != nil {
			break
		}
		select {
		case <-s.future.Ok():
			d.ack(s)
		case s.err = <-s.future.Err():
		case <-ctx.Done():
		}
	}
	return d.start + d.stored
}

// appendSync appends s and waits for it (Append's retries, bounded by ctx).
func (d *deltas) appendSync(ctx context.Context, s *sentDelta) error {
	m, err := d.message(s, false)
	if err == nil {
		_, err = d.log.AppendMsg(ctx, m, -1)
	}
	return err
}

// idle reports whether every append of the attempt is acknowledged (after
// taking in the outcomes that came): a new token may go at once.
func (d *deltas) idle() bool {
	d.poll(time.Now())
	return len(d.sent) == 0
}

// repairing reports whether a repair is unacknowledged: new tokens wait.
func (d *deltas) repairing() bool { return len(d.sent) > 0 && d.sent[0].repair }

// flush appends the pending tokens asynchronously, unless a repair is under
// way: then they wait for it (pending stays above 0; flush again later).
func (d *deltas) flush() {
	if d.pending() == 0 {
		return
	}
	d.poll(time.Now())
	if d.repairing() {
		return
	}
	s := d.pushSent(sentDelta{offset: d.flushed, end: len(d.tokens)})
	d.flushed = len(d.tokens)
	d.appendAsync(s)
}

// Spacing of a repair's tries while appends fail (a leader election, a
// reconnect to another node).
const (
	resendBackoffMin = 100 * time.Millisecond
	resendBackoffMax = time.Second
)

// poll takes in the outcomes of the oldest appends, without waiting, and
// starts or retries a repair of the oldest that failed. Tries are spaced by a
// backoff; settle makes the last, synchronous and bounded, one.
func (d *deltas) poll(now time.Time) {
	for len(d.sent) > 0 {
		s := &d.sent[0]
		if s.end <= d.stored {
			d.popSent() // carried by a repair already stored
			continue
		}
		if s.err == nil {
			done, err := futureOutcome(s.future)
			switch {
			case !done:
				return // still in flight
			case err == nil:
				d.ack(s)
				continue
			}
			s.err = err
			d.noteFull(err)
		}
		if now.Before(d.retryAt) {
			return
		}
		d.backoff = min(max(2*d.backoff, resendBackoffMin), resendBackoffMax)
		d.retryAt = now.Add(d.backoff)
		d.startRepair(s)
		d.appendAsync(s)
		return
	}
}

// startRepair turns the failed append s into a repair, once: it carries every
// token flushed so far from its offset, under an id of its own (an original
// delta stored late must not deduplicate it).
func (d *deltas) startRepair(s *sentDelta) {
	if s.repair {
		return
	}
	s.repair, s.end = true, d.flushed
	s.id = events.ID(d.requestID, d.attempt, d.start+s.offset, d.start+s.end)
}

// pushSent queues s. The queue slides along its array as appends are
// taken in (popSent); when it reaches the end it moves back to the start,
// and the array doubles only when more than half of it is in use: a queue
// that stays short allocates nothing per delta.
func (d *deltas) pushSent(s sentDelta) *sentDelta {
	if n := len(d.sent); n == cap(d.sent) {
		if 2*n > len(d.sentArr) {
			d.sentArr = make([]sentDelta, max(4, 2*n))
		}
		copy(d.sentArr, d.sent)
		clear(d.sentArr[n:]) // no stale copy keeps a future alive
		d.sent = d.sentArr[:n]
	}
	d.sent = append(d.sent, s)
	return &d.sent[len(d.sent)-1]
}

// popSent forgets the oldest queued append.
func (d *deltas) popSent() {
	d.sent[0] = sentDelta{}
	d.sent = d.sent[1:]
}

// ack records that s is stored: every token before its end is readable.
func (d *deltas) ack(s *sentDelta) {
	d.stored = max(d.stored, s.end)
	d.popSent()
	d.backoff = 0
}

// settle waits for every append's acknowledgement, repairs a failed one
// synchronously (Append retries it through a leader election, bounded by
// ctx), then appends the tokens a repair held back.
func (d *deltas) settle(ctx context.Context) error {
	for len(d.sent) > 0 {
		s := &d.sent[0]
		if s.end <= d.stored {
			d.popSent()
			continue
		}
		err := s.err
		if err == nil {
			select {
			case <-s.future.Ok():
			case err = <-s.future.Err():
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		if err != nil {
			d.startRepair(s)
			if rerr := d.appendSync(ctx, s); rerr != nil {
				return fmt.Errorf("tokens at offset %d: %w (first try: %w)", d.start+s.offset, rerr, err)
			}
		}
		d.ack(s)
	}
	if d.pending() > 0 {
		s := sentDelta{offset: d.flushed, end: len(d.tokens)}
		if err := d.appendSync(ctx, &s); err != nil {
			return fmt.Errorf("tokens at offset %d: %w", d.start+s.offset, err)
		}
		d.flushed, d.stored = s.end, s.end
	}
	d.sent = nil
	return nil
}
