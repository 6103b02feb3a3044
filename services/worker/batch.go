package worker

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
)

// The coalescer is the worker's half of issue 33's write path
// (docs/internals.md, "The write path of many tokens per message"): the
// deltas of all the worker's running attempts, grouped by destination (the
// frontend that owns the request), leave as one batch per destination and
// window instead of one message each. The batched writer (batched.go) uses
// it for the attempts whose dispatch asks for batches, which no frontend
// does yet: the worker appends a message per delta (delta.go) until the
// write path is switched on, behind the two-release rule of
// docs/compatibility.md.

// Defaults of coalescerConfig.
const (
	defaultBatchWindow     = 2 * time.Millisecond
	defaultBatchMaxBytes   = 64 << 10
	defaultBatchMaxEntries = 500
)

// coalescerConfig sets how a coalescer groups entries. Zero values mean the
// defaults.
type coalescerConfig struct {
	Source     string        // the worker's event source: every batch's ce-source
	IDPrefix   string        // a batch's ce-id is IDPrefix "." <n>, n counting from 1
	Window     time.Duration // the longest an entry waits for others; default 2ms
	MaxBytes   int           // flush a batch whose body reached this size; default 64 KiB
	MaxEntries int           // flush a batch that holds this many entries; default 500
	// FlushIdle flushes an entry at once when no batch of its destination
	// is in flight (flushed, and not yet acked: coalescer.acked), as
	// Nagle's algorithm does: an idle worker adds no window to a token's
	// latency, and a busy one batches what arrives while its last batch
	// is in flight (up to Window).
	FlushIdle bool
}

// withDefaults returns c with its zero values replaced by the defaults, and
// every problem with it.
func (c coalescerConfig) withDefaults() (coalescerConfig, error) {
	var errs []error
	if strings.TrimSpace(c.IDPrefix) == "" || strings.ContainsAny(c.IDPrefix, " \t\r\n") {
		errs = append(errs, fmt.Errorf("batch id prefix %q: want a word", c.IDPrefix))
	}
	if _, err := events.NewBatchEncoder(c.Source); err != nil {
		errs = append(errs, err)
	}
	if c.Window < 0 || c.MaxBytes < 0 || c.MaxEntries < 0 {
		errs = append(errs, fmt.Errorf("batch window %v, max bytes %d, max entries %d: want none negative", c.Window, c.MaxBytes, c.MaxEntries))
	}
	if c.Window == 0 {
		c.Window = defaultBatchWindow
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = defaultBatchMaxBytes
	}
	if c.MaxEntries == 0 {
		c.MaxEntries = defaultBatchMaxEntries
	}
	return c, errors.Join(errs...)
}

// errCoalescerClosed: the coalescer was closed; nothing more is sent.
var errCoalescerClosed = errors.New("worker: coalescer closed")

// flushFunc sends the batch of one destination: its headers and body, valid
// only during the call (the coalescer reuses both).
type flushFunc func(dest string, h events.Header, body []byte)

// coalescer groups the entries of many attempts by destination into
// batches. An entry added with now set (an attempt's first delta, for the
// time to first token) is flushed at once with everything its destination
// holds; otherwise a destination's batch is flushed Window after its first
// entry, or as soon as it holds MaxEntries entries or MaxBytes of body
// (MaxBytes may be passed by the last entry). Close flushes what is left.
//
// It is safe for concurrent use. Batches are flushed one at a time, with
// the coalescer's lock held, in the order they were closed: the entries of
// one destination reach flush in the order they were added, so an
// attempt's order is kept. flush must not call the coalescer; while it
// blocks (a full window of unacknowledged appends), so does every add.
type coalescer struct {
	cfg   coalescerConfig
	flush flushFunc

	mu     sync.Mutex
	dests  map[string]*destBatch // destinations with entries waiting
	free   []*destBatch          // emptied batches, kept for their buffers
	hdr    events.Header         // the last batch's header map, reused
	idBuf  []byte
	seq    uint64
	flying map[string]int // FlushIdle: batches flushed and not acked, by destination
	closed bool
	err    error // a batch that could not be formed (never, unless a bug): returned by add and close
}

// destBatch is the batch being filled for one destination.
type destBatch struct {
	name  string
	enc   *events.BatchEncoder
	timer *time.Timer
	gen   uint64 // batches flushed from it: a timer armed for an earlier one does nothing
}

// maxFreeBatches bounds the emptied batches a coalescer keeps.
const maxFreeBatches = 16

// newCoalescer returns a coalescer that hands its batches to flush.
func newCoalescer(cfg coalescerConfig, flush flushFunc) (*coalescer, error) {
	cfg, err := cfg.withDefaults()
	if flush == nil {
		err = errors.Join(err, errors.New("no flush function"))
	}
	if err != nil {
		return nil, fmt.Errorf("worker: coalescer: %w", err)
	}
	return &coalescer{cfg: cfg, flush: flush, dests: make(map[string]*destBatch), flying: make(map[string]int)}, nil
}

// addDelta adds ev, a delta stored under event id (empty: its usual id) at
// t, to dest's batch; first flushes that batch at once.
func (c *coalescer) addDelta(dest, id string, t time.Time, ev events.TokensGenerated, first bool) error {
	return c.add(dest, first, func(b *events.BatchEncoder) error { return b.AppendDelta(id, t, ev) })
}

// addEvent adds e, a request event (an attempt's completion or failure), to
// dest's batch; now flushes that batch at once.
func (c *coalescer) addEvent(dest string, e events.Envelope, now bool) error {
	return c.add(dest, now, func(b *events.BatchEncoder) error { return b.AppendEvent(e) })
}

// add has write append entries to dest's batch, then flushes it if now
// or a cap is reached, or arms its window if they are its first.
func (c *coalescer) add(dest string, now bool, write func(*events.BatchEncoder) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errCoalescerClosed
	}
	if c.err != nil {
		return c.err
	}
	d := c.dests[dest]
	if d == nil {
		d = c.take(dest)
	}
	before := d.enc.Entries()
	err := write(d.enc)
	switch n := d.enc.Entries(); {
	case n == 0:
		c.release(d)
	case now || n >= c.cfg.MaxEntries || d.enc.Size() >= c.cfg.MaxBytes || c.cfg.FlushIdle && c.flying[dest] == 0:
		c.flushLocked(d)
	case before == 0:
		gen := d.gen
		d.timer = time.AfterFunc(c.cfg.Window, func() { c.expire(d, gen) })
	}
	return errors.Join(err, c.err)
}

// take returns an empty batch for dest, registered as its.
func (c *coalescer) take(dest string) *destBatch {
	var d *destBatch
	if n := len(c.free); n > 0 {
		d, c.free = c.free[n-1], c.free[:n-1]
	} else {
		enc, _ := events.NewBatchEncoder(c.cfg.Source) // the source was checked by newCoalescer
		d = &destBatch{enc: enc}
	}
	d.name = dest
	c.dests[dest] = d
	return d
}

// release empties d and forgets it as its destination's batch. Called with
// mu held.
func (c *coalescer) release(d *destBatch) {
	if d.timer != nil {
		d.timer.Stop() // a callback under way finds gen changed
		d.timer = nil
	}
	d.enc.Reset()
	d.gen++
	delete(c.dests, d.name)
	if len(c.free) < maxFreeBatches {
		c.free = append(c.free, d)
	}
}

// expire flushes d's batch at the end of its window, unless it was flushed
// already.
func (c *coalescer) expire(d *destBatch, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d.gen == gen && !c.closed {
		c.flushLocked(d)
	}
}

// flushLocked hands d's batch to flush and releases d. Called with mu held.
func (c *coalescer) flushLocked(d *destBatch) {
	c.seq++
	c.idBuf = strconv.AppendUint(append(append(c.idBuf[:0], c.cfg.IDPrefix...), '.'), c.seq, 10)
	h, body, err := d.enc.Message(c.hdr, string(c.idBuf))
	if err != nil {
		c.err = errors.Join(c.err, fmt.Errorf("worker: batch for %s: %w", d.name, err))
	} else {
		c.hdr = h
		if c.cfg.FlushIdle {
			c.flying[d.name]++
		}
		c.flush(d.name, h, body)
	}
	c.release(d)
}

// acked tells a FlushIdle coalescer that a batch of dest flushed earlier
// was acknowledged (or failed): with none of dest's left in flight, what
// dest's batch holds goes at once, before its window ends. It must not be
// called from flush (it takes the lock flush runs under).
func (c *coalescer) acked(dest string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.flying[dest]--; c.flying[dest] > 0 {
		return
	}
	delete(c.flying, dest)
	if d := c.dests[dest]; d != nil && !c.closed {
		c.flushLocked(d)
	}
}

// close flushes every batch that holds entries (by destination name) and
// refuses what is added afterwards. It is idempotent; what it returns is
// the error of a batch that could not be formed, if any.
func (c *coalescer) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		for _, name := range slices.Sorted(maps.Keys(c.dests)) {
			c.flushLocked(c.dests[name])
		}
	}
	return c.err
}
