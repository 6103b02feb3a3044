package runner

import (
	"context"
	"errors"
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
