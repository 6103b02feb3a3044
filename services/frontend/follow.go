package frontend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// follower keeps one request's projection current from the log without a
// consumer: a core subscription on the request's republished subjects, with
// gaps (detected by Nats-Last-Sequence) and history filled by batch direct get.
// Every reader of the request in this process shares one follower.
type follower struct {
	id      string
	js      jetstream.JetStream
	changed *signal

	mu         sync.Mutex
	proj       *projections.Request
	lastBySubj map[string]uint64 // last stream sequence seen per stored subject
	progress   time.Time         // when the last token was accepted
	err        error             // a catch-up failure; readers surface it
	sub        *nats.Subscription
}

// follow subscribes to request id's live subjects. With history set it first
// reads what the log already holds (ErrNotFound if nothing).
func follow(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, id string, history bool) (*follower, error) {
	f := &follower{
		id: id, js: js, changed: newSignal(),
		proj: projections.NewRequest(), lastBySubj: map[string]uint64{}, progress: time.Now(),
	}
	// Hold the lock until the history is in, so live messages queue behind it.
	f.mu.Lock()
	sub, err := nc.Subscribe(streams.RequestLive(id), f.onLive)
	if err != nil {
		f.mu.Unlock()
		return nil, fmt.Errorf("subscribe %s: %w", id, err)
	}
	_ = sub.SetPendingLimits(-1, 64<<20)
	f.sub = sub
	if history {
		if err := f.catchUpLocked(ctx); err != nil {
			f.mu.Unlock()
			_ = sub.Unsubscribe()
			return nil, err
		}
	}
	f.mu.Unlock()
	return f, nil
}

// stop ends the subscription.
func (f *follower) stop() { _ = f.sub.Unsubscribe() }

func (f *follower) onLive(m *nats.Msg) {
	e, decodeErr := streams.Decode(m)
	stored := streams.StoredSubject(m.Subject)
	f.mu.Lock()
	changed := false
	if e.Seq > f.proj.LastSeq() || e.Seq == 0 {
		if e.LastSeq > f.lastBySubj[stored] {
			// Messages of this subject were stored that we never saw: read
			// them (and whatever else followed) from the log.
			ctx, cancel := context.WithTimeout(context.Background(), streams.DefaultTimeout)
			_ = f.catchUpLocked(ctx) // a failure is kept in f.err until a catch-up succeeds
			cancel()
			changed = true
		}
		if e.Seq > f.proj.LastSeq() {
			f.lastBySubj[stored] = e.Seq
			if decodeErr == nil {
				changed = f.applyLocked(e) || changed
			}
		}
	}
	f.mu.Unlock()
	if changed {
		f.changed.Notify()
	}
}

// catchUpLocked reads the log past the last applied sequence. Its outcome
// is kept in f.err, which readers see, until the next catch-up.
func (f *follower) catchUpLocked(ctx context.Context) error {
	f.err = f.readLocked(ctx)
	return f.err
}

func (f *follower) readLocked(ctx context.Context) error {
	from := f.proj.LastSeq() + 1
	if seen := f.maxSeenLocked(); seen+1 > from {
		from = seen + 1
	}
	for e, err := range streams.ReadRequest(ctx, f.js, f.id, from) {
		if err != nil {
			if errors.Is(err, streams.ErrNotFound) && from > 1 {
				return nil // nothing new
			}
			return err
		}
		f.applyLocked(e)
	}
	return nil
}

func (f *follower) maxSeenLocked() uint64 {
	var m uint64
	for _, s := range f.lastBySubj {
		m = max(m, s)
	}
	return m
}

func (f *follower) applyLocked(e events.Envelope) bool {
	before := f.proj.Len()
	if e.Seq != 0 {
		switch ev := e.Event.(type) {
		case events.TokensGenerated:
			f.lastBySubj[streams.RequestTokens(f.id, ev.Attempt)] = max(f.lastBySubj[streams.RequestTokens(f.id, ev.Attempt)], e.Seq)
		case events.RequestCompleted:
			f.lastBySubj[streams.RequestTokens(f.id, ev.Attempt)] = max(f.lastBySubj[streams.RequestTokens(f.id, ev.Attempt)], e.Seq)
		case events.AttemptFailed:
			f.lastBySubj[streams.RequestTokens(f.id, ev.Attempt)] = max(f.lastBySubj[streams.RequestTokens(f.id, ev.Attempt)], e.Seq)
		default:
			f.lastBySubj[streams.RequestEvents(f.id)] = max(f.lastBySubj[streams.RequestEvents(f.id)], e.Seq)
		}
	}
	changed := f.proj.Apply(e)
	if f.proj.Len() != before {
		f.progress = time.Now()
	}
	return changed
}

// view runs fn on the projection under the lock; fn must not keep references.
func (f *follower) view(fn func(p *projections.Request)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f.proj)
}

// eventsSeq is the last sequence seen on the request's events subject: the
// expectation for the next decision appended there.
func (f *follower) eventsSeq() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastBySubj[streams.RequestEvents(f.id)]
}

// lastProgress is when the last token was accepted.
func (f *follower) lastProgress() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.progress
}

// waitFor blocks until cond holds on the projection, ctx is done, or the
// follower failed.
func (f *follower) waitFor(ctx context.Context, cond func(p *projections.Request) bool) error {
	for {
		ch := f.changed.C()
		f.mu.Lock()
		ok, err := cond(f.proj), f.err
		f.mu.Unlock()
		if ok {
			return nil
		}
		if err != nil {
			return err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
