package retention

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
	"golang.org/x/sync/errgroup"
)

// A worker's credential lets it write its own tokens subjects of any
// request (streams.WorkerTokens): NATS cannot tell a routed attempt's
// output from junk written to a request the worker was never given, or to
// one long over. Junk is ignored by every fold, but it is stored, and the
// request log is shared: one worker could fill it and so refuse every
// other worker's requests. The monitor guards against that (docs/security.md,
// "A worker that floods the log"):
//
//   - on sight: at every reading it looks at the first message a live
//     worker (every one, when the partition grew fast) wrote since it was
//     last looked at, one get each;
//   - junk found is purged at once, and a worker found writing junk of any
//     size (a large message, or many) is quarantined: Fleet.Junk takes it out
//     of routing for QuarantineFor, its requests move to other workers;
//   - while it is quarantined, its tokens subjects are swept at every
//     reading: junk per request while some request still needs the worker's
//     earlier output, everything it wrote in one purge once none does.

// Fleet is what the monitor knows of the workers, from the frontend's
// discovery view.
type Fleet interface {
	// Workers are the live workers (not quarantined) whose writes are checked.
	Workers() []string
	// Quarantined are the workers out of service for junk, whose tokens
	// subjects are swept.
	Quarantined() []string
	// Junk takes worker out of service for QuarantineFor: it wrote to the
	// request log outside its attempts, as why says.
	Junk(ctx context.Context, worker, why string)
}

// Guard's marks.
const (
	// QuarantineFor is how long a worker found writing junk stays out of
	// routing (events.WorkerLost.QuarantineMS).
	QuarantineFor = 10 * time.Minute
	// checksPerReading is how many live workers' writes each reading of a
	// partition looks at, in turn, while it grows slowly: junk that fills
	// the log slower than eviction empties it is found in turn, or evicted
	// oldest first with the finished requests.
	checksPerReading = 1
	// fastGrowth: a partition that grew by this fraction of its max bytes
	// since the last reading (filling the eviction band in ten readings)
	// has up to fastChecks live workers' writes looked at.
	fastGrowth = 0.01
	fastChecks = 16
	// checkBack and checkBackBytes bound how far back from the end of the
	// stream a check looks for a worker's first message there: the server
	// reads the stream from that sequence on until one of the worker's
	// messages comes, the stream's writes held meanwhile (about 2 ms when
	// none of 4,096 is the worker's; a fraction of a millisecond for a
	// worker that serves requests; BenchmarkWorkerLookup in streams). A
	// flood is recent by nature, and the stream's last blocks are the ones
	// in the server's cache: a look further back reads blocks from disk.
	checkBack      = 1 << 12
	checkBackBytes = 4 << 20
	// junkLarge: one junk message this large quarantines its worker at once.
	junkLarge = 64 << 10
	// junkMany: this many junk messages of one worker quarantine it. An
	// honest worker writes junk only by accident: the few deltas it had in
	// flight when its request ended and was evicted under it.
	junkMany = 64
	// lateMany: this many messages a worker wrote to its own attempts
	// after their requests ended quarantine it. An honest worker cut off
	// from NATS (a partition, SIGSTOP) while its request migrated away
	// and ended sends what its connection buffered when it comes back:
	// its whole append window (1,024) and the repairs of it, which are
	// purged but are no reason to take it out of service.
	lateMany = 4096
	// sweepMax bounds the subjects one sweep of a worker looks at.
	sweepMax = 512
	// parallel is how many questions about junk are asked at once.
	parallel = 16
	// routedCache bounds the routed decisions the guard remembers.
	routedCache = 4096
)

// SetFleet tells the monitor the workers to guard the log against, before
// Run. Without one nothing is checked.
func (m *Monitor) SetFleet(f Fleet) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fleet = f
}

// guard checks and sweeps the workers' writes to stream, whose reading
// went from before to u.
func (m *Monitor) guard(ctx context.Context, before, u streams.Usage) {
	m.mu.Lock()
	f := m.fleet
	m.mu.Unlock()
	if f == nil {
		return
	}
	q := f.Quarantined()
	m.mu.Lock()
	for key := range m.swept {
		if stream, w, _ := strings.Cut(key, " "); stream == u.Stream && !slices.Contains(q, w) {
			delete(m.swept, key) // out of quarantine: its output counts again
		}
	}
	m.mu.Unlock()
	for _, w := range q {
		m.sweep(ctx, u.Stream, w)
	}
	ws := f.Workers()
	if len(ws) == 0 {
		return
	}
	n := min(checksPerReading, len(ws))
	if u.MaxBytes > 0 && u.Bytes > before.Bytes && float64(u.Bytes-before.Bytes) > fastGrowth*float64(u.MaxBytes) {
		n = min(len(ws), fastChecks)
	}
	start := m.turn % len(ws)
	m.turn += n
	for i := range n {
		if ctx.Err() != nil {
			return
		}
		w := ws[(start+i)%len(ws)]
		key := u.Stream + " " + w
		m.check(ctx, u.Stream, w, f, max(m.checked[key]+1, tailFrom(u)))
		m.checked[key] = u.LastSeq
	}
	if len(m.checked) > 2*len(ws)*len(m.partitions().Streams())+fastChecks {
		for key := range m.checked { // workers gone: looked at from tailFrom if they come back
			if _, w, _ := strings.Cut(key, " "); !slices.Contains(ws, w) {
				delete(m.checked, key)
			}
		}
	}
}

// tailFrom is the earliest a check looks for a worker's message in a
// partition whose reading is u (it looks from the sequence of the
// worker's last check, if later): checkBack messages before its end, or
// fewer when its messages are large (checkBackBytes of them at their mean
// size), so that the server reads only the stream's last blocks, which
// are in its cache.
func tailFrom(u streams.Usage) uint64 {
	n := uint64(checkBack)
	if u.Msgs > 0 && u.Bytes > 0 {
		n = min(n, max(4, checkBackBytes/(u.Bytes/u.Msgs+1)))
	}
	if u.LastSeq < n {
		return max(u.FirstSeq, 1)
	}
	return max(u.FirstSeq, u.LastSeq-n+1)
}

// check looks at the first message worker wrote to stream at or after
// sequence from (since its last check, near the end); if it is junk,
// purges it and, when the worker's junk is large or many, quarantines the
// worker.
func (m *Monitor) check(ctx context.Context, stream, worker string, f Fleet, from uint64) {
	msg, ok, err := streams.NextOfWorker(ctx, m.js, stream, worker, from)
	if err != nil || !ok {
		return
	}
	why := m.junkWhy(ctx, stream, msg.Subject, msg.Sequence)
	if why == "" {
		return
	}
	size := len(msg.Data)
	for k, vs := range msg.Header {
		for _, v := range vs {
			size += len(k) + len(v)
		}
	}
	if size >= junkLarge {
		m.quarantine(ctx, f, stream, worker, fmt.Sprintf("a %d-byte message %s", size, why))
		return
	}
	// A small one: junk at all, or an honest worker's late delta?
	subjects, err := streams.WorkerSubjects(ctx, m.js, stream, worker)
	if err != nil {
		return
	}
	keys := sortedKeys(subjects, sweepMax)
	junk, _ := m.classify(ctx, stream, keys, lastOfSubject)
	many, late := 0, 0
	for _, subj := range junk {
		if m.ownAttempt(ctx, stream, subj, worker) {
			late += int(subjects[subj]) // after its request ended: purged, counted apart
		} else {
			many += int(subjects[subj])
		}
	}
	if many >= junkMany || late >= lateMany {
		m.quarantine(ctx, f, stream, worker, fmt.Sprintf("%d messages, the last %s", many+late, why))
		return
	}
	m.purgeAll(ctx, stream, junk)
}

// ownAttempt reports whether subject, a tokens subject of worker's, is
// that of an attempt routed to worker: what it wrote there is junk only
// for having come after the request ended.
func (m *Monitor) ownAttempt(ctx context.Context, stream, subject, worker string) bool {
	rs, err := streams.ParseRequestSubject(subject)
	if err != nil || rs.Worker != worker {
		return false
	}
	routed, err := m.routedWorker(ctx, stream, rs.ID, rs.Attempt)
	return err == nil && routed == worker
}

func (m *Monitor) quarantine(ctx context.Context, f Fleet, stream, worker, why string) {
	why = "wrote to the request log outside its attempts: " + why
	m.log.Warn("worker quarantined", "worker_id", worker, "stream", stream, "why", why, "for", QuarantineFor)
	m.quarantined.WithLabelValues(stream).Inc()
	f.Junk(ctx, worker, why)
	m.sweep(ctx, stream, worker)
}

// junkWhy says why the message at seq of a worker's tokens subject is junk,
// or "" if some reader may need it: a subject no reader folds, one of a
// request that does not exist, one of an attempt not routed to the
// subject's worker, or one written after its request's end was recorded (its compact record or its failure: what a compaction carries
// for older readers is written before its record). Seq lastOfSubject judges
// the subject's last message; seq anyOfEnded also counts as junk what a
// worker wrote to a request that ended before (a quarantined worker's
// sweep: nothing of it is needed any more but the carry).
func (m *Monitor) junkWhy(ctx context.Context, stream, subject string, seq uint64) string {
	rs, err := streams.ParseRequestSubject(subject)
	if err != nil {
		return "on " + subject + ", a subject no reader folds"
	}
	last, err := streams.LastOnSubject(ctx, m.js, stream, streams.RequestEvents(rs.ID))
	if err != nil {
		return ""
	}
	if last == nil {
		return "on " + subject + ", of request " + rs.ID + ", which does not exist"
	}
	switch last.Header.Get(events.HeaderType) {
	case events.TypeRequestCompacted, events.TypeRequestFailed:
		if seq == lastOfSubject {
			lm, err := streams.LastOnSubject(ctx, m.js, stream, subject)
			if err != nil || lm == nil {
				return ""
			}
			seq = lm.Sequence
		}
		if seq == anyOfEnded || seq > last.Sequence {
			return "on " + subject + ", after request " + rs.ID + " ended"
		}
		return ""
	}
	// In flight (or finished, not compacted): only the attempt's routed
	// worker writes its tokens subject, and only once it was routed.
	routed, err := m.routedWorker(ctx, stream, rs.ID, rs.Attempt)
	if err != nil || routed == rs.Worker {
		return ""
	}
	return fmt.Sprintf("on %s, attempt %d of request %s, which was not routed to it", subject, rs.Attempt, rs.ID)
}

// routedWorker returns the worker attempt of request id was routed to ("":
// none yet), from the routed decisions on its events subject, which only a
// frontend writes. A decision does not change once stored, so what was
// found is kept (a bounded cache: the guard asks about the same running
// request at reading after reading).
func (m *Monitor) routedWorker(ctx context.Context, stream, id string, attempt int) (string, error) {
	key := fmt.Sprintf("%s %d", id, attempt)
	m.mu.Lock()
	w, ok := m.routed[key]
	m.mu.Unlock()
	if ok {
		return w, nil
	}
	subject := streams.RequestEvents(id)
	for seq := uint64(1); ; {
		msg, err := streams.NextOnSubject(ctx, m.js, stream, subject, seq)
		if err != nil || msg == nil {
			return "", err
		}
		seq = msg.Sequence + 1
		if msg.Header.Get(events.HeaderType) != events.TypeRequestRouted {
			continue
		}
		e, err := events.Unmarshal(events.Header(msg.Header), msg.Data)
		r, ok := e.Event.(events.RequestRouted)
		if err != nil || !ok || r.Attempt != attempt {
			continue
		}
		m.mu.Lock()
		if len(m.routed) >= routedCache {
			clear(m.routed)
		}
		m.routed[key] = r.WorkerID
		m.mu.Unlock()
		return r.WorkerID, nil
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
func (m *Monitor) classify(ctx context.Context, stream string, subjects []string, seq uint64) (junk, held []string) {
	why := make([]string, len(subjects))
	var g errgroup.Group
	g.SetLimit(parallel)
	for i, subj := range subjects {
		g.Go(func() error {
			why[i] = m.junkWhy(ctx, stream, subj, seq)
			return nil
		})
	}
	_ = g.Wait()
	for i, subj := range subjects {
		if why[i] != "" {
			junk = append(junk, subj)
		} else {
			held = append(held, subj)
		}
	}
	return junk, held
}

// purgeAll purges each of subjects from stream, several at once. One
// literal subject a purge: a purge with a wildcard filter reads the whole
// stream.
func (m *Monitor) purgeAll(ctx context.Context, stream string, subjects []string) {
	var g errgroup.Group
	g.SetLimit(parallel)
	for _, subj := range subjects {
		g.Go(func() error {
			n, err := streams.PurgeSubject(ctx, m.js, stream, subj)
			if err != nil {
				m.log.Debug("purge junk", "stream", stream, "subject", subj, "err", err)
				return nil
			}
			m.junkPurged.WithLabelValues(stream).Add(float64(n))
			return nil
		})
	}
	_ = g.Wait()
}

// sweep purges quarantined worker's junk from stream: per request while
// some request may still need what it wrote before, then everything it
// writes, one purge a reading.
func (m *Monitor) sweep(ctx context.Context, stream, worker string) {
	key := stream + " " + worker
	m.mu.Lock()
	clear := m.swept[key]
	m.mu.Unlock()
	if clear {
		if n, err := streams.PurgeWorker(ctx, m.js, stream, worker); err == nil {
			m.junkPurged.WithLabelValues(stream).Add(float64(n))
		}
		return
	}
	subjects, err := streams.WorkerSubjects(ctx, m.js, stream, worker)
	if err != nil {
		return
	}
	keys := sortedKeys(subjects, sweepMax)
	junk, held := m.classify(ctx, stream, keys, anyOfEnded)
	if len(held) > 0 || len(keys) < len(subjects) {
		m.purgeAll(ctx, stream, junk)
		return
	}
	// None of its output is needed: everything it wrote, and writes from
	// now on, goes in one purge a reading.
	if n, err := streams.PurgeWorker(ctx, m.js, stream, worker); err == nil {
		m.junkPurged.WithLabelValues(stream).Add(float64(n))
	}
	m.mu.Lock()
	m.swept[key] = true
	m.mu.Unlock()
	m.log.Info("quarantined worker's output no longer needed: purging all it writes", "worker_id", worker, "stream", stream)
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
