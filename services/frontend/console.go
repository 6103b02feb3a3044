package frontend

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/notify"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// The console's fixed bounds; Config.ConsoleWindow and ConsoleRequests set
// how far back it reads and how much it keeps.
const (
	consoleRows      = 200                    // rows of the request table sent in a state event
	consoleStateRate = 250 * time.Millisecond // at most one state event per
	consoleStateIdle = 2 * time.Second        // at least one state event per (a heartbeat too)
	consoleCatchUp   = 5 * time.Second        // how long a first reader waits for the views to catch up
)

//go:embed console
var consoleAssets embed.FS

// consoleView is the console's read model of the log: the recent requests
// (projections.Recent) and the feed, a bounded ring of the events people
// watch, each with its stream and sequence. Both are folded from ordered
// consumers on BATON_REQUESTS and BATON_WORKERS, started the first time the
// console asks for them and stopped with the frontend.
type consoleView struct {
	fe      *Frontend
	changed *notify.Signal

	startMu   sync.Mutex
	ctx       context.Context            // the frontend's lifetime while run runs; guarded by startMu
	started   bool                       // guarded by startMu
	consumers []jetstream.ConsumeContext // guarded by startMu
	caughtUp  chan struct{}              // closed when both readers reached the log's end as of their start

	mu     sync.Mutex
	recent *projections.Recent
	feed   []feedEntry // in time order, oldest first (feedInsert); at most limit
	limit  int         // feed entries kept for resumes
	cursor feedCursor  // of the newest feed entry of each stream
}

// feedCursor is a position in the feed: the last stream sequence seen of
// each request partition (streams.Partitions; their sequences are not
// comparable) and of BATON_WORKERS. As an SSE id it reads "R.W", or
// "R0.R1.….W" with several partitions.
type feedCursor struct {
	Requests []uint64 // per partition
	Workers  uint64
}

func newCursor(parts streams.Partitions) feedCursor {
	return feedCursor{Requests: make([]uint64, parts.Count())}
}

func (c feedCursor) String() string {
	var b strings.Builder
	for _, s := range c.Requests {
		b.WriteString(strconv.FormatUint(s, 10))
		b.WriteByte('.')
	}
	b.WriteString(strconv.FormatUint(c.Workers, 10))
	return b.String()
}

func parseCursor(s string, parts streams.Partitions) (feedCursor, error) {
	fields := strings.Split(strings.TrimSpace(s), ".")
	bad := fmt.Errorf("want the sequences of %d request partition(s) and of the workers stream, dot-separated, got %q", parts.Count(), s)
	if len(fields) != parts.Count()+1 {
		return feedCursor{}, bad
	}
	seqs := make([]uint64, len(fields))
	for i, f := range fields {
		var err error
		if seqs[i], err = strconv.ParseUint(f, 10, 64); err != nil {
			return feedCursor{}, bad
		}
	}
	return feedCursor{Requests: seqs[:parts.Count()], Workers: seqs[parts.Count()]}, nil
}

// seq is the cursor's sequence of e's stream.
func (c *feedCursor) seq(e feedEntry) *uint64 {
	if e.partition < 0 {
		return &c.Workers
	}
	return &c.Requests[e.partition]
}

// after reports whether e comes after cursor c in its stream.
func (c feedCursor) after(e feedEntry) bool { return e.Seq > *c.seq(e) }

// feedEntry is one event of the live feed.
type feedEntry struct {
	ID        string    `json:"id"` // the SSE id: the reader's feed cursor after this entry (consoleView.since)
	Stream    string    `json:"stream"`
	Seq       uint64    `json:"seq"`
	Time      time.Time `json:"time"`
	Type      string    `json:"type"`
	Kind      string    `json:"kind"` // the type's short name: migrated, attempt_failed, lost, ...
	RequestID string    `json:"request_id,omitempty"`
	WorkerID  string    `json:"worker_id,omitempty"`
	Source    string    `json:"source"`
	Summary   string    `json:"summary"`

	partition int // the request partition of Stream; -1 for BATON_WORKERS
}

func newConsoleView(fe *Frontend) *consoleView {
	return &consoleView{fe: fe, changed: notify.NewSignal(), caughtUp: make(chan struct{}),
		recent: projections.NewRecent(fe.cfg.ConsoleRequests), limit: 4 * fe.cfg.ConsoleRequests,
		cursor: newCursor(fe.parts)}
}

// run gives the console the frontend's lifetime: readers start on ctx, and
// run stops them when ctx is done.
func (c *consoleView) run(ctx context.Context) {
	c.startMu.Lock()
	c.ctx = ctx
	c.startMu.Unlock()
	<-ctx.Done()
	c.startMu.Lock()
	defer c.startMu.Unlock()
	c.ctx = nil
	for _, cc := range c.consumers {
		cc.Stop()
	}
	c.consumers = nil
}

// start starts the readers once, on the frontend's lifetime, and waits up to
// consoleCatchUp for them to catch up.
func (c *consoleView) start(ctx context.Context) error {
	c.startMu.Lock()
	if !c.started {
		if c.ctx == nil || c.fe.isDraining() {
			c.startMu.Unlock()
			return fmt.Errorf("console: the frontend is not running")
		}
		if err := c.follow(); err != nil {
			c.startMu.Unlock()
			return err // tried again by the next caller
		}
		c.started = true
	}
	c.startMu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, consoleCatchUp)
	defer cancel()
	select {
	case <-c.caughtUp:
	case <-wctx.Done():
	}
	return nil
}

// follow starts the readers, one per request partition and one of
// BATON_WORKERS; if one cannot start, none runs.
// Called with startMu held.
func (c *consoleView) follow() (err error) {
	ctx := c.ctx
	var started []jetstream.ConsumeContext
	defer func() {
		if err != nil {
			for _, cc := range started {
				cc.Stop()
			}
		}
	}()
	since := time.Now().Add(-c.fe.cfg.ConsoleWindow)
	c.mu.Lock()
	c.cursor = newCursor(c.fe.parts) // the frontend knows the layout now
	c.mu.Unlock()
	names := append(c.fe.parts.Streams(), streams.WorkersStream)
	var pending atomic.Int32 // readers not caught up yet
	pending.Store(int32(len(names)))
	caughtUp := func() {
		if pending.Add(-1) == 0 {
			close(c.caughtUp)
		}
	}
	for _, name := range names {
		// Caught up: the stream's last message as of now was applied, or the
		// server said nothing is pending, or the window holds nothing.
		cctx, cancel := context.WithTimeout(ctx, streams.DefaultTimeout)
		defer cancel()
		stream, err := c.fe.js.Stream(cctx, name)
		if err != nil {
			return fmt.Errorf("console: follow %s: %w", name, err)
		}
		last := stream.CachedInfo().State.LastSeq
		cons, err := stream.OrderedConsumer(cctx, jetstream.OrderedConsumerConfig{
			DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since,
		})
		if err != nil {
			return fmt.Errorf("console: follow %s: %w", name, err)
		}
		var once sync.Once
		done := func() { once.Do(caughtUp) }
		if last == 0 {
			done()
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			md, err := m.Metadata()
			if err != nil {
				return
			}
			if e, err := events.Unmarshal(events.Header(m.Headers()), m.Data()); err == nil {
				e.Seq, e.Stored = md.Sequence.Stream, m.Subject()
				c.apply(name, e)
			}
			if md.NumPending == 0 || md.Sequence.Stream >= last {
				done()
			}
		})
		if err != nil {
			return fmt.Errorf("console: follow %s: %w", name, err)
		}
		if info, err := cons.Info(cctx); err == nil && info.NumPending == 0 && info.Delivered.Stream == 0 {
			done() // nothing stored in the window
		}
		started = append(started, cc)
	}
	c.consumers = append(c.consumers, started...)
	return nil
}

// apply folds an event of stream into the views.
func (c *consoleView) apply(stream string, e events.Envelope) {
	c.mu.Lock()
	changed := false
	k, isRequests := c.fe.parts.Partition(stream)
	if isRequests {
		changed = c.recent.ApplyPartition(k, e)
	} else {
		k = -1
	}
	if projections.InFeed(e.Event) {
		f := feedEntry{Stream: stream, Seq: e.Seq, partition: k}
		if c.cursor.after(f) {
			*c.cursor.seq(f) = e.Seq
			c.feed = feedInsert(c.feed, feedOf(f, e))
			if len(c.feed) > c.limit {
				c.feed = append(c.feed[:0], c.feed[len(c.feed)-c.limit:]...)
			}
			changed = true
		}
	}
	c.mu.Unlock()
	if changed {
		c.changed.Notify()
	}
}

// feedInsert inserts f into feed, which is in time order, and returns it:
// after the entries of f's stream (it comes after them in the log), and
// after every entry not later than it. The streams' readers deliver their
// backlogs concurrently, each in its own order, so appending would put one
// backlog after the other; this merges them by event time, and keeps each
// stream in its log's order even when the clocks of its writers disagree.
func feedInsert(feed []feedEntry, f feedEntry) []feedEntry {
	i := len(feed)
	for i > 0 && feed[i-1].Stream != f.Stream && feed[i-1].Time.After(f.Time) {
		i--
	}
	return slices.Insert(feed, i, f)
}

// feedOf completes f, the feed entry of e.
func feedOf(f feedEntry, e events.Envelope) feedEntry {
	f.Time, f.Type = e.Time, e.Type()
	f.Kind, f.Source, f.Summary = projections.Kind(e.Type()), e.Source, projections.Describe(e)
	if f.partition < 0 {
		f.WorkerID = e.Subject
	} else {
		f.RequestID = e.Subject
	}
	return f
}

// since returns the feed entries after cur, in time order, oldest first,
// and moves cur past them: each entry's ID is cur as it stands after it,
// so a reader that resumes after any ID it saw misses nothing of any stream.
func (c *consoleView) since(cur *feedCursor) []feedEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []feedEntry
	for _, e := range c.feed {
		if cur.after(e) {
			*cur.seq(e) = e.Seq
			e.ID = cur.String()
			out = append(out, e)
		}
	}
	return out
}

func (c *consoleView) requests(model, status string, limit int) []projections.RequestSummary {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.recent.Requests(model, status, limit)
}

// initConsole sets up the console and the metrics it adds to reg: the
// discovery view's workers by state, and the JetStream streams' size.
func (fe *Frontend) initConsole(reg prometheus.Registerer) error {
	fe.console = newConsoleView(fe)
	return reg.Register(&clusterCollector{fe: fe})
}

// registerConsole adds the console's page and data endpoints to mux. The
// data endpoints live under /v1/ beside the API, so that whatever guards the
// API guards them too; the page itself holds no data.
func (fe *Frontend) registerConsole(mux *http.ServeMux) {
	assets, _ := fs.Sub(consoleAssets, "console")
	files := http.StripPrefix("/console/", http.FileServerFS(assets))
	mux.Handle("GET /console/", files)
	mux.Handle("GET /console", http.RedirectHandler("/console/", http.StatusMovedPermanently))
	mux.HandleFunc("GET /v1/console/requests", fe.handleConsoleRequests)
	mux.HandleFunc("GET /v1/console/requests/{id}/timeline", fe.handleTimeline)
	mux.HandleFunc("GET /v1/console/frontends", fe.handleFrontends)
	mux.HandleFunc("GET /v1/console/events", fe.handleConsoleEvents)
	mux.HandleFunc("GET /v1/console/tenants", fe.tenants.ServeConsole)
}
