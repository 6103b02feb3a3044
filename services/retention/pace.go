package retention

import (
	"context"
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
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
// back and the next is sent, so a token waits for about one purge (p99 9-12
// ms there). The burst's compactions take longer to finish: up to a second
// more there, and at 4,000 × 50, where each purge reads 4,000 streams'
// traffic, 20 s after the last stream against 2 s (MaxWaiting bounds it).
// (Pausing after each purge as long as it took, tried too, gave 5-10 ms at
// p99, but finished the last compaction 4-6 s past the run, and the NATS
// server spent 20-40% more CPU a token; not profiled.)

// MaxWaiting is how many purges of one stream may wait for their turn.
// When the server cannot purge as fast as requests end (the purges' cost
// grows with the streams running beside them), one more is skipped rather
// than waited for without bound: its compact record is stored, so every
// reader folds the record, and its deltas stay until eviction.
const MaxWaiting = 1024

// ErrPurgeSkipped means MaxWaiting purges of the stream were waiting.
var ErrPurgeSkipped = errors.New("retention: purge skipped: too many purges of the stream waiting")

// Pacer runs purges one at a time per stream (Do). A nil *Pacer runs every
// purge at once.
type Pacer struct {
	skipped *prometheus.CounterVec // by stream; nil: not counted
	mu      sync.Mutex
	lines   map[string]*line
}

// line is one stream's purges: a token, held by the one under way, and how
// many wait for it.
type line struct {
	turn    chan struct{}
	waiting int
}

// NewPacer returns an empty Pacer.
func NewPacer() *Pacer { return &Pacer{lines: map[string]*line{}} }

// Do runs purge, a purge of stream, once no other purge of stream is under
// way (callers wait in the order they came), and returns its error, or
// ctx's if ctx ends first, or ErrPurgeSkipped if MaxWaiting purges of
// stream wait already (in both cases purge never ran).
func (pc *Pacer) Do(ctx context.Context, stream string, purge func(context.Context) error) error {
	if pc == nil {
		return purge(ctx)
	}
	pc.mu.Lock()
	l, ok := pc.lines[stream]
	if !ok {
		l = &line{turn: make(chan struct{}, 1)}
		pc.lines[stream] = l
	}
	if l.waiting >= MaxWaiting {
		pc.mu.Unlock()
		if pc.skipped != nil {
			pc.skipped.WithLabelValues(stream).Inc()
		}
		return ErrPurgeSkipped
	}
	l.waiting++
	pc.mu.Unlock()
	var err error
	select {
	case l.turn <- struct{}{}:
	case <-ctx.Done():
		err = ctx.Err()
	}
	pc.mu.Lock()
	l.waiting--
	pc.mu.Unlock()
	if err != nil {
		return err
	}
	defer func() { <-l.turn }()
	return purge(ctx)
}
