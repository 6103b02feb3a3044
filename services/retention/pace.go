package retention

import (
	"context"
	"sync"
)

// A purge locks the stream's file store for as long as it reads (see
// streams.PurgeSubjectsThrough): every append to the stream waits for it.
// One purge is a millisecond or two, but compactions come in bursts
// (requests started together end together), and purges sent at once queue
// in the server and take the lock one after another for as long as the
// burst lasts: at 1,000 streams × 5 tokens/s, with half the machine idle,
// the tokens of the streams still running then waited up to 200 ms at p99
// (BENCHMARKS.md). A Pacer sends one purge of a stream at a time: between
// two, the appends that queued behind the first go while the answer comes
// back and the next is sent, so a token waits for about one purge (p99 9-11
// ms there), and the burst's compactions finish up to a second later.
// (Pausing after each purge as long as it took, tried too, gave 5-10 ms at
// p99, but finished the last compaction 4-6 s past the run, and the NATS
// server spent 20-40% more CPU a token; not profiled.)

// Pacer runs purges one at a time per stream (Do). A nil *Pacer runs every
// purge at once.
type Pacer struct {
	mu    sync.Mutex
	turns map[string]chan struct{} // per stream: a token, held by the purge under way
}

// NewPacer returns an empty Pacer.
func NewPacer() *Pacer { return &Pacer{turns: map[string]chan struct{}{}} }

// Do runs purge, a purge of stream, once no other purge of stream is under
// way (callers wait in the order they came), and returns its error, or
// ctx's if ctx ends first (then purge never ran).
func (pc *Pacer) Do(ctx context.Context, stream string, purge func(context.Context) error) error {
	if pc == nil {
		return purge(ctx)
	}
	pc.mu.Lock()
	turn, ok := pc.turns[stream]
	if !ok {
		turn = make(chan struct{}, 1)
		pc.turns[stream] = turn
	}
	pc.mu.Unlock()
	select {
	case turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-turn }()
	return purge(ctx)
}
