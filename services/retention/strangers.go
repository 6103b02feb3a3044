package retention

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/baton-dev/baton/streams"
)

// Writers without a lease: a worker credential does not need one to write,
// so the guard also finds writers by the worker their subjects name.

// checkStrangers finds the writers of stream that the view holds no lease
// of (never registered, or crashed: a credential does not need a lease to
// write), by the worker its subject names, in writerSamples messages of
// any writer at even steps of what was written since before (more while
// the partition grows fast), and checks what each such stranger wrote, as
// a live worker's writes are checked, at this reading and every reading
// for strangerFor after it was last seen: its junk is purged and it is
// quarantined by its worker id (Fleet.Junk), lease or not. Workers ws
// (leased) and q (quarantined, swept) are no strangers.
func (g *Guard) checkStrangers(ctx context.Context, f Fleet, before, u streams.Usage, fast bool, ws, q []string) {
	now := time.Now()
	from, to := lookFrom(before, u, fast), u.LastSeq
	if before.LastSeq > 0 {
		from = max(from, before.LastSeq+1) // nothing new since: no question asked
	}
	n := uint64(writerSamples)
	if fast {
		n = fastChecks
	}
	if from <= to {
		step := max(1, (to-from+1)/n)
		for seq, i := from, uint64(0); i < n && seq <= to && ctx.Err() == nil; i++ {
			msg, ok, err := streams.NextTokensBare(ctx, g.js, u.Stream, seq)
			if err != nil || !ok {
				break
			}
			seq = max(msg.Sequence+1, from+(i+1)*step)
			w := tokensWriter(msg.Subject)
			if w == "" || slices.Contains(ws, w) || slices.Contains(q, w) {
				continue
			}
			key := u.Stream + " " + w
			if _, known := g.strangers[key]; !known {
				if len(g.strangers) >= strangersMax {
					continue
				}
				g.log.Info("a writer without a lease in the request log: checking it", "worker_id", w, "stream", u.Stream)
			}
			g.strangers[key] = now.Add(strangerFor)
		}
	}
	for key, until := range g.strangers {
		stream, w, _ := strings.Cut(key, " ")
		switch {
		case stream != u.Stream:
			continue
		case now.After(until) || slices.Contains(ws, w) || slices.Contains(q, w):
			delete(g.strangers, key) // gone quiet, leased since, or quarantined
			delete(g.checked, key)
			continue
		}
		g.checked[key] = g.check(ctx, u.Stream, w, f, max(g.checked[key]+1, lookFrom(before, u, fast)), u.LastSeq, checkSamples, true)
	}
}

// tokensWriter is the worker a tokens subject names ("" for any other).
func tokensWriter(subject string) string {
	rs, err := streams.ParseRequestSubject(subject)
	if err != nil || rs.Kind != "tokens" {
		return ""
	}
	return rs.Worker
}
