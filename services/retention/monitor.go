package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
)

// Config sets the marks of a Monitor. Zero values mean the defaults.
type Config struct {
	// HighWater is the fraction of a partition's MaxBytes above which new
	// requests are refused (ErrLogFull); default 0.9. What lies above it
	// is the reserve of the requests already accepted.
	HighWater float64
	// Interval is how often each partition's usage is read; default 250 ms.
	Interval time.Duration
	// NoEvict turns eviction off (tests; an operator who wants the log to
	// keep everything until MaxAge and to refuse new work instead).
	NoEvict bool
}

// Defaults of Config.
const (
	DefaultHighWater = 0.9
	DefaultInterval  = 250 * time.Millisecond
	// evictBelowHigh is how far below the high-water mark eviction starts,
	// and evictBand how much further down it frees room to: with the
	// default mark, eviction starts at 80% and stops at 70%.
	evictBelowHigh = 0.1
	evictBand      = 0.1
	// fullSlack: a partition this close to its limit is full (an event of
	// a few hundred bytes no longer fits).
	fullSlack = 0.99
	// refusedFor is how long an append refused at the limit (Refused)
	// counts as the partition being full, whatever the last reading said.
	refusedFor = 2 * time.Second
	// maxScan bounds the messages one eviction round looks at per partition
	// one at a time (eight times as many in batches).
	maxScan = 2000
	// evictBatch is how many events messages one batched get brings, and
	// evictParallel how many requests are evicted at once.
	evictBatch    = 256
	evictParallel = 16
)

func (c Config) withDefaults() Config {
	if c.HighWater == 0 {
		c.HighWater = DefaultHighWater
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	return c
}

// Validate reports every problem with c.
func (c Config) Validate() error {
	var errs []error
	if c.HighWater < 0 || c.HighWater > 1 {
		errs = append(errs, fmt.Errorf("log high water %v: want a fraction of the stream's max bytes, 0 to 1", c.HighWater))
	}
	if c.Interval < 0 {
		errs = append(errs, errors.New("usage interval must not be negative"))
	}
	return errors.Join(errs...)
}

// ErrLogFull means the request's partition is above the high-water mark:
// a new request is refused (503 log_full) until eviction or compaction
// makes room.
var ErrLogFull = errors.New("retention: request log full")

// FullError is ErrLogFull with the partition's reading.
type FullError struct {
	Stream    string
	Used      float64 // fraction of MaxBytes
	HighWater float64
}

func (e *FullError) Error() string {
	return fmt.Sprintf("the request log %s is %.0f%% full (high water %.0f%%): new requests are refused until finished requests are evicted",
		e.Stream, 100*e.Used, 100*e.HighWater)
}

func (e *FullError) Unwrap() error { return ErrLogFull }

// RetryAfter is what a refused client is told to wait: about the time
// eviction takes to make room.
const RetryAfter = time.Second

// Monitor watches how full each request partition is. Its reads (Admit,
// Full, Health) are safe for concurrent use and do no I/O: they answer from
// the last reading, which Run refreshes every Interval.
type Monitor struct {
	js      jetstream.JetStream
	cfg     Config
	log     *slog.Logger
	used    *prometheus.GaugeVec
	evicted *prometheus.CounterVec
	purges  *Pacer
	ends    endsState // what eviction knows of requests' ends (ends.go)

	mu       sync.Mutex
	parts    streams.Partitions       // the log's layout (SetPartitions)
	usage    map[string]streams.Usage // by stream
	read     bool                     // a reading of every partition is in
	refused  map[string]time.Time     // by stream: when an append was last refused at the limit
	changed  chan struct{}            // closed and replaced when a partition crosses a mark
	fullSeen map[string]bool          // by stream: above the high-water mark at the last reading
	// overShare reports the tenants over their share of the log, whose
	// finished requests are evicted first (share.go); nil: none.
	overShare func() []string
}

// NewMonitor returns a Monitor of the request log, with its metrics
// registered on reg. Tell it the log's layout (SetPartitions) before Run.
func NewMonitor(js jetstream.JetStream, reg prometheus.Registerer, log *slog.Logger, cfg Config) (*Monitor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("retention: %w", err)
	}
	m := &Monitor{
		js: js, cfg: cfg.withDefaults(), log: log,
		used: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "baton_log_used_ratio", Help: "Bytes stored in a request stream over its max bytes (--stream-max-bytes).",
		}, []string{"stream"}),
		evicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_log_evicted_requests_total", Help: "Finished requests whose history this frontend evicted to make room.",
		}, []string{"stream"}),
		usage: map[string]streams.Usage{}, refused: map[string]time.Time{}, fullSeen: map[string]bool{},
		changed: make(chan struct{}),
	}
	m.purges = NewPacer()
	m.purges.skipped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "baton_log_compaction_purges_skipped_total", Help: "Compactions whose purge this frontend skipped because 1,024 purges of the stream were waiting: the compact record is stored, the deltas stay until eviction.",
	}, []string{"stream"})
	for _, c := range []prometheus.Collector{m.used, m.evicted, m.purges.skipped} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("retention: register metrics: %w", err)
		}
	}
	return m, nil
}

// Purges paces this frontend's compaction purges (Compact's pace).
func (m *Monitor) Purges() *Pacer { return m.purges }

// SetPartitions tells the monitor the request log's layout (Provision's
// answer), before Run.
func (m *Monitor) SetPartitions(p streams.Partitions) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.parts = p
}

func (m *Monitor) partitions() streams.Partitions {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.parts
}

// HighWater is the mark above which new requests are refused.
func (m *Monitor) HighWater() float64 { return m.cfg.HighWater }

// Run reads the partitions' usage every Interval and evicts while one is
// above its eviction mark, until ctx is done. It returns nil then.
func (m *Monitor) Run(ctx context.Context) error {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		for _, stream := range m.partitions().Streams() {
			u, err := m.refresh(ctx, stream)
			if err != nil {
				continue // the next reading tries again; the last one stands
			}
			if !m.cfg.NoEvict && u.Ratio() >= m.evictAt() {
				m.evictChanged(ctx, u)
			} else if !m.cfg.NoEvict {
				m.evictOverShare(ctx, u, tenantEvictRound)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (m *Monitor) evictAt() float64 { return max(m.cfg.HighWater-evictBelowHigh, m.cfg.HighWater/2) }
func (m *Monitor) evictTo() float64 { return max(m.evictAt()-evictBand, m.evictAt()/2) }

// Read reads stream's usage and records it, as Run does between readings
// of its own: admission answers from the last reading, whoever took it
// (the Guard's UsageReader).
func (m *Monitor) Read(ctx context.Context, stream string) (streams.Usage, error) {
	return m.refresh(ctx, stream)
}

// refresh reads stream's usage and records it.
func (m *Monitor) refresh(ctx context.Context, stream string) (streams.Usage, error) {
	u, err := streams.ReadUsage(ctx, m.js, stream)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Debug("read request log usage", "stream", stream, "err", err)
		}
		return u, err
	}
	m.used.WithLabelValues(stream).Set(u.Ratio())
	m.mu.Lock()
	defer m.mu.Unlock()
	m.usage[stream] = u
	m.read = len(m.usage) == m.parts.Count()
	full := u.Ratio() >= m.cfg.HighWater || u.Ratio() >= fullSlack
	if full != m.fullSeen[stream] {
		m.fullSeen[stream] = full
		close(m.changed)
		m.changed = make(chan struct{})
		if full {
			m.log.Warn("request log above its high-water mark: refusing new requests", "stream", stream,
				"used_ratio", fmt.Sprintf("%.3f", u.Ratio()), "high_water", m.cfg.HighWater)
		} else {
			m.log.Info("request log below its high-water mark: admitting new requests", "stream", stream,
				"used_ratio", fmt.Sprintf("%.3f", u.Ratio()))
		}
	}
	return u, nil
}

// Admit reports whether a new request with id may be accepted: a
// *FullError (ErrLogFull) when its partition is above the high-water mark.
func (m *Monitor) Admit(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	stream := m.parts.StreamOf(id)
	u := m.usage[stream]
	if u.Ratio() >= m.cfg.HighWater || time.Since(m.refused[stream]) < refusedFor {
		return &FullError{Stream: stream, Used: u.Ratio(), HighWater: m.cfg.HighWater}
	}
	return nil
}

// Full reports whether request id's partition cannot store more: at its
// limit at the last reading, or an append was refused there lately.
func (m *Monitor) Full(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	stream := m.parts.StreamOf(id)
	return m.usage[stream].Ratio() >= fullSlack || time.Since(m.refused[stream]) < refusedFor
}

// Refused records that an append of request id was refused at the log's
// limits (streams.ErrStreamFull): its partition counts as full for a
// moment, whatever the last reading said.
func (m *Monitor) Refused(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	stream := m.parts.StreamOf(id)
	m.refused[stream] = time.Now()
	close(m.changed)
	m.changed = make(chan struct{})
}

// Changed returns a channel closed when a partition next crosses its
// high-water mark, either way, or an append is refused.
func (m *Monitor) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

// Health says why the log cannot take new requests ("" when it can): the
// partitions above the high-water mark.
func (m *Monitor) Health() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var full []string
	for _, stream := range m.parts.Streams() {
		u := m.usage[stream]
		if u.Ratio() >= m.cfg.HighWater || time.Since(m.refused[stream]) < refusedFor {
			full = append(full, fmt.Sprintf("%s %.0f%%", stream, 100*u.Ratio()))
		}
	}
	if len(full) == 0 {
		return ""
	}
	return fmt.Sprintf("request log above its high-water mark (%.0f%%): %s", 100*m.cfg.HighWater, strings.Join(full, ", "))
}

// evict purges the oldest finished requests of u's stream until the stream
// is below the eviction band: first the compacted and failed ones, found by
// their events subjects (a request in flight is a few messages there, its
// deltas not looked at, and it is not folded), then, if that was not
// enough, from the stream's first message on, every request folded, where
// a subject no reader folds (a malformed one, or a worker's junk) is
// purged too. Each pass looks at most at maxScan messages. A request in
// flight is skipped: it keeps its history. Before all that, the finished
// requests of tenants over their share of the log go first (share.go). It
// returns the requests evicted.
func (m *Monitor) evict(ctx context.Context, u streams.Usage) int {
	stream, err := m.js.Stream(ctx, u.Stream)
	if err != nil {
		return 0
	}
	_, below := m.evictOverShare(ctx, u, 0) // counted there
	var n int
	if !below {
		more, under, err := m.evictEnded(ctx, stream, u, 0, nil)
		n, below = more, under
		if err != nil { // a server without batched gets (before 2.11): one at a time
			more, below = m.evictPass(ctx, stream, u, streams.NextStoredEvents, false, 0, nil)
			n += more
		}
	}
	if !below && ctx.Err() == nil {
		more, _ := m.evictPass(ctx, stream, u, streams.NextStored, true, 0, nil)
		n += more
	}
	if n > 0 {
		m.evicted.WithLabelValues(u.Stream).Add(float64(n))
		m.log.Debug("evicted finished requests", "stream", u.Stream, "requests", n)
		_, _ = m.refresh(ctx, u.Stream)
	}
	return n
}

// evictEnded is evict's first pass: the compacted and failed requests,
// oldest first, found by their events subjects a batch at a time (one
// direct get of up to evictBatch messages) and evicted evictParallel at a
// time: on a busy server each question waits milliseconds, and requests
// may finish faster than one eviction after another can keep up with. It
// reads the usage after each batch. An error means batched gets are not
// served (nats-server before 2.11), before anything was evicted. With only
// set, the requests it rejects are left alone; with limit above 0 (a
// round of a tenant's share) it stops once it evicted that many, whatever
// the stream's usage.
func (m *Monitor) evictEnded(ctx context.Context, stream jetstream.Stream, u streams.Usage, limit int, only func(id string) bool) (n int, below bool, err error) {
	seq, seen, scan := u.FirstSeq, map[string]bool{}, maxScan*8
	if limit > 0 {
		scan = maxScan // a round, repeated every Interval
	}
	for scanned := 0; scanned < scan && ctx.Err() == nil; {
		batch, err := streams.NextStoredEventsBatch(ctx, m.js, u.Stream, seq, evictBatch, 1<<20)
		if err != nil && n == 0 && scanned == 0 {
			return 0, false, err
		}
		if len(batch) == 0 {
			return n, false, nil
		}
		scanned += len(batch)
		seq = batch[len(batch)-1].Seq + 1
		var ids []string
		for _, st := range batch {
			if st.RequestID != "" && !seen[st.RequestID] && (only == nil || only(st.RequestID)) {
				seen[st.RequestID] = true
				ids = append(ids, st.RequestID)
			}
		}
		if limit > 0 && len(ids) > limit-n {
			ids = ids[:limit-n]
		}
		var mu sync.Mutex
		var g errgroup.Group
		g.SetLimit(evictParallel)
		for _, id := range ids {
			g.Go(func() error {
				gone, err := m.evictRequest(ctx, stream, id, false)
				if err != nil {
					m.log.Debug("evict from the request log", "stream", u.Stream, "request_id", id, "err", err)
				}
				if gone {
					mu.Lock()
					n++
					mu.Unlock()
				}
				return nil
			})
		}
		_ = g.Wait()
		if nu, err := m.refresh(ctx, u.Stream); err == nil && nu.Ratio() < m.evictTo() && limit == 0 {
			return n, true, nil
		}
		if limit > 0 && n >= limit {
			return n, false, nil
		}
	}
	return n, false, nil
}

// evictPass is one pass of evict over the messages next finds; it returns
// the requests it evicted and whether the stream got below the band. With
// only set it looks at the requests only accepts and nothing else; with
// limit above 0 it stops once it evicted that many, whatever the usage.
func (m *Monitor) evictPass(ctx context.Context, stream jetstream.Stream, u streams.Usage,
	next func(context.Context, jetstream.JetStream, string, uint64) (streams.Stored, bool, error), fold bool,
	limit int, only func(id string) bool) (n int, below bool) {
	seq, skip, read := u.FirstSeq, map[string]bool{}, time.Now()
	for scanned := 0; scanned < maxScan && ctx.Err() == nil; scanned++ {
		if time.Since(read) >= m.cfg.Interval {
			// Read as often as Run would: admission and /health answer
			// from the last reading, and a pass can take seconds.
			read = time.Now()
			if nu, err := m.refresh(ctx, u.Stream); err == nil && nu.Ratio() < m.evictTo() && limit == 0 {
				return n, true
			}
		}
		st, ok, err := next(ctx, m.js, u.Stream, seq)
		if err != nil || !ok {
			return n, false
		}
		seq = st.Seq + 1
		switch {
		case only != nil && (st.RequestID == "" || !only(st.RequestID)):
			continue
		case st.RequestID == "":
			_, err = streams.PurgeSubject(ctx, m.js, u.Stream, st.Subject)
		case skip[st.RequestID]:
			continue
		default:
			var gone bool
			gone, err = m.evictRequest(ctx, stream, st.RequestID, fold)
			if !gone {
				skip[st.RequestID] = true
				continue
			}
			n++
			if limit > 0 && n >= limit {
				return n, false
			}
		}
		if err != nil {
			m.log.Warn("evict from the request log", "stream", u.Stream, "subject", st.Subject, "err", err)
			return n, false
		}
		if n%32 == 0 {
			read = time.Now()
			if nu, err := m.refresh(ctx, u.Stream); err == nil && nu.Ratio() < m.evictTo() && limit == 0 {
				return n, true
			}
		}
	}
	return n, false
}

// evictRequest purges request id if it is finished (or has no accepted
// event, so that nobody can read it), and reports whether it did. A
// compacted or failed request says so in the last message of its events
// subject, one direct get; with fold, any other is folded from the log
// (without, it is taken to be in flight: with compaction on, a request
// that finished is compacted at once, and a fold reads all it holds).
func (m *Monitor) evictRequest(ctx context.Context, st jetstream.Stream, id string, fold bool) (bool, error) {
	p := m.partitions()
	if last, err := st.GetLastMsgForSubject(ctx, streams.RequestEvents(id)); err == nil {
		switch last.Header.Get(events.HeaderType) {
		case events.TypeRequestCompacted, events.TypeRequestFailed:
			err := m.evictOne(ctx, p, id)
			return err == nil, err
		}
	}
	if m.endedElsewhere(ctx, p.StreamOf(id), id) {
		err := m.evictOne(ctx, p, id)
		return err == nil, err
	}
	if !fold {
		return false, nil
	}
	r := projections.NewRequestCounter()
	for e, err := range streams.ReadRequest(ctx, m.js, p, id, 1) {
		if errors.Is(err, streams.ErrNotFound) {
			return true, nil // purged meanwhile
		}
		if err != nil {
			return false, err
		}
		r.Apply(e)
	}
	if r.Known() && !r.Status.Terminal() {
		return false, nil
	}
	err := m.evictOne(ctx, p, id)
	return err == nil, err
}
