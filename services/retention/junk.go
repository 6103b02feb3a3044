package retention

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

// What the Guard makes of a worker's message: junk or not (judge, classify),
// and what it does with junk (judgeJunk, quarantine, purgeAll, sweep).

// judgeJunk deals with a message of size bytes, junk of worker's for why: a
// large one quarantines it at once; a small one is junk at all, or an
// honest worker's late delta, as the count of its junk says.
func (g *Guard) judgeJunk(ctx context.Context, stream, worker string, f Fleet, size int, why string) {
	if size >= junkLarge {
		g.quarantine(ctx, f, stream, worker, fmt.Sprintf("a %d-byte message %s", size, why))
		return
	}
	subjects, err := streams.WorkerSubjects(ctx, g.js, stream, worker)
	if err != nil {
		return
	}
	keys := sortedKeys(subjects, sweepMax)
	junk, _, absent := g.classifyBatched(ctx, stream, keys, lastOfSubject)
	many, late := 0, 0
	for _, subj := range junk {
		if !absent[subj] && g.ownAttempt(ctx, stream, subj, worker) {
			late += int(subjects[subj]) // after its request ended: purged, counted apart
		} else {
			many += int(subjects[subj])
		}
	}
	if many >= junkMany || late >= lateMany {
		g.quarantine(ctx, f, stream, worker, fmt.Sprintf("%d messages, the last %s", many+late, why))
		return
	}
	g.purgeAll(ctx, stream, junk)
}

// storedSize is msg's size as the guard counts it: its data and its
// headers.
func storedSize(msg *jetstream.RawStreamMsg) int {
	size := len(msg.Data)
	for k, vs := range msg.Header {
		for _, v := range vs {
			size += len(k) + len(v)
		}
	}
	return size
}

// ownAttempt reports whether subject, a tokens subject of worker's, is
// that of an attempt routed to worker: what it wrote there is junk only
// for having come after the request ended.
func (g *Guard) ownAttempt(ctx context.Context, stream, subject, worker string) bool {
	rs, err := streams.ParseRequestSubject(subject)
	if err != nil || rs.Worker != worker {
		return false
	}
	routed, err := g.routedWorker(ctx, stream, rs.ID, rs.Attempt)
	return err == nil && routed == worker
}

func (g *Guard) quarantine(ctx context.Context, f Fleet, stream, worker, why string) {
	if len(g.quarantinedAt) >= routedCache {
		clear(g.quarantinedAt)
	}
	g.quarantinedAt[worker] = time.Now()
	why = "wrote to the request log outside its attempts: " + why
	g.log.Warn("worker quarantined", "worker_id", worker, "stream", stream, "why", why, "for", QuarantineFor)
	g.quarantined.WithLabelValues(stream).Inc()
	f.Junk(ctx, worker, why)
	g.sweep(ctx, stream, worker, 0)
}

// junkWhy says why the message at seq of a worker's tokens subject is junk,
// or "" if some reader may need it: a subject no reader folds, one of a
// request that does not exist, one of an attempt not routed to the
// subject's worker, or one written after its request's end was recorded (its compact record or its failure: what a compaction carries
// for older readers is written before its record). Seq lastOfSubject judges
// the subject's last message; seq anyOfEnded also counts as junk what a
// worker wrote to a request that ended before (a quarantined worker's
// sweep: nothing of it is needed any more but the carry).
func (g *Guard) junkWhy(ctx context.Context, stream, subject string, seq uint64) string {
	why, _ := g.judge(ctx, stream, subject, seq)
	return why
}

// judge is junkWhy, and reports whether a subject found not junk is so
// for as long as its request runs (its request in flight, its attempt
// routed to the subject's worker), rather than only up to seq.
func (g *Guard) judge(ctx context.Context, stream, subject string, seq uint64) (why string, running bool) {
	rs, err := streams.ParseRequestSubject(subject)
	if err != nil {
		return "on " + subject + ", a subject no reader folds", false
	}
	last, err := streams.LastOnSubject(ctx, g.js, stream, streams.RequestEvents(rs.ID))
	if err != nil {
		return "", false
	}
	if last == nil {
		return "on " + subject + ", of request " + rs.ID + ", which does not exist", false
	}
	switch last.Header.Get(events.HeaderType) {
	case events.TypeRequestCompacted, events.TypeRequestFailed:
		if seq == lastOfSubject {
			lm, err := streams.LastOnSubject(ctx, g.js, stream, subject)
			if err != nil || lm == nil {
				return "", false
			}
			seq = lm.Sequence
		}
		if seq == anyOfEnded || seq > last.Sequence {
			return "on " + subject + ", after request " + rs.ID + " ended", false
		}
		return "", false
	}
	// In flight (or finished, not compacted): only the attempt's routed
	// worker writes its tokens subject, and only once it was routed.
	routed, err := g.routedWorker(ctx, stream, rs.ID, rs.Attempt)
	if err != nil {
		return "", false
	}
	if routed == rs.Worker {
		return "", true
	}
	return fmt.Sprintf("on %s, attempt %d of request %s, which was not routed to it", subject, rs.Attempt, rs.ID), false
}

// routedWorker returns the worker attempt of request id was routed to ("":
// none yet), from the routed decisions on its events subject, which only a
// frontend writes (attempt 0's may be stored in the accepted event). A
// decision does not change once stored, so what was found is kept (a
// bounded cache: the guard asks about the same running request at reading
// after reading).
func (g *Guard) routedWorker(ctx context.Context, stream, id string, attempt int) (string, error) {
	key := fmt.Sprintf("%s %d", id, attempt)
	g.mu.Lock()
	w, ok := g.routed[key]
	g.mu.Unlock()
	if ok {
		return w, nil
	}
	subject := streams.RequestEvents(id)
	for seq := uint64(1); ; {
		msg, err := streams.NextOnSubject(ctx, g.js, stream, subject, seq)
		if err != nil || msg == nil {
			return "", err
		}
		seq = msg.Sequence + 1
		if typ := msg.Header.Get(events.HeaderType); typ != events.TypeRequestRouted && (attempt != 0 || typ != events.TypeRequestAccepted) {
			continue
		}
		e, err := events.Unmarshal(events.Header(msg.Header), msg.Data)
		r, ok := e.Event.(events.RequestRouted)
		if a, acc := e.Event.(events.RequestAccepted); acc && a.Route != nil {
			r, ok = *a.Route, true // attempt 0 routed with the acceptance
		}
		if err != nil || !ok || r.Attempt != attempt {
			continue
		}
		g.mu.Lock()
		if len(g.routed) >= routedCache {
			clear(g.routed)
		}
		g.routed[key] = r.WorkerID
		g.mu.Unlock()
		return r.WorkerID, nil
	}
}

// overBound says why msg, on the subject of an attempt routed to its
// worker, is junk all the same ("" if it is not): it is larger than any
// message of an attempt of its request may be (projections.AttemptBound).
func (g *Guard) overBound(ctx context.Context, stream string, msg seen) string {
	rs, err := streams.ParseRequestSubject(msg.subject)
	if err != nil {
		return ""
	}
	bound, err := g.requestBound(ctx, stream, rs.ID)
	if err != nil || bound == 0 || msg.size <= bound {
		return ""
	}
	return fmt.Sprintf("on %s, its own attempt %d of request %s, a %d-byte message, over the %d bytes a message of the request's may hold",
		msg.subject, rs.Attempt, rs.ID, msg.size, bound)
}

// requestBound is attemptBound of request id, from its accepted event
// (the first on its events subject; 0: not found), cached.
func (g *Guard) requestBound(ctx context.Context, stream, id string) (int, error) {
	g.mu.Lock()
	b, ok := g.bounds[id]
	g.mu.Unlock()
	if ok {
		return b, nil
	}
	msg, err := streams.NextOnSubject(ctx, g.js, stream, streams.RequestEvents(id), 1)
	if err != nil || msg == nil {
		return 0, err
	}
	e, err := events.Unmarshal(events.Header(msg.Header), msg.Data)
	acc, ok := e.Event.(events.RequestAccepted)
	if err != nil || !ok {
		return 0, nil
	}
	b = projections.AttemptBound(acc)
	g.mu.Lock()
	if len(g.bounds) >= routedCache {
		clear(g.bounds)
	}
	g.bounds[id] = b
	g.mu.Unlock()
	return b, nil
}

// fencedAt returns the sequence of the migration that fenced attempt of
// request id (0: it is not fenced): what its worker stores on its subject
// afterwards no reader folds (projections.IgnoredFenced).
func (g *Guard) fencedAt(ctx context.Context, stream, id string, attempt int) (uint64, error) {
	subject := streams.RequestEvents(id)
	for seq := uint64(1); ; {
		msg, err := streams.NextOnSubject(ctx, g.js, stream, subject, seq)
		if err != nil || msg == nil {
			return 0, err
		}
		seq = msg.Sequence + 1
		if msg.Header.Get(events.HeaderType) != events.TypeRequestMigrated {
			continue
		}
		e, err := events.Unmarshal(events.Header(msg.Header), msg.Data)
		if m, ok := e.Event.(events.RequestMigrated); err == nil && ok && m.FromAttempt == attempt {
			return msg.Sequence, nil
		}
	}
}

// trimHeld deletes, from each of a quarantined worker's held subjects (a
// request in flight still needs them), the large messages (junkLarge or
// more) no reader folds: those stored after a migration fenced the
// attempt (projections.IgnoredFenced), and those over the attempt's bound
// (projections.AttemptBound: the fold ignores a delta of more,
// IgnoredOversize). The worker decides how long its request runs: what it
// writes there meanwhile must not wait for the request's compaction. A
// subject's messages are read once (trimmed), 64 a batched get, and
// deleted 16 at a time.
func (g *Guard) trimHeld(ctx context.Context, stream string, held []string) {
	for _, subj := range held {
		rs, err := streams.ParseRequestSubject(subj)
		if err != nil || rs.Kind != "tokens" {
			continue
		}
		fence, err := g.fencedAt(ctx, stream, rs.ID, rs.Attempt)
		if err != nil {
			continue
		}
		bound, err := g.requestBound(ctx, stream, rs.ID)
		if err != nil {
			continue
		}
		if len(g.trimmed) >= routedCache {
			clear(g.trimmed)
		}
		for ctx.Err() == nil {
			batch, err := streams.NextOnSubjectSizes(ctx, g.js, stream, subj, g.trimmed[subj]+1, trimBatch, trimBatchBytes)
			if err != nil || len(batch) == 0 {
				break
			}
			var eg errgroup.Group
			eg.SetLimit(parallel)
			for _, m := range batch {
				if m.Size < junkLarge || !((fence > 0 && m.Seq > fence) || (bound > 0 && m.Size > bound)) {
					continue
				}
				eg.Go(func() error {
					if err := streams.DeleteMsg(ctx, g.js, stream, m.Seq); err != nil {
						g.log.Debug("delete a quarantined worker's junk", "stream", stream, "subject", subj, "err", err)
						return err
					}
					g.junkPurged.WithLabelValues(stream).Inc()
					return nil
				})
			}
			if eg.Wait() != nil {
				break // looked at again from there at the next sweep
			}
			g.trimmed[subj] = batch[len(batch)-1].Seq
		}
	}
}

// junkWhy's seq for a subject as a whole.
const (
	anyOfEnded    uint64 = 0
	lastOfSubject uint64 = ^uint64(0)
)

// classify sorts subjects, tokens subjects of a worker's, into junk
// (junkWhy at seq) and held: a reader may still need them (their request is
// in flight, or finished and not compacted, and its text may be the
// worker's). It asks about several at once: under a flood each answer
// waits its turn behind the junk being stored.
func (g *Guard) classify(ctx context.Context, stream string, subjects []string, seq uint64) (junk, held []string) {
	why := make([]string, len(subjects))
	var eg errgroup.Group
	eg.SetLimit(parallel)
	for i, subj := range subjects {
		eg.Go(func() error {
			why[i] = g.junkWhy(ctx, stream, subj, seq)
			return nil
		})
	}
	_ = eg.Wait()
	for i, subj := range subjects {
		if why[i] != "" {
			junk = append(junk, subj)
		} else {
			held = append(held, subj)
		}
	}
	return junk, held
}

// classifyBatched is classify with the requests' last events read in
// batches (streams.LastOfEach, a round trip for up to 1,024 requests
// instead of one each): a subject of a request with no events is junk, as
// is, with seq anyOfEnded, one of a request that ended; one of a request
// in flight is junk unless its attempt was routed to the subject's worker
// (routedWorker, cached). What the batch cannot tell (an answer cut short,
// or an ended request judged at lastOfSubject) is asked one by one. An
// error means batched gets are not served (before nats-server 2.11):
// classify then. absent holds the junk subjects whose request does not
// exist (none of them can be the worker's own attempt).
func (g *Guard) classifyBatched(ctx context.Context, stream string, subjects []string, seq uint64) (junk, held []string, absent map[string]bool) {
	evs := make([]string, 0, len(subjects))
	seen := map[string]bool{}
	for _, subj := range subjects {
		if rs, err := streams.ParseRequestSubject(subj); err == nil && !seen[rs.ID] {
			seen[rs.ID] = true
			evs = append(evs, streams.RequestEvents(rs.ID))
		}
	}
	last, complete, err := streams.LastOfEach(ctx, g.js, stream, evs, batchBytes, false)
	if err != nil {
		junk, held = g.classify(ctx, stream, subjects, seq)
		return junk, held, nil
	}
	absent = map[string]bool{}
	var ask []string
	for _, subj := range subjects {
		rs, err := streams.ParseRequestSubject(subj)
		if err != nil {
			junk = append(junk, subj)
			continue
		}
		m, ok := last[streams.RequestEvents(rs.ID)]
		switch {
		case !ok && complete:
			junk = append(junk, subj) // no such request
			absent[subj] = true
			continue
		case !ok:
			ask = append(ask, subj)
			continue
		}
		switch m.Header.Get(events.HeaderType) {
		case events.TypeRequestCompacted, events.TypeRequestFailed:
			if seq == anyOfEnded {
				junk = append(junk, subj)
			} else {
				ask = append(ask, subj)
			}
			continue
		}
		ask = append(ask, subj) // in flight: routedWorker, cached
	}
	j, h := g.classify(ctx, stream, ask, seq)
	return append(junk, j...), append(held, h...), absent
}

// purgeAll purges each of subjects from stream, purgeParallel at once,
// and reports whether every purge succeeded. One literal subject a purge:
// a purge with a wildcard filter reads the whole stream.
func (g *Guard) purgeAll(ctx context.Context, stream string, subjects []string) (all bool) {
	var eg errgroup.Group
	eg.SetLimit(purgeParallel)
	for _, subj := range subjects {
		eg.Go(func() error {
			n, err := streams.PurgeSubject(ctx, g.js, stream, subj)
			if err != nil {
				g.log.Debug("purge junk", "stream", stream, "subject", subj, "err", err)
				return err
			}
			g.junkPurged.WithLabelValues(stream).Add(float64(n))
			return nil
		})
	}
	return eg.Wait() == nil
}

// sweep purges quarantined worker's junk from stream, whose last sequence
// at the reading was to (0: not known): per request while some request may
// still need what it wrote before, then everything it writes, one purge a
// reading. Both the list of its subjects and the purge of all it wrote make
// the server match every subject the stream holds, with its writes held
// (about 25 and 50 ms at 100,000 subjects: BenchmarkWorkerLookup), so once
// a sweep purged all the junk it listed, the next one starts only when the
// worker wrote again since (one get from that reading's last sequence): a
// quarantined worker that stopped writing costs the log nothing more.
func (g *Guard) sweep(ctx context.Context, stream, worker string, to uint64) {
	key := stream + " " + worker
	if from := g.sweptTo[key]; from > 0 {
		if _, ok, err := streams.NextOfWorkerBare(ctx, g.js, stream, worker, from+1); err == nil && !ok {
			return
		}
		delete(g.sweptTo, key)
	}
	g.mu.Lock()
	clear := g.swept[key]
	g.mu.Unlock()
	if clear {
		if n, err := streams.PurgeWorker(ctx, g.js, stream, worker); err == nil {
			g.junkPurged.WithLabelValues(stream).Add(float64(n))
			g.sweptTo[key] = to
		}
		return
	}
	subjects, err := streams.WorkerSubjects(ctx, g.js, stream, worker)
	if err != nil {
		return
	}
	keys := sortedKeys(subjects, sweepMax)
	junk, held, _ := g.classifyBatched(ctx, stream, keys, anyOfEnded)
	if len(held) > 0 || len(keys) < len(subjects) {
		purged := g.purgeAll(ctx, stream, junk)
		g.trimHeld(ctx, stream, held)
		if purged && len(keys) == len(subjects) {
			// What is held is needed until its request is compacted. A purge
			// that failed (timed out on a loaded server) leaves its junk to
			// the next reading's sweep: swept to here, that one would start
			// only once the worker wrote again.
			g.sweptTo[key] = to
		}
		return
	}
	// None of its output is needed: everything it wrote, and writes from
	// now on, goes in one purge a reading.
	if n, err := streams.PurgeWorker(ctx, g.js, stream, worker); err == nil {
		g.junkPurged.WithLabelValues(stream).Add(float64(n))
		g.sweptTo[key] = to
	}
	g.mu.Lock()
	g.swept[key] = true
	g.mu.Unlock()
	g.log.Info("quarantined worker's output no longer needed: purging all it writes", "worker_id", worker, "stream", stream)
}

// sortedKeys returns up to n keys of subjects, sorted.
func sortedKeys(subjects map[string]uint64, n int) []string {
	keys := make([]string, 0, len(subjects))
	for k := range subjects {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys[:min(n, len(keys))]
}
