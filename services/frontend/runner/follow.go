package runner

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/notify"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// maxQueued and maxQueuedBytes bound the live messages a follower holds
// unapplied, in number and in bytes of their bodies; past either they are
// dropped and the log is read instead (the gap heals itself). Without the
// byte bound, a worker credential writing 1 MiB messages on an attempt
// subject of a request this frontend follows would have it hold up to
// 4 GiB while its reader is behind.
const (
	maxQueued      = 4096
	maxQueuedBytes = 16 << 20
)

// errStopped means the follower was stopped.
var errStopped = errors.New("runner: follower stopped")

// follower keeps one request's projection current from the log without a
// consumer: the request's republished messages (from the frontend's one live
// subscription, see live), with gaps (detected by Nats-Last-Sequence) and
// history filled by batch direct get.
// Every reader of the request in this process shares one follower.
//
// One goroutine (run) owns the reading of the log: every catch-up, whoever
// asks for it (a gap, a lost race, a reconnect), is done by run, with no
// lock held while it reads the network. The NATS callback applies a live
// message itself only when that needs no I/O and run has nothing in hand;
// otherwise it queues it for run. run is started when something is queued
// and ends once nothing is: most of a stream's messages are applied by the
// callback, and a goroutine parked for each of thousands of streams would
// hold its stack and its g for nothing. The projection is guarded by mu,
// held only to apply events and to read.
type follower struct {
	id      string
	js      jetstream.JetStream
	parts   streams.Partitions
	changed *notify.Signal // any event applied
	// decided is notified when an event other than a token delta is
	// applied (and by whoever must wake the runner): the runner
	// waits on it, not on every token, unless --migration-max-seq-len makes
	// it count tokens; a stall is caught by its timer.
	decided *notify.Signal
	subs    *live
	stopped chan struct{} // closed by stop
	done    chan struct{} // closed by stop once run returned
	runs    sync.WaitGroup

	qmu      sync.Mutex // held by onLive while it applies, so run cannot overtake it
	running  bool       // run was started and has not decided to return
	halted   bool       // stop was called: run is not started again
	busy     bool       // run has messages or catch-ups in hand
	queue    []liveItem
	queued   int          // bytes of the queued messages' bodies
	overflow bool         // messages were dropped: read the log
	waiters  []chan error // catch-ups asked for

	mu         sync.Mutex
	proj       *projections.Request
	lastBySubj subjectSeqs // last stream sequence seen per stored subject
	readPast   uint64      // last stream sequence read from the log, events or not (junk is read once)
	progress   time.Time   // when the last token was accepted
	timing     timing      // where the time before the first token went
	err        error       // a catch-up failure; readers surface it
	unread     time.Time   // since when catch-ups fail (zero once one succeeds)
	// outSeqs is the last batch applied per worker output subject (the
	// stream sequence in the worker's output stream), and routedAt when
	// each attempt was routed (its decision's time): where a read of a
	// batched attempt's output starts (batched.go).
	outSeqs  subjectSeqs
	outNeed  subjectSeqs // per subject, batches up to which were missed live (requireOut)
	routedAt []time.Time
	sealed   []int       // batched attempts whose output is taken no more (seal)
	held     []*outBatch // batches that came before their attempt's routed decision
	foreign  []string    // other frontends' output subjects held (live.holdForeign)
	// readTo: attempts [0, readTo) had their output read back here
	// (readOutput); before that, live batches of the current attempt on
	// another frontend's subject are not applied (unreadOutput).
	readTo int
	// endStored is set once the request log (not a batch) showed the
	// request ended: until then the end of a batched attempt is yet to be
	// copied there (settled).
	endStored bool
}

// liveItem is what a follower queues for run: a republished message of
// its request, or the entries of a batch a worker sent this frontend.
type liveItem struct {
	m   *nats.Msg
	out *outBatch
}

// follow registers for request id's live messages. With history set it
// first reads what the log already holds (ErrNotFound if nothing). parts is
// the request log's layout: the history is read from id's partition.
func follow(ctx context.Context, lv *live, js jetstream.JetStream, parts streams.Partitions, id string, history bool) (*follower, error) {
	f := &follower{
		id: id, js: js, parts: parts, changed: notify.NewSignal(), decided: notify.NewSignal(), subs: lv,
		stopped: make(chan struct{}), done: make(chan struct{}),
		proj: projections.NewRequest(), progress: time.Now(),
	}
	lv.add(f)
	if history {
		if err := f.catchUp(ctx); err != nil {
			f.stop()
			return nil, err
		}
	}
	return f, nil
}

// stop ends the delivery of live messages and the reading goroutine.
func (f *follower) stop() {
	f.subs.remove(f)
	f.qmu.Lock()
	f.halted = true
	f.qmu.Unlock()
	close(f.stopped)
	f.runs.Wait()
	for _, subj := range f.foreign { // run, which holds them, is done
		f.subs.releaseForeign(subj)
	}
	close(f.done)
}

// onLive applies a live message at once when that needs no I/O (no gap,
// and run has nothing in hand, so order is kept), and otherwise queues it
// for run. It never reads the network.
func (f *follower) onLive(m *nats.Msg) {
	f.deliver(func() (bool, bool) { return f.applyLive(m) }, liveItem{m: m}, len(m.Data))
}

// deliver has apply apply it at once when run has nothing in hand (so
// order is kept), and queues it (size bytes) for run when apply cannot
// (ok false: it needs I/O) or run is busy.
func (f *follower) deliver(apply func() (changed, ok bool), it liveItem, size int) {
	f.qmu.Lock()
	if !f.busy && f.idleLocked() {
		changed, ok := apply()
		f.qmu.Unlock()
		if changed {
			f.changed.Notify()
		}
		if ok {
			return
		}
		f.qmu.Lock()
	}
	f.enqueueLocked(it, size)
	f.qmu.Unlock()
	f.poke()
}

// enqueueLocked queues it for run, or, past the bounds, has run read the
// log instead. Called with qmu held.
func (f *follower) enqueueLocked(it liveItem, size int) {
	if len(f.queue) < maxQueued && f.queued+size <= maxQueuedBytes {
		f.queue = append(f.queue, it)
		f.queued += size
	} else {
		f.overflow = true
	}
}

// liveMsg is a republished message as the follower applies it: the rule,
// written once for onLive's fast path and run's, is that a message not
// newer than what was applied is dropped (a replay or redelivery), one that
// follows a gap (its Nats-Last-Sequence is past the last sequence seen of
// its stored subject) waits until the log was read, and any other is
// applied, its sequence recorded even when it does not decode (an unknown
// type is skipped).
type liveMsg struct {
	e         events.Envelope
	decodeErr error
	stored    string
}

func decodeLive(m *nats.Msg) liveMsg {
	e, err := streams.Decode(m)
	return liveMsg{e: e, decodeErr: err, stored: e.Stored}
}

// freshLocked reports whether l is newer than what was applied, and whether a gap
// precedes it. Called with mu held.
func (f *follower) freshLocked(l liveMsg) (fresh, gap bool) {
	return l.e.Seq > f.proj.LastSeq() || l.e.Seq == 0, l.e.LastSeq > f.lastBySubj.get(l.stored)
}

// applyLiveLocked applies l if it is newer than what was applied. Called
// with mu held.
func (f *follower) applyLiveLocked(l liveMsg) (changed bool) {
	if l.e.Seq <= f.proj.LastSeq() {
		return false
	}
	f.lastBySubj.set(l.stored, l.e.Seq)
	return (l.decodeErr == nil || isUnreadable(l.e)) && f.applyLocked(l.e)
}

// applyLive applies m unless a gap precedes it (ok false: run must read the
// log first).
func (f *follower) applyLive(m *nats.Msg) (changed, ok bool) {
	l := decodeLive(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	switch fresh, gap := f.freshLocked(l); {
	case !fresh:
		return false, true // already applied
	case gap:
		return false, false
	}
	return f.applyLiveLocked(l), true
}

// readAgain has run read the log past what was applied (an end was stored
// in the ends place), without waiting for it.
func (f *follower) readAgain() {
	f.qmu.Lock()
	f.overflow = true
	f.qmu.Unlock()
	f.poke()
}

// poke has run do what was queued: it starts run unless it runs (it then
// sees the queue before it returns) or the follower was stopped.
func (f *follower) poke() {
	f.qmu.Lock()
	defer f.qmu.Unlock()
	if f.running || f.halted {
		return
	}
	f.running = true
	f.runs.Add(1)
	go f.run()
}

// idleLocked reports that nothing is queued for run. Called with qmu held.
func (f *follower) idleLocked() bool {
	return len(f.queue) == 0 && !f.overflow && len(f.waiters) == 0
}

// catchUp asks run to read whatever the log holds past what was applied, and
// waits for the outcome.
func (f *follower) catchUp(ctx context.Context) error {
	ch := make(chan error, 1)
	f.qmu.Lock()
	f.waiters = append(f.waiters, ch)
	f.qmu.Unlock()
	f.poke()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-f.done:
		return errStopped
	}
}

// run applies queued live messages and does the catch-ups until none is
// left or the follower is stopped. What is queued while it runs (under qmu,
// then poked) it sees before it returns.
func (f *follower) run() {
	defer f.runs.Done()
	for {
		for f.drain() {
		}
		f.qmu.Lock()
		if f.halted || f.idleLocked() {
			f.running = false
			f.qmu.Unlock()
			return
		}
		f.qmu.Unlock()
	}
}

// drain does what is in hand: the catch-ups asked for, then the queued
// messages. It reports false once nothing was left; until then onLive
// queues behind it, so events are applied in order.
func (f *follower) drain() bool {
	f.qmu.Lock()
	items, overflow, waiters := f.queue, f.overflow, f.waiters
	f.queue, f.queued, f.overflow, f.waiters = nil, 0, false, nil
	f.busy = len(items) > 0 || overflow || len(waiters) > 0
	busy := f.busy
	f.qmu.Unlock()
	if !busy {
		return false
	}
	changed := false
	if overflow || len(waiters) > 0 {
		err := f.readLog()
		for _, w := range waiters {
			w <- err
		}
		changed = true
	}
	for _, it := range items {
		if it.out != nil {
			changed = f.batch(it.out) || changed
		} else {
			changed = f.live(it.m) || changed
		}
	}
	if changed {
		f.changed.Notify()
	}
	return true
}

// live applies one republished message, reading the log first if messages
// of its subject were stored that this follower never saw.
func (f *follower) live(m *nats.Msg) bool {
	l := decodeLive(m)
	f.mu.Lock()
	fresh, gap := f.freshLocked(l)
	f.mu.Unlock()
	if !fresh {
		return false
	}
	changed := false
	if gap {
		_ = f.readLog() // a failure is kept in f.err until a catch-up succeeds
		changed = true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applyLiveLocked(l) || changed
}

// isUnreadable reports an event this build cannot read, which the fold
// steps over with its reason, as a replay of the log does.
func isUnreadable(e events.Envelope) bool {
	_, ok := e.Event.(events.Unreadable)
	return ok
}

// apply folds e, an event this process appended itself.
func (f *follower) apply(e events.Envelope) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applyLocked(e)
}

func (f *follower) applyLocked(e events.Envelope) bool {
	before := f.proj.Len()
	if e.Seq != 0 && e.Stored != "" {
		f.lastBySubj.set(e.Stored, max(f.lastBySubj.get(e.Stored), e.Seq))
	}
	changed := f.proj.Apply(e)
	if _, ended := e.Event.(events.RequestEnded); (e.Seq != 0 || ended) && f.proj.Status.Terminal() {
		f.endStored = true
	}
	if n := f.proj.Len(); n != before {
		f.progress = time.Now()
		f.timing.note(e, before)
	}
	_, delta := e.Event.(events.TokensGenerated)
	switch {
	case delta && e.Header != nil:
		f.noteConsolidated(e)
	case changed && !delta:
		f.noteRouted(e)
		f.decided.Notify()
	}
	return changed
}

// view runs fn on the projection under the lock; fn must not keep references.
func (f *follower) view(fn func(p *projections.Request)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f.proj)
}

// read runs fn on the projection, the time of the last accepted token and
// since when catch-ups fail (zero while they succeed), under the lock; fn
// must not keep references.
func (f *follower) read(fn func(p *projections.Request, progress, unread time.Time)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f.proj, f.progress, f.unread)
}

// eventsSeq is the last sequence seen on the request's events subject: the
// expectation for the next decision appended there.
func (f *follower) eventsSeq() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastBySubj.get(streams.RequestEvents(f.id))
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
