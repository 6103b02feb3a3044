package runner

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/baton-dev/baton/internal/every"
	"github.com/baton-dev/baton/services/retention"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// livePendingBytes bounds the republished messages one slot's live
// subscription holds undelivered; past it nats.go drops them (a slow
// consumer), and the followers of the slot read the log (watchDrops).
const livePendingBytes = 256 << 20

// dropsCheckEvery is how often watchDrops looks for dropped messages.
const dropsCheckEvery = 250 * time.Millisecond

// liveLinger is how long a slot's subscription outlives its last follower:
// a frontend that serves requests keeps the slots it uses (a new request
// pays no subscription), one that stops serving drops them.
const liveLinger = 30 * time.Second

// live receives the republished messages of the requests this frontend
// follows, and of no other: one subscription per hash slot (streams.Slots
// of them, streams.RequestsLiveSlot) that holds at least one followed
// request, rather than one per request (a goroutine, a pending queue and a
// server interest each, thousands of times over) or one to every request
// (which makes every frontend read every request's tokens, so that N
// frontends cost N times the fan-out). Its callback parses the request id
// from the subject (streams.RequestIDOf) and hands the message to
// that request's followers, in the order NATS delivered it (every message
// of a request is in its slot's subscription); messages of requests nobody
// here follows are dropped. The callback does no I/O: a follower's onLive
// only applies or queues.
//
// Registering a follower (add) subscribes to its slot if need be and
// waits until the server has the interest (a flush), so nothing
// republished after add returns is missed; what was republished before is
// read from the log (follow's history, or the gap the next message shows).
type live struct {
	nc *nats.Conn
	// suspect is told of every large message delivered (a worker's junk,
	// maybe: retention.Guard.Suspect judges it at once); nil in tests.
	suspect func(stream, subject string, seq uint64, size int)

	mu        sync.RWMutex
	followers map[string][]*follower

	slots [streams.Slots]liveSlot
	ends  *nats.Subscription // the ends place's republished ends (streams.EndsLive), rare: one for every request
	outs  *liveOutputs       // the batches workers send this frontend; nil without --batched-output
}

// liveSlot is the subscription of one hash slot.
type liveSlot struct {
	mu     sync.Mutex // held while subscribing and unsubscribing
	sub    *nats.Subscription
	n      int         // followers of requests in the slot
	linger *time.Timer // unsubscribes when it fires with n still 0
}

func newLive(nc *nats.Conn, suspect func(stream, subject string, seq uint64, size int)) (*live, error) {
	l := &live{nc: nc, suspect: suspect, followers: map[string][]*follower{}}
	sub, err := nc.Subscribe(streams.EndsLive(), l.deliverEnd)
	if err != nil {
		return nil, fmt.Errorf("subscribe to %s: %w", streams.EndsLive(), err)
	}
	l.ends = sub
	return l, nil
}

// deliverEnd tells the followers of a request whose end was stored in the
// ends place to read the log, which yields the end in its position
// (streams.ReadRequest).
func (l *live) deliverEnd(m *nats.Msg) {
	if id, ok := streams.RequestIDOfEnd(m.Subject); ok {
		for _, f := range l.followersOf(id) {
			f.readAgain()
		}
	}
}

func (l *live) deliver(m *nats.Msg) {
	if l.suspect != nil && len(m.Data) >= retention.SuspectSize {
		seq, _ := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		l.suspect(m.Header.Get(jetstream.StreamHeader), streams.StoredSubject(m.Subject), seq, len(m.Data))
	}
	if id, ok := streams.RequestIDOf(m.Subject); ok {
		for _, f := range l.followersOf(id) {
			f.onLive(m)
		}
	}
}

// followersOf lists request id's followers. add and remove never change a
// list in place (they clip and clone it), so it is read outside the lock.
func (l *live) followersOf(id string) []*follower {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.followers[id]
}

// add registers f for its request's messages from now on.
func (l *live) add(f *follower) {
	l.mu.Lock()
	l.followers[f.id] = append(slices.Clip(l.followers[f.id]), f)
	l.mu.Unlock()
	l.hold(streams.Slot(f.id))
}

// hold counts one more follower in slot k, subscribing to it first if it has
// no subscription.
func (l *live) hold(k int) {
	s := &l.slots[k]
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	if s.linger != nil {
		s.linger.Stop()
		s.linger = nil
	}
	if s.sub != nil {
		return
	}
	sub, err := l.nc.Subscribe(streams.RequestsLiveSlot(k), l.deliver)
	if err != nil {
		return // a closed connection: nothing is delivered anywhere
	}
	_ = sub.SetPendingLimits(-1, livePendingBytes)
	s.sub = sub
	// The interest must be the server's before the caller appends or reads:
	// a disconnected connection re-subscribes when it reconnects, and the
	// reconnect catch-up reads what was missed meanwhile.
	_ = l.nc.FlushTimeout(streams.DefaultTimeout)
}

// release counts one follower less in slot k; the slot's subscription ends
// liveLinger after its last follower left, unless another came.
func (l *live) release(k int) {
	s := &l.slots[k]
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n--
	if s.n > 0 || s.sub == nil {
		return
	}
	var t *time.Timer
	t = time.AfterFunc(liveLinger, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.linger != t || s.n > 0 || s.sub == nil {
			return
		}
		_ = s.sub.Unsubscribe()
		s.sub, s.linger = nil, nil
	})
	s.linger = t
}

// remove stops delivering to f. A delivery that read the list before may
// still call f once (deliver holds no lock while it calls): onLive only
// queues for a stopped follower.
func (l *live) remove(f *follower) {
	l.mu.Lock()
	fs := slices.DeleteFunc(slices.Clone(l.followers[f.id]), func(g *follower) bool { return g == f })
	if len(fs) == 0 {
		delete(l.followers, f.id)
	} else {
		l.followers[f.id] = fs
	}
	l.mu.Unlock()
	l.release(streams.Slot(f.id))
}

// watchDrops has the followers of a slot whose subscription dropped
// messages read the log, every dropsCheckEvery until ctx is done; after a
// drop of the ends place's, every follower reads it. A follower sees a
// gap in Nats-Last-Sequence only when a later message of the same subject
// comes, and a dropped message may be its subject's last: a request's end,
// whose client would otherwise wait for ever. (A disconnection, the
// server's slow consumer, is caught up on reconnect: catchUpOnReconnect.)
func (l *live) watchDrops(ctx context.Context) {
	var seen [streams.Slots]dropCount
	var ends, outs dropCount
	every.Tick(ctx, dropsCheckEvery, func() {
		if ends.changed(l.ends) {
			l.readAgain(func(string) bool { return true })
		}
		if l.outs != nil && outs.changed(l.outs.sub) {
			l.readAgainBatched("", "", 0)
		}
		for k := range l.slots {
			s := &l.slots[k]
			s.mu.Lock()
			sub := s.sub
			s.mu.Unlock()
			if seen[k].changed(sub) {
				l.readAgain(func(id string) bool { return streams.Slot(id) == k })
			}
		}
	})
}

// dropCount is the messages a subscription had dropped when last looked at.
type dropCount struct {
	sub *nats.Subscription
	n   int
}

// changed reports whether sub dropped messages since the last look, or
// since it subscribed when it is new.
func (d *dropCount) changed(sub *nats.Subscription) bool {
	if sub != d.sub {
		*d = dropCount{sub: sub}
	}
	if sub == nil {
		return false
	}
	n, err := sub.Dropped()
	if err != nil || n == d.n {
		return false // none, or unsubscribed meanwhile
	}
	d.n = n
	return true
}

// readAgain has the followers of every followed request that match read
// the log.
func (l *live) readAgain(match func(id string) bool) {
	l.mu.RLock()
	var fs []*follower
	for id, of := range l.followers {
		if match(id) {
			fs = append(fs, of...)
		}
	}
	l.mu.RUnlock()
	for _, f := range fs {
		f.readAgain()
	}
}

// close ends every subscription.
func (l *live) close() error {
	_ = l.ends.Unsubscribe()
	if l.outs != nil {
		_ = l.outs.sub.Unsubscribe()
	}
	for k := range l.slots {
		s := &l.slots[k]
		s.mu.Lock()
		if s.linger != nil {
			s.linger.Stop()
			s.linger = nil
		}
		if s.sub != nil {
			_ = s.sub.Unsubscribe()
			s.sub = nil
		}
		s.mu.Unlock()
	}
	return nil
}
