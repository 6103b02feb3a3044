package runner

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// liveOutputs is live's part for batched attempts (batched.go): one
// subscription to the republished batches every worker sends this frontend
// (streams.LiveWorkerOutputs), whose callback hands each batch's entries to
// the followers of their requests, a request's entries in the batch's
// order. It does no I/O: where a batch follows a gap in its subject (the
// server's Nats-Last-Sequence is past the last one delivered here), the
// followers of that worker's batched attempts read their output back
// before they apply more (follower.readOutput).
//
// A request taken over from another frontend, or followed here while
// another owns it, has its batched attempt's batches on that frontend's
// subject: its follower holds a subscription to that one subject
// (holdForeign) while it follows the request.
type liveOutputs struct {
	self string
	sub  *nats.Subscription

	mu      sync.Mutex
	last    map[string]uint64      // per stored subject, the last batch delivered
	foreign map[string]*foreignSub // per stored subject of another frontend
}

// foreignSub is a subscription to another frontend's batches from one
// worker, and how many followers hold it.
type foreignSub struct {
	sub *nats.Subscription
	n   int
}

// followOutputs subscribes to the batches workers send frontend self.
func (l *live) followOutputs(self string) error {
	l.outs = &liveOutputs{self: self, last: map[string]uint64{}, foreign: map[string]*foreignSub{}}
	sub, err := l.nc.Subscribe(streams.LiveWorkerOutputs(self), l.deliverBatch)
	if err != nil {
		return fmt.Errorf("subscribe to %s: %w", streams.LiveWorkerOutputs(self), err)
	}
	_ = sub.SetPendingLimits(-1, livePendingBytes)
	l.outs.sub = sub
	return nil
}

// deliverBatch hands a republished batch's entries to their followers.
func (l *live) deliverBatch(m *nats.Msg) {
	worker, _, ok := streams.ParseWorkerOutput(m.Subject)
	if !ok {
		return
	}
	seq, _ := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	prev, _ := strconv.ParseUint(m.Header.Get(jetstream.LastSequenceHeader), 10, 64)
	stored := streams.StoredSubject(m.Subject)
	if gap, fresh := l.outs.seen(stored, seq, prev); !fresh {
		return
	} else if gap {
		l.readAgainBatched(worker, stored, prev)
	}
	_, entries, _ := streams.BatchEntries(m)
	// A batch holds about one entry a request: group them by request,
	// each request's in the batch's order.
	byID := make(map[string]int, len(entries))
	var groups [][]events.Envelope
	for _, e := range entries {
		i, ok := byID[e.Subject]
		if !ok {
			i = len(groups)
			byID[e.Subject] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], e)
	}
	for _, mine := range groups {
		for _, f := range l.followersOf(mine[0].Subject) {
			f.onBatch(&outBatch{subject: stored, seq: seq, entries: mine, live: true})
		}
	}
}

// seen records batch seq of subject, whose predecessor on the subject is
// prev: fresh is false for a batch delivered already, gap true when
// batches between were not delivered here (or, for the first batch of a
// subject, may not have been).
func (o *liveOutputs) seen(subject string, seq, prev uint64) (gap, fresh bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	last, known := o.last[subject]
	if known && seq <= last {
		return false, false
	}
	o.last[subject] = seq
	return prev > last, true
}

// readAgainBatched has the followers of a batched attempt of worker (any
// worker: "") read its output back; with need, through sequence need of
// subject at least before they apply a live batch of it again. After
// dropped batches that is every one: an attempt's last batch, its end,
// may be among them with nothing after it to show the gap.
func (l *live) readAgainBatched(worker, subject string, need uint64) {
	l.mu.RLock()
	var fs []*follower
	for _, of := range l.followers {
		fs = append(fs, of...)
	}
	l.mu.RUnlock()
	for _, f := range fs {
		if f.batchedOn(worker) {
			if need > 0 {
				f.requireOut(subject, need)
			}
			f.readAgain()
		}
	}
}

// holdForeign subscribes to the batches worker sends owner, another
// frontend, unless held already, and waits until the server has the
// interest: what is stored after it returns is delivered, what was before
// is read back. It reports whether the subject is this frontend's own (no
// subscription needed), or was held.
func (l *live) holdForeign(worker, owner string) bool {
	if l.outs == nil {
		return false
	}
	if owner == l.outs.self {
		return true
	}
	stored := streams.WorkerOutput(worker, owner)
	o := l.outs
	o.mu.Lock()
	defer o.mu.Unlock()
	if fs := o.foreign[stored]; fs != nil {
		fs.n++
		return true
	}
	sub, err := l.nc.Subscribe(streams.LiveWorkerOutput(worker, owner), l.deliverBatch)
	if err != nil {
		return false
	}
	_ = sub.SetPendingLimits(-1, livePendingBytes)
	o.foreign[stored] = &foreignSub{sub: sub, n: 1}
	_ = l.nc.FlushTimeout(streams.DefaultTimeout)
	return true
}

// releaseForeign gives back one hold of another frontend's subject.
func (l *live) releaseForeign(stored string) {
	o := l.outs
	o.mu.Lock()
	defer o.mu.Unlock()
	fs := o.foreign[stored]
	if fs == nil {
		return
	}
	if fs.n--; fs.n == 0 {
		_ = fs.sub.Unsubscribe()
		delete(o.foreign, stored)
		delete(o.last, stored)
	}
}

// delivered is the last batch of stored subject that this frontend's
// subscriptions delivered to its followers (0: none yet, or none held).
func (l *live) delivered(stored string) uint64 {
	if l.outs == nil {
		return 0
	}
	l.outs.mu.Lock()
	defer l.outs.mu.Unlock()
	return l.outs.last[stored]
}

// self is this frontend's id, the owner its own batches name ("" without
// --batched-output).
func (l *live) self() string {
	if l == nil || l.outs == nil {
		return ""
	}
	return l.outs.self
}
