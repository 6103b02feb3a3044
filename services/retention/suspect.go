package retention

import (
	"context"
	"slices"
	"time"

	"github.com/baton-dev/baton/streams"
)

// suspect is a large message of a worker's tokens subject that a reader saw
// go by: where it is stored, and its size.
type suspect struct {
	stream, worker string
	msg            seen
}

// SuspectSize is the size from which a message a reader sees is worth
// judging at once (Suspect): a junk message this large quarantines its
// worker at once.
const SuspectSize = junkLarge

// suspectsQueued bounds the suspects waiting for Run; more are dropped (the
// readings find what they miss).
const suspectsQueued = 64

// Suspect has Run judge at once the message at seq of stream, on a
// worker's tokens subject, which a reader saw go by and which is
// SuspectSize bytes or more (size): junk of that size on the worker's own
// running attempt would otherwise wait for a reading's samples to meet it,
// seconds on a loaded machine, while it fills the log and every reader of
// the request's live messages. It never blocks.
func (g *Guard) Suspect(stream, subject string, seq uint64, size int) {
	if size < SuspectSize || seq == 0 {
		return // small, or not as the stream stored it (no sequence)
	}
	rs, err := streams.ParseRequestSubject(subject)
	if err != nil || rs.Worker == "" {
		return // not a worker's subject (a large accepted event): no room taken in the queue
	}
	select {
	case g.suspects <- suspect{stream, rs.Worker, seen{subject, seq, size}}:
	default:
	}
}

// judgeQueued judges the suspects queued now (Run's goroutine). A reading
// calls it between its questions, each of which may take long under a
// flood: a suspect waits for one question, not for the whole reading.
func (g *Guard) judgeQueued(ctx context.Context) {
	for {
		select {
		case s := <-g.suspects:
			g.judgeSuspect(ctx, s)
		default:
			return
		}
	}
}

// judgeSuspect judges a suspect (Run's goroutine).
func (g *Guard) judgeSuspect(ctx context.Context, s suspect) {
	g.mu.Lock()
	f := g.fleet
	g.mu.Unlock()
	if f == nil {
		return
	}
	if at, ok := g.quarantinedAt[s.worker]; (ok && time.Since(at) < QuarantineFor) || slices.Contains(f.Quarantined(), s.worker) {
		return // a quarantined worker's writes are swept already
	}
	// What the reader saw is what the stream stored (the server republished
	// it, with its sequence): judged without getting it again, which under a
	// flood of large messages took 0.6 s a get.
	g.judgeMsg(ctx, s.stream, s.worker, f, s.msg, time.Now())
}
