package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
)

// readLog reads the log past the last applied sequence, without holding mu
// while it waits for the network, and applies what it got. Its outcome is
// kept in f.err, which readers see, until the next catch-up. Only run calls it.
func (f *follower) readLog() error {
	f.mu.Lock()
	from := max(f.proj.LastSeq(), f.readPast) + 1
	for _, s := range f.lastBySubj {
		from = max(from, s.seq+1)
	}
	f.mu.Unlock()
	// stop cuts a read short, so that releasing a request never waits on
	// the network.
	ctx, cancel := context.WithTimeout(context.Background(), streams.DefaultTimeout)
	defer cancel()
	read := make(chan struct{})
	defer close(read)
	go func() {
		select {
		case <-f.stopped:
			cancel()
		case <-read:
		}
	}()
	var got []events.Envelope
	var err error
	var past uint64
	for e, rerr := range streams.ReadRequestPast(ctx, f.js, f.parts, f.id, from, &past) {
		if rerr != nil {
			if !errors.Is(rerr, streams.ErrNotFound) || from <= 1 {
				err = rerr
			}
			break
		}
		got = append(got, e)
	}
	if err == nil && len(got) == 0 && from > 1 {
		err = f.gone(ctx)
	}
	f.mu.Lock()
	for _, e := range got {
		f.applyLocked(e)
	}
	f.readPast = max(f.readPast, past)
	f.mu.Unlock()
	if err == nil {
		err = f.readOutput(ctx)
	}
	f.mu.Lock()
	f.err = err
	first := err != nil && f.unread.IsZero()
	switch {
	case err == nil:
		f.unread = time.Time{}
	case first:
		f.unread = time.Now()
	}
	f.mu.Unlock()
	if first {
		f.decided.Notify() // the runner decides nothing while it cannot read
	}
	return err
}

// errGone means the request's events were purged from the log (it was
// evicted) before this follower folded its end, which is then lost to it.
var errGone = errors.New("runner: the request is no longer in the log (evicted) and its end was not read")

// gone reports errGone when a read found nothing new for a request this
// follower knows and has not seen end, and its events subject, whose first
// message is its acceptance, is empty: an eviction purged it (a missed
// end, then a full log's eviction of the finished request). Readers then
// see a catch-up that fails (the runner ends the request, log_unreadable)
// instead of waiting for an end that can no longer come. Any other answer
// leaves the log's word standing.
func (f *follower) gone(ctx context.Context) error {
	f.mu.Lock()
	pending := f.proj.Known() && !f.proj.Status.Terminal()
	f.mu.Unlock()
	if !pending {
		return nil
	}
	m, err := streams.LastOnSubject(ctx, f.js, f.parts.StreamOf(f.id), streams.RequestEvents(f.id))
	if err != nil || m != nil {
		return nil
	}
	return errGone
}

// readOutput reads the current attempt's output back from its worker's
// stream, when it is batched and open, and applies it. A stream that is
// gone holds nothing more to read. Only run calls it (through readLog).
func (f *follower) readOutput(ctx context.Context) error {
	f.mu.Lock()
	cur, ok := f.proj.Current()
	open := ok && cur.Batched() && !cur.Closed && !f.proj.Status.Terminal()
	subj := streams.WorkerOutput(cur.WorkerID, cur.OutputTo)
	held := slices.Contains(f.foreign, subj)
	// Nothing else moves outSeqs while run reads: live batches queue
	// behind it.
	from := f.outSeqs.get(subj)
	var since time.Time
	if from == 0 && cur.Attempt < len(f.routedAt) {
		since = f.routedAt[cur.Attempt].Add(-outputReadMargin)
	}
	f.mu.Unlock()
	if !open {
		return nil
	}
	// Another frontend's subject: followed live from now on, and read
	// back below from before.
	if cur.OutputTo != f.subs.self() && !held && f.subs.holdForeign(cur.WorkerID, cur.OutputTo) {
		f.mu.Lock()
		f.foreign = append(f.foreign, subj)
		f.mu.Unlock()
	}
	// What this frontend's subscription delivered before this follower
	// read was delivered to the followers there were then, not to this
	// one: its read must reach it. Without that, a follower that joins a
	// subject another one holds (several requests taken over from one
	// frontend) and reads short (a replica behind its leader, a leader
	// that did not answer in time) has a gap that no live batch shows,
	// and its attempt ends short of its tokens when the end comes.
	if d := f.subs.delivered(subj); d > 0 {
		f.requireOut(subj, d)
	}
	// The read starts at the last batch noted, not after it: a copy's
	// outseq names the batch of its last token, and that batch may also
	// hold the attempt's end, whose own copy was never stored (its owner
	// died between the two appends). The fold takes what it already has
	// as a duplicate.
	var got []*outBatch
	for b, err := range streams.ReadWorkerOutput(ctx, f.js, cur.WorkerID, cur.OutputTo, from, since, 0) {
		if errors.Is(err, streams.ErrNotFound) {
			break
		}
		if err != nil {
			return err
		}
		got = append(got, &outBatch{subject: subj, seq: b.Seq, entries: entriesOf(f.id, b.Entries), again: from > 0 && b.Seq == from})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range got {
		if _, ok := f.applyBatchLocked(b); !ok {
			break // held no more: read again
		}
	}
	if need, read := f.outNeed.get(subj), f.outSeqs.get(subj); need > read {
		return fmt.Errorf("read %s back through %d: got to %d", subj, need, read)
	}
	f.readTo = max(f.readTo, cur.Attempt+1)
	return nil
}

// entriesOf keeps the entries of request id.
func entriesOf(id string, entries []events.Envelope) []events.Envelope {
	var mine []events.Envelope
	for _, e := range entries {
		if e.Subject == id {
			mine = append(mine, e)
		}
	}
	return mine
}
