package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// A Guard keeps workers from filling the request log with junk. A worker's
// credential lets it write its own tokens subjects of any request
// (streams.WorkerTokens): NATS cannot tell a routed attempt's output from
// junk written to a request the worker was never given, or to one long
// over. Junk is ignored by every fold, but it is stored, and the request
// log is shared: one worker could fill it and so refuse every other
// worker's requests. The guard stops that (docs/security.md, "A worker that
// floods the log"):
//
//   - on sight: after every reading it looks at what one live worker, in
//     turn, wrote since it was last looked at, four of its messages spread
//     over that span, one get each (without the headers); when the
//     partition grew fast, at what every live worker wrote since the
//     previous reading (then read five times as often), up to 16 messages
//     each: honest writes around a flood do not hide it;
//   - junk found is purged at once, and a worker found writing junk of any
//     size (a large message, or many) is quarantined: Fleet.Junk takes it out
//     of routing for QuarantineFor, its requests move to other workers;
//   - while it is quarantined, its tokens subjects are swept at every
//     reading: junk per request while some request still needs the worker's
//     earlier output, everything it wrote in one purge once none does.
//
// It runs on a goroutine of its own (Run), with readings of its own, so
// that its questions (slow under a flood) never hold up eviction or
// admission, and so that an eviction that takes long (a log full of junk)
// does not leave it without fresh readings. It takes them through a
// UsageReader: a frontend's Monitor, so that admission answers from them
// too.
type Guard struct {
	js          jetstream.JetStream
	usage       UsageReader
	cfg         GuardConfig
	log         *slog.Logger
	junkPurged  *prometheus.CounterVec
	quarantined *prometheus.CounterVec
	turn        int                  // the next live worker guard checks (Run's goroutine only)
	checked     map[string]uint64    // "stream worker": the partition's last sequence at the worker's last check (Run's)
	sweptTo     map[string]uint64    // "stream worker": a quarantined worker's junk purged through this sequence (Run's)
	honest      map[string]time.Time // tokens subject: found not junk, taken as such until then (Run's)
	strangers   map[string]time.Time // "stream worker": a writer with no lease in the view, checked at every reading until then (Run's)
	// quarantinedAt is when this guard last quarantined each worker
	// (Run's): the fleet view may take a moment to show it, and the
	// suspects met meanwhile are not judged again.
	quarantinedAt map[string]time.Time

	mu      sync.Mutex
	parts   streams.Partitions
	fleet   Fleet
	swept   map[string]bool   // "stream worker": a quarantined worker none of whose output is needed there
	routed  map[string]string // "request attempt": the worker it was routed to (routedWorker)
	bounds  map[string]int    // request: the most bytes a message of one of its attempts may hold (projections.AttemptBound)
	trimmed map[string]uint64 // a fenced attempt's tokens subject: its large messages deleted through this sequence (Run's)

	suspects chan suspect // large messages a follower saw (Suspect), judged by Run at once
}

// GuardConfig sets the pace of a Guard. Zero values mean the defaults.
type GuardConfig struct {
	// Interval is how often each partition's usage is read, and the
	// workers' writes there looked at, while it grows slowly (fastReadings
	// times as often while it grows fast); default DefaultInterval, the
	// Monitor's.
	Interval time.Duration
}

func (c GuardConfig) withDefaults() GuardConfig {
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	return c
}

// Validate reports every problem with c.
func (c GuardConfig) Validate() error {
	if c.Interval < 0 {
		return errors.New("guard interval must not be negative")
	}
	return nil
}

// UsageReader reads a partition's usage for the guard. A Monitor is one
// (Monitor.Read): it records what it read, and admission answers from it.
type UsageReader interface {
	Read(ctx context.Context, stream string) (streams.Usage, error)
}

// NewGuard returns a Guard of the request log, reading the partitions'
// usage through usage (nil: on its own, with nobody else told), with its
// metrics registered on reg. Tell it the log's layout (SetPartitions) and
// the workers (SetFleet) before Run.
func NewGuard(js jetstream.JetStream, usage UsageReader, reg prometheus.Registerer, log *slog.Logger, cfg GuardConfig) (*Guard, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("retention: %w", err)
	}
	g := &Guard{
		js: js, usage: usage, cfg: cfg.withDefaults(), log: log,
		junkPurged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_log_junk_purged_messages_total", Help: "Messages this frontend purged from a request stream as junk: written by a worker outside its attempts.",
		}, []string{"stream"}),
		quarantined: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_log_workers_quarantined_total", Help: "Workers this frontend quarantined for writing junk to a request stream.",
		}, []string{"stream"}),
		checked: map[string]uint64{}, sweptTo: map[string]uint64{}, honest: map[string]time.Time{}, strangers: map[string]time.Time{}, quarantinedAt: map[string]time.Time{},
		swept: map[string]bool{}, routed: map[string]string{}, bounds: map[string]int{}, trimmed: map[string]uint64{},
		suspects: make(chan suspect, suspectsQueued),
	}
	if g.usage == nil {
		g.usage = ownReadings{js, log}
	}
	for _, c := range []prometheus.Collector{g.junkPurged, g.quarantined} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("retention: register metrics: %w", err)
		}
	}
	return g, nil
}

// ownReadings is a guard's UsageReader when it has no Monitor's.
type ownReadings struct {
	js  jetstream.JetStream
	log *slog.Logger
}

func (r ownReadings) Read(ctx context.Context, stream string) (streams.Usage, error) {
	u, err := streams.ReadUsage(ctx, r.js, stream)
	if err != nil && ctx.Err() == nil {
		r.log.Debug("read request log usage", "stream", stream, "err", err)
	}
	return u, err
}

// SetPartitions tells the guard the request log's layout (Provision's
// answer), before Run.
func (g *Guard) SetPartitions(p streams.Partitions) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.parts = p
}

func (g *Guard) partitions() streams.Partitions {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.parts
}

// SetFleet tells the guard the workers to guard the log against, before
// Run. Without one nothing is checked.
func (g *Guard) SetFleet(f Fleet) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.fleet = f
}

// Run reads every partition's usage each Interval, or fastReadings times
// as often while one grows fast (a flood, or a burst of work), and checks
// and sweeps the workers' writes there after each reading, until ctx is
// done. It returns nil then.
func (g *Guard) Run(ctx context.Context) error {
	t := time.NewTimer(g.cfg.Interval)
	defer t.Stop()
	seen := map[string]streams.Usage{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case s := <-g.suspects:
			g.judgeSuspect(ctx, s)
			continue
		case <-t.C:
		}
		fast := false
		for _, stream := range g.partitions().Streams() {
			g.judgeQueued(ctx)
			u, err := g.usage.Read(ctx, stream)
			if err != nil {
				continue // the next reading tries again
			}
			grows := growsFast(seen[stream], u)
			fast = fast || grows
			g.guard(ctx, seen[stream], u, grows)
			seen[stream] = u
		}
		next := g.cfg.Interval
		if fast {
			next = max(g.cfg.Interval/fastReadings, time.Millisecond)
		}
		t.Reset(next)
	}
}

// growsFast reports whether a partition grew by more than fastGrowth of its
// max bytes from reading before to u.
func growsFast(before, u streams.Usage) bool {
	return u.MaxBytes > 0 && before.LastSeq > 0 && u.Bytes > before.Bytes &&
		float64(u.Bytes-before.Bytes) > fastGrowth*float64(u.MaxBytes)
}

// Fleet is what the guard knows of the workers, from the frontend's
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
	// has up to fastChecks live workers' writes looked at, from the
	// previous reading on (lookFrom), and is read fastReadings times as
	// often (Run).
	fastGrowth = 0.01
	fastChecks = 16
	// fastReadings is how many times more often the guard reads a
	// partition that grows fast.
	fastReadings = 5
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
	// While a partition grows fast, checkSamples bounds the messages one
	// check of a worker looks at, and readingSamples those of all the
	// checks after one reading (which checks up to fastChecks workers,
	// every fastReadings of an Interval): at least minSamples each, and
	// minSamples else (a flood that began just before a reading is met
	// there), of which only the first and the large ones are judged. Each
	// look is a get without the message's headers, and a subject found
	// honest is not asked about again for honestFor: every frontend's
	// guard asks its questions, and an idle frontend's NATS traffic is
	// mostly their answers (TestLiveTrafficOnlyWhereRead).
	checkSamples   = 16
	readingSamples = 64
	minSamples     = 4
	// trimBatch and trimBatchBytes bound one batched get of trimHeld.
	trimBatch      = 64
	trimBatchBytes = 16 << 20
	// heavyMean and heavySamples: heavyWrites.
	heavyMean    = 16 << 10
	heavySamples = 64
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
	// sweepMax bounds the subjects one sweep of a worker looks at: their
	// requests' last events are read 1,024 a batched get
	// (classifyBatched), and batchBytes bounds one answer.
	sweepMax   = 1 << 16
	batchBytes = 8 << 20
	// parallel is how many questions about junk are asked at once, and
	// purgeParallel how many purges of junk subjects are sent at once (a
	// literal subject's purge is quick: TestGuardSweepsManySubjects sweeps
	// about 4,000 subjects a second with 64, 2,200 with 16).
	parallel      = 16
	purgeParallel = 64
	// routedCache bounds the routed decisions the guard remembers, and the
	// subjects it found honest.
	routedCache = 4096
	// writerSamples is how many messages of any writer each reading of a
	// partition looks at, at even steps of what was written since the
	// previous reading (fastChecks while it grows fast), to find writers
	// the view holds no lease of (strangers); strangerFor is how long a
	// stranger once seen is checked at every reading, and strangersMax
	// bounds how many are.
	writerSamples = 4
	strangerFor   = time.Minute
	strangersMax  = 64
	// honestFor is how long a tokens subject found not junk (its request in
	// flight, its attempt routed to the worker) is taken as such without
	// asking again: what its worker writes there once the request ended is
	// purged with the request's compaction or eviction.
	honestFor = 10 * time.Second
)

// guard checks and sweeps the workers' writes to stream, whose reading
// went from before to u, growing fast (growsFast) or not.
func (g *Guard) guard(ctx context.Context, before, u streams.Usage, fast bool) {
	g.mu.Lock()
	f := g.fleet
	g.mu.Unlock()
	if f == nil {
		return
	}
	q := f.Quarantined()
	g.mu.Lock()
	for key := range g.swept {
		if stream, w, _ := strings.Cut(key, " "); stream == u.Stream && !slices.Contains(q, w) {
			delete(g.swept, key) // out of quarantine: its output counts again
			delete(g.sweptTo, key)
		}
	}
	g.mu.Unlock()
	for _, w := range q {
		g.judgeQueued(ctx)
		g.sweep(ctx, u.Stream, w, u.LastSeq)
	}
	ws := f.Workers()
	g.checkStrangers(ctx, f, before, u, fast, ws, q)
	if len(ws) == 0 {
		return
	}
	heavy := heavyWrites(before, u)
	fast = fast || heavy
	n := min(checksPerReading, len(ws))
	if fast {
		n = min(len(ws), fastChecks)
	}
	start := g.turn % len(ws)
	g.turn += n
	for i := range n {
		if ctx.Err() != nil {
			return
		}
		g.judgeQueued(ctx)
		w := ws[(start+i)%len(ws)]
		key := u.Stream + " " + w
		samples := minSamples
		switch {
		case heavy:
			samples = heavySamples
		case fast:
			samples = max(minSamples, min(checkSamples, readingSamples/n))
		}
		g.checked[key] = g.check(ctx, u.Stream, w, f, max(g.checked[key]+1, lookFrom(before, u, fast)), u.LastSeq, samples, fast)
	}
	if len(g.checked) > 2*len(ws)*len(g.partitions().Streams())+fastChecks {
		for key := range g.checked { // workers gone: looked at from lookFrom if they come back
			if _, w, _ := strings.Cut(key, " "); !slices.Contains(ws, w) {
				delete(g.checked, key)
			}
		}
	}
}

// heavyWrites reports whether what was written to a partition between
// readings before and u is large messages among small ones: their mean
// size heavyMean or more. Samples at even steps of the sequence meet a
// worker's large messages only as often as they are among its messages (a
// 1 MiB message on its own attempt among its honest deltas), so each check
// then takes heavySamples of them.
func heavyWrites(before, u streams.Usage) bool {
	return before.LastSeq > 0 && u.LastSeq > before.LastSeq && u.Bytes > before.Bytes &&
		(u.Bytes-before.Bytes)/(u.LastSeq-before.LastSeq) >= heavyMean
}

// lookFrom is the earliest a check looks for a worker's messages in a
// partition whose reading went from before to u (it looks from where the
// worker's last check ended, if later): checkBack messages before its end,
// or fewer when its messages are large (checkBackBytes of them at their
// mean size), so that the server reads only the stream's last blocks,
// which are in its cache. While the partition grows fast it looks at
// least as far back as the previous reading, whatever that spans: a flood
// that came and went between two readings, followed by honest writes, is
// still looked at.
func lookFrom(before, u streams.Usage, fast bool) uint64 {
	n := uint64(checkBack)
	if u.Msgs > 0 && u.Bytes > 0 {
		n = min(n, max(4, checkBackBytes/(u.Bytes/u.Msgs+1)))
	}
	from := max(u.FirstSeq, 1)
	if u.LastSeq >= n {
		from = max(from, u.LastSeq-n+1)
	}
	if fast && before.LastSeq > 0 {
		from = max(min(from, before.LastSeq+1), u.FirstSeq)
	}
	return from
}

// check looks at what worker wrote to stream from sequence from to to
// (the partition's last at the reading): up to samples of its messages,
// each its first at or after an even step of that span, so that honest
// writes before a flood do not hide it. It judges each of them, or, unless
// judgeAll, the first and the large ones (a small message's judgement
// costs gets of its request's events, and what fills the log slowly can
// wait). If one is junk, it is purged and, when the worker's junk is large
// or many, the worker is quarantined. It returns where the worker's next
// check starts after: to, or before the sequence a get failed at.
func (g *Guard) check(ctx context.Context, stream, worker string, f Fleet, from, to uint64, samples int, judgeAll bool) uint64 {
	if from > to {
		return to
	}
	step := max(1, (to-from+1)/uint64(samples))
	now := time.Now()

	for i, seq := uint64(0), from; i < uint64(samples) && seq <= to; i++ {
		msg, ok, err := streams.NextOfWorkerBare(ctx, g.js, stream, worker, seq)
		if err != nil {
			return seq - 1 // looked at again from there
		}
		if !ok {
			break // nothing of the worker's after seq
		}
		seq = max(msg.Sequence+1, from+(i+1)*step)
		large := len(msg.Data) >= junkLarge
		if (now.Before(g.honest[msg.Subject]) && !large) || (i > 0 && !judgeAll && !large) {
			continue
		}
		if g.judgeMsg(ctx, stream, worker, f, seen{msg.Subject, msg.Sequence, len(msg.Data)}, now) {
			break
		}
	}
	return to
}

// seen is a message of a worker's as the guard judges it: where it is
// stored, and the size of its data.
type seen struct {
	subject string
	seq     uint64
	size    int
}

// judgeMsg judges msg, one of worker's messages on stream, and deals with
// it if it is junk (judgeJunk), which it reports. A subject found not junk
// for as long as its request runs is taken as honest for honestFor.
func (g *Guard) judgeMsg(ctx context.Context, stream, worker string, f Fleet, msg seen, now time.Time) bool {
	why, running := g.judge(ctx, stream, msg.subject, msg.seq)
	if why == "" && running && msg.size >= junkLarge {
		why = g.overBound(ctx, stream, msg) // its own attempt's, but more than the attempt may write
	}
	if why == "" {
		if running {
			if len(g.honest) >= routedCache {
				clear(g.honest)
			}
			g.honest[msg.subject] = now.Add(honestFor)
		}
		return false
	}
	size := msg.size
	if size < junkLarge { // its headers count towards its size, and may make it large
		if full, err := streams.MsgAt(ctx, g.js, stream, msg.seq); err == nil && full != nil {
			size = storedSize(full)
		}
	}
	g.judgeJunk(ctx, stream, worker, f, size, why)
	return true
}
