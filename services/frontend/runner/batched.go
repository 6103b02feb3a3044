package runner

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// A batched attempt (docs/internals.md, "The write path of many tokens per
// message"): its worker writes its deltas and its end in batches, many
// attempts a message, to its own output stream, on the subject of the
// frontend that dispatched it (streams.WorkerOutput(worker, OutputTo)). The
// rules that keep every reader's fold the same:
//
//   - A reader folds the attempt's entries in the worker stream's order, up
//     to its first closing entry: the worker's completion or failure, or a
//     frontend's fence, which is stored among the worker's batches
//     (streams.AppendOutputFence) so that it is ordered with them.
//   - The owner follows its subject live (live.deliverBatch); any follower
//     reads the attempt's output back when it catches up (readOutput), from
//     the last batch it applied, or the last consolidation it folded, or
//     the attempt's routed decision.
//   - The owner copies what it folded to the request's partition
//     (consolidate): every second while the attempt runs, and once it is
//     closed, with the closing event, before any decision that follows it.
//     So the partition alone says how every closed attempt ends, and a
//     reader that predates batches folds the attempt from it, late.

// outBatch is the part of a batch that concerns one request: its entries,
// in order, and the batch's place in its worker's stream.
type outBatch struct {
	subject string // the stored subject, streams.WorkerOutput(worker, owner)
	seq     uint64
	entries []events.Envelope
	live    bool // delivered by a subscription, not read back
	// again: read back as the last batch the fold had noted (readOutput),
	// applied once more.
	again bool
}

// outputReadMargin is how long before an attempt's routed decision (its
// producer's clock) a read of its output starts, when nothing of it was
// read yet: clocks differ between a frontend and the server.
const outputReadMargin = 10 * time.Second

// HeaderOutSeq is the consolidated delta's extension attribute: the last
// batch (its sequence in the worker's output stream) whose entries it
// covers. A reader reads the attempt's output back from the next one.
const HeaderOutSeq = "ce-outseq"

// onBatch applies b at once when that needs no I/O, as onLive does, and
// queues it for run otherwise.
func (f *follower) onBatch(b *outBatch) {
	size := 0
	for _, e := range b.entries {
		if d, ok := e.Event.(events.TokensGenerated); ok {
			for _, t := range d.Tokens {
				size += len(t)
			}
		}
	}
	f.deliver(func() (bool, bool) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.applyBatchLocked(b)
	}, liveItem{out: b}, size)
}

// maxHeld bounds the batches a follower holds for an attempt whose routed
// decision it has not folded yet; past it, it reads the log instead.
const maxHeld = 64

// batch is run's onBatch: it reads the log first when b could not be held
// for an attempt whose routed decision was not folded yet (the read folds
// the decision, then reads the attempt's output, b included).
func (f *follower) batch(b *outBatch) bool {
	f.mu.Lock()
	changed, ok := f.applyBatchLocked(b)
	f.mu.Unlock()
	if !ok {
		_ = f.readLog()
		return true
	}
	return changed
}

// applyBatchLocked applies b's entries unless b was applied already. A
// batch of an attempt whose routed decision is not folded yet (the worker
// was told of it before this frontend folded it), and any batch after it,
// is held until the decision is folded (heldLocked); ok is false, and
// nothing applied, when no more can be held. Called with mu held.
//
// A live batch that follows batches this follower was told it missed
// (requireOut) is not applied (ok false) until it has read them back: an
// attempt's end applied after a gap would end it short of its tokens. (A
// delta past the fold's offset is no sign of a missed batch: a worker's
// repair of a delta whose append failed follows the deltas after it, as
// on the per-token path, and the fold takes it.)
func (f *follower) applyBatchLocked(b *outBatch) (changed, ok bool) {
	if last := f.outSeqs.get(b.subject); b.seq < last || b.seq == last && !b.again {
		return false, true
	}
	if b.live && f.outNeed.get(b.subject) > f.outSeqs.get(b.subject) {
		return false, false
	}
	unrouted := len(f.held) > 0
	for _, e := range b.entries {
		if k, out := events.AttemptOutput(e.Event); out && k >= len(f.proj.Attempts) && !f.proj.Status.Terminal() {
			unrouted = true
		}
	}
	if unrouted {
		if len(f.held) >= maxHeld {
			return false, false
		}
		f.held = append(f.held, b)
		return false, true
	}
	if b.live && f.unreadOutput(b) {
		return false, false
	}
	for _, e := range b.entries {
		k, _ := events.AttemptOutput(e.Event)
		if slices.Contains(f.sealed, k) {
			continue
		}
		changed = f.applyLocked(e) || changed
	}
	if b.live && f.proj.Gapped() {
		// Output past a gap, not filled by this batch: batches this
		// follower never got (a read back that came up short) or a
		// worker's repair still to come. The place stays before this
		// batch, and run reads the output back from there (ok false),
		// once for each such batch: what was missed comes with it.
		return changed, false
	}
	f.outSeqs.set(b.subject, b.seq)
	return changed, true
}

// unreadOutput reports whether b, a live batch, holds output of the
// current attempt, batched on another frontend's subject, that this
// follower has not read back yet (readTo). Batches stored there before it
// followed the attempt were delivered to that frontend's followers, or to
// this frontend's followers of other requests on the same subject (several
// requests taken over from one frontend), never to it: applied first, a
// live batch would move its place in the subject (outSeqs) past output it
// never read, and the attempt's end would end the answer without it (the
// churn soak with --batched-output stored such answers completed with 1 of
// 198 tokens). On its own frontend's subject, every batch of an attempt
// comes after its follower began: the attempt was dispatched from here.
// Called with mu held.
func (f *follower) unreadOutput(b *outBatch) bool {
	cur, ok := f.proj.Current()
	if !ok || !cur.Batched() || cur.Closed || f.readTo > cur.Attempt || cur.OutputTo == f.subs.self() {
		return false
	}
	for _, e := range b.entries {
		if k, out := events.AttemptOutput(e.Event); out && k == cur.Attempt {
			return true
		}
	}
	return false
}

// requireOut tells the follower that batches on subject up to sequence
// seq were not delivered to it: it reads them back before it applies a
// live batch of subject again.
func (f *follower) requireOut(subject string, seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.outNeed.set(subject, max(f.outNeed.get(subject), seq))
}

// seal has the follower take nothing more of batched attempt k from its
// worker's stream: the attempt is closed on the partition at what it holds
// (batcher.fence, when the worker's stream refuses the fence).
func (f *follower) seal(k int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Contains(f.sealed, k) {
		f.sealed = append(f.sealed, k)
	}
}

// noteRouted records when an attempt was routed (where a read of a batched
// attempt's output starts when nothing of it was read), and applies the
// batches held for want of that decision. Called with mu held, for an
// event folded.
func (f *follower) noteRouted(e events.Envelope) {
	var k int
	switch ev := e.Event.(type) {
	case events.RequestRouted:
		k = ev.Attempt
	case events.RequestAccepted:
		if ev.Route == nil {
			return
		}
	default:
		return
	}
	for len(f.routedAt) <= k {
		f.routedAt = append(f.routedAt, time.Time{})
	}
	f.routedAt[k] = e.Time
	f.applyHeldLocked()
}

// applyHeldLocked applies, in order, the batches held for want of a routed
// decision, once one was folded; those still early stay held. Called with
// mu held.
func (f *follower) applyHeldLocked() {
	held := f.held
	f.held = nil
	refused := false
	for _, b := range held {
		if _, ok := f.applyBatchLocked(b); !ok { // held again if still early
			refused = true
		}
	}
	if refused {
		// Output not read back yet (unreadOutput): run reads it, and the
		// refused batches with it. Not here: mu is held, and readAgain
		// takes qmu, which is taken before mu.
		go f.readAgain()
	}
}

// noteConsolidated records the worker-stream position a consolidated delta
// of a batched attempt covers. Called with mu held.
func (f *follower) noteConsolidated(e events.Envelope) {
	// Every delta of a per-token attempt comes here: it is passed over
	// at the first look at its attempt.
	d, ok := e.Event.(events.TokensGenerated)
	if !ok || d.Attempt < 0 || d.Attempt >= len(f.proj.Attempts) || !f.proj.Attempts[d.Attempt].Batched() {
		return
	}
	v := e.Header[HeaderOutSeq]
	if len(v) == 0 {
		return
	}
	a := f.proj.Attempts[d.Attempt]
	if seq, err := strconv.ParseUint(v[0], 10, 64); err == nil {
		subj := streams.WorkerOutput(a.WorkerID, a.OutputTo)
		f.outSeqs.set(subj, max(f.outSeqs.get(subj), seq))
	}
}

// settled reports whether the request ended, as the request log says it:
// a request whose batched attempt ended in its worker's stream is not
// settled until its end was copied to the log (by its owner, or by a
// frontend that takes it over because the owner died first).
func (f *follower) settled() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.proj.Status.Terminal() {
		return false
	}
	cur, _ := f.proj.Current()
	return f.endStored || !cur.Batched()
}

// batchedOn reports whether the follower's current attempt is batched, open
// and written by worker (any worker: "").
func (f *follower) batchedOn(worker string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, ok := f.proj.Current()
	return ok && cur.Batched() && !cur.Closed && (worker == "" || cur.WorkerID == worker)
}

// claimBatched takes over each request followed here that owner, a
// frontend that departed, owned, whose current attempt is batched and
// which the log does not show ended (settled): a client of it resumed
// here, say, while owner's key was still alive. Per-token requests are
// left to the adopters, as before: their workers store their ends.
func (rn *Runner) claimBatched(ctx context.Context, owner string) {
	for _, t := range rn.requests.followed() {
		var orphan bool
		t.f.view(func(p *projections.Request) {
			cur, _ := p.Current()
			orphan = p.Owner == owner && cur.Batched()
		})
		if orphan && !t.f.settled() {
			rn.ensureOwner(ctx, t)
		}
		rn.requests.release(t)
	}
}

// batcher is the runtime's part for the batched attempts of the requests
// this frontend owns: it asks workers for batches, and fences and copies
// batched attempts. It is safe for concurrent use; consolidate is called
// only by t's runner.
type batcher struct {
	on        bool // --batched-output
	js        jetstream.JetStream
	events    *streams.Log
	decisions decisions
	fleet     Fleet
	log       *slog.Logger
}

// ask sets d to ask w for batches when this frontend follows them, w
// writes them (its lease says it has its output stream), and every live
// frontend reads them (FrontendPresence.ReadsBatched: an earlier release,
// or a frontend without the switch, reads a batched attempt only from its
// copies, and could not take it over).
func (bt *batcher) ask(w projections.Worker, d *events.Dispatch) {
	if bt.on && w.WritesBatched && everyFrontend(bt.fleet, func(f projections.Frontend) bool { return f.ReadsBatched }) {
		d.Output = events.OutputBatched
	}
}

// consolidateEvery is how often the owner copies a running batched
// attempt's output to the partition: how late a reader that reads only the
// partition (an earlier release, another frontend's client) sees it.
const consolidateEvery = time.Second

// consolidated is what was copied of one attempt to the partition: its
// tokens through offset through, when, and whether its closing event.
type consolidated struct {
	through int
	at      time.Time
	closed  bool
}

// consolidate copies t's batched attempts to the request's partition, on
// each one's tokens subject: the tokens its fold holds that were not copied
// yet (at most every consolidateEvery while the attempt runs), then, once it
// is closed, the event that closed it. The runner calls it before every
// step, so that whatever it decides after an attempt closed is stored
// after that attempt's copy. A copy that fails is tried again at the next
// step. It returns when the next copy of a running attempt is due (zero:
// none).
func (bt *batcher) consolidate(ctx context.Context, t *Request) time.Time {
	todo, due := copiesDue(t, time.Now())
	var last uint64
	defer func() {
		if last > 0 { // folded before what the step stores next (compaction's plan included)
			bt.decisions.awaitFolded(ctx, t, last)
		}
	}()
	for _, cp := range todo {
		seq, err := bt.store(ctx, t, cp)
		last = max(last, seq)
		if err != nil {
			bt.log.Warn("consolidate batched attempt", "request_id", t.id, "attempt", cp.k, "err", err)
			return time.Now().Add(retryAfterError)
		}
	}
	return due
}

// copyOf is one copy of attempt k that consolidate stores.
type copyOf struct {
	k       int
	subject string
	delta   *events.TokensGenerated
	closing events.Event
	outSeq  uint64
	// completedAt is the completion's time in the fold, which its copy
	// keeps.
	completedAt time.Time
}

// copiesDue is what of t's batched attempts is to be copied at now, and
// when the next copy of a running one is due.
func copiesDue(t *Request, now time.Time) (todo []copyOf, due time.Time) {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	p := t.f.proj
	for len(t.cons) < len(p.Attempts) {
		t.cons = append(t.cons, consolidated{through: p.Attempts[len(t.cons)].StartOffset})
	}
	for k, a := range p.Attempts {
		c := t.cons[k]
		if !a.Batched() || c.closed {
			continue
		}
		closing, closed := p.Closing(k)
		ended := closed || p.Status.Terminal()
		if !ended && now.Sub(c.at) < consolidateEvery {
			due = c.at.Add(consolidateEvery)
			continue
		}
		cp := copyOf{k: k, subject: streams.RequestTokens(t.id, k, a.WorkerID),
			outSeq: t.f.outSeqs.get(streams.WorkerOutput(a.WorkerID, a.OutputTo))}
		if d, ok := p.Consolidation(k, c.through); ok {
			cp.delta = &d
		}
		if closed {
			cp.closing, cp.completedAt = closing, time.Unix(p.CompletedAt, 0)
		}
		if cp.delta != nil || cp.closing != nil {
			todo = append(todo, cp)
		} else if ended {
			t.cons[k].closed = true
		}
		if !ended {
			due = now.Add(consolidateEvery)
		}
	}
	return todo, due
}

// store appends cp (its delta, then its closing event) and records it in
// t.cons; seq is the last stream sequence it stored.
func (bt *batcher) store(ctx context.Context, t *Request, cp copyOf) (seq uint64, err error) {
	c := &t.cons[cp.k]
	if cp.delta != nil {
		// Its id names the range it copies: two frontends' copies of
		// different ranges from one offset (an owner's, then a taker's)
		// are two messages, not one and a duplicate.
		end := cp.delta.Offset + len(cp.delta.Tokens)
		id := events.ID(t.id, cp.k, cp.delta.Offset, end, "c") // projections.IsConsolidation
		m, err := streams.NewMsg(cp.subject, bt.events.Envelope(id, t.id, *cp.delta))
		if err != nil {
			return 0, err
		}
		m.Header.Set(HeaderOutSeq, strconv.FormatUint(cp.outSeq, 10))
		if seq, err = bt.events.AppendMsg(ctx, m, -1); err != nil {
			return 0, err
		}
		c.through, c.at = end, time.Now()
	}
	if cp.closing != nil {
		env := bt.events.Envelope(events.ID(t.id, cp.k, "closed"), t.id, cp.closing)
		if _, ok := cp.closing.(events.RequestCompleted); ok {
			env.Time = cp.completedAt // a reader's CompletedAt is the worker's, not the copy's
		}
		s, err := bt.events.Append(ctx, cp.subject, env, -1)
		if err != nil {
			return seq, err
		}
		seq, c.closed = s, true
	}
	return seq, nil
}

// fence closes attempt ev.Attempt of t in the log. A batched attempt is
// closed among its worker's batches (streams.AppendOutputFence), and this
// frontend folds its output through the fence before it returns; where
// the worker's stream refuses the fence (full, or gone), the attempt is
// sealed here, copied to the partition, and closed there, as a per-token
// attempt is.
func (bt *batcher) fence(ctx context.Context, t *Request, ev events.AttemptFailed) {
	var a projections.Attempt
	t.f.view(func(p *projections.Request) {
		if ev.Attempt >= 0 && ev.Attempt < len(p.Attempts) {
			a = p.Attempts[ev.Attempt]
		}
	})
	if !a.Batched() || a.Closed {
		bt.decisions.fence(ctx, ev)
		return
	}
	id := events.ID(t.id, ev.Attempt, "fenced")
	_, err := streams.AppendOutputFence(ctx, bt.js, a.WorkerID, a.OutputTo, bt.events.Source(), id, ev)
	if err == nil {
		// Folds the attempt's output through the fence; the runner's
		// next step copies it to the partition before it decides.
		catchUp(ctx, t)
		return
	}
	bt.log.Warn("fence batched attempt in its worker's stream; sealing it here", "request_id", t.id, "attempt", ev.Attempt, "err", err)
	t.f.seal(ev.Attempt)
	bt.consolidate(ctx, t)
	bt.decisions.fence(ctx, ev)
}
