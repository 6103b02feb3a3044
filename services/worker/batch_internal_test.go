package worker

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/baton-dev/baton/events"
)

// Every test here runs in a testing/synctest bubble: a time.Sleep in it
// moves the bubble's fake clock (no wall time passes, and synctest.Wait
// waits for the coalescer's timers to have fired), which is how these
// tests step through a flush window to the nanosecond.

// sentBatch is a batch as flush got it, decoded, and when.
type sentBatch struct {
	dest    string
	id      string
	at      time.Duration // since the recorder was made
	entries []events.Envelope
}

// recorder is a flushFunc that decodes and keeps what it is given.
type recorder struct {
	t     *testing.T
	start time.Time
	mu    sync.Mutex
	got   []sentBatch
}

func newRecorder(t *testing.T) *recorder { return &recorder{t: t, start: time.Now()} }

func (r *recorder) flush(dest string, h events.Header, body []byte) {
	d, err := events.DecodeBatch(h, body)
	if err != nil {
		r.t.Errorf("flush to %s: %v", dest, err)
		return
	}
	b := sentBatch{dest: dest, id: h[events.HeaderID][0], at: time.Since(r.start)}
	for {
		e, err := d.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			r.t.Errorf("flush to %s: %v", dest, err)
			return
		}
		b.entries = append(b.entries, e)
	}
	r.mu.Lock()
	r.got = append(r.got, b)
	r.mu.Unlock()
}

func (r *recorder) batches() []sentBatch {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// summary is a batch as "dest@at: id id ...", the ids of its entries.
func (b sentBatch) summary() string {
	ids := make([]string, len(b.entries))
	for i, e := range b.entries {
		ids[i] = e.ID
	}
	return fmt.Sprintf("%s@%v: %s", b.dest, b.at, strings.Join(ids, " "))
}

// expect waits until the bubble's goroutines are idle (synctest.Wait),
// then fails t unless the batches flushed so far are want (summaries).
func (r *recorder) expect(t *testing.T, step string, want ...string) {
	t.Helper()
	synctest.Wait()
	if got := summaries(r.batches()); !slices.Equal(got, want) {
		t.Fatalf("%s: batches\n%q\nwant\n%q", step, got, want)
	}
}

func summaries(bs []sentBatch) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.summary()
	}
	return out
}

func tok(req string, offset int) events.TokensGenerated {
	return events.TokensGenerated{RequestID: req, Attempt: 0, Offset: offset, Tokens: []string{fmt.Sprintf("t%d ", offset)}, IDs: []int{offset}}
}

func newTestCoalescer(t *testing.T, r *recorder, cfg coalescerConfig) *coalescer {
	t.Helper()
	cfg.Source, cfg.IDPrefix = "baton/worker/w1", "w1"
	c, err := newCoalescer(cfg, r.flush)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustAdd(t *testing.T, c *coalescer, dest string, ev events.TokensGenerated, first bool) {
	t.Helper()
	if err := c.addDelta(dest, "", time.Now(), ev, first); err != nil {
		t.Fatal(err)
	}
}

// TestCoalescerWindow: an attempt's first delta goes at once, with what its
// destination held; later deltas wait for the window that their batch's
// first entry opened, not a moment less, and go together; each destination
// has its own batch and window.
func TestCoalescerWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(t)
		c := newTestCoalescer(t, r, coalescerConfig{})
		ms := time.Millisecond
		check := func(step string, want ...string) { t.Helper(); r.expect(t, step, want...) }
		mustAdd(t, c, "fe-1", tok("a", 0), true)
		check("a's first delta", "fe-1@0s: a.0.0")
		time.Sleep(ms / 2)
		mustAdd(t, c, "fe-1", tok("a", 1), false)
		time.Sleep(ms / 2)
		mustAdd(t, c, "fe-2", tok("b", 5), false)
		mustAdd(t, c, "fe-1", tok("a", 2), false)
		time.Sleep(ms + ms/2 - time.Nanosecond) // 1 ns before a.0.1's window ends
		check("before the window", "fe-1@0s: a.0.0")
		time.Sleep(time.Nanosecond)
		check("at the end of the window", "fe-1@0s: a.0.0", "fe-1@2.5ms: a.0.1 a.0.2")
		mustAdd(t, c, "fe-2", tok("c", 0), true) // c's first delta takes b's along
		check("c's first delta", "fe-1@0s: a.0.0", "fe-1@2.5ms: a.0.1 a.0.2", "fe-2@2.5ms: b.0.5 c.0.0")
		time.Sleep(10 * ms)
		check("nothing left", "fe-1@0s: a.0.0", "fe-1@2.5ms: a.0.1 a.0.2", "fe-2@2.5ms: b.0.5 c.0.0")
		mustAdd(t, c, "fe-2", tok("c", 1), false)
		time.Sleep(2 * ms)
		check("a new window", "fe-1@0s: a.0.0", "fe-1@2.5ms: a.0.1 a.0.2", "fe-2@2.5ms: b.0.5 c.0.0", "fe-2@14.5ms: c.0.1")
		if err := c.close(); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, b := range r.batches() {
			ids = append(ids, b.id)
		}
		if want := []string{"w1.1", "w1.2", "w1.3", "w1.4"}; !slices.Equal(ids, want) {
			t.Errorf("batch ids %q, want %q", ids, want)
		}
	})
}

// TestCoalescerFlushIdle: with FlushIdle, an entry for a destination with
// no batch in flight goes at once; entries that come while one is in
// flight wait for its acknowledgement (acked), not for their window, or
// for the window when the acknowledgement is later; each destination is
// on its own.
func TestCoalescerFlushIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(t)
		c := newTestCoalescer(t, r, coalescerConfig{FlushIdle: true})
		ms := time.Millisecond
		check := func(step string, want ...string) { t.Helper(); r.expect(t, step, want...) }
		mustAdd(t, c, "fe-1", tok("a", 1), false)
		check("idle", "fe-1@0s: a.0.1")
		time.Sleep(ms / 2)
		mustAdd(t, c, "fe-1", tok("a", 2), false)
		mustAdd(t, c, "fe-2", tok("b", 1), false)
		check("fe-1 in flight, fe-2 idle", "fe-1@0s: a.0.1", "fe-2@500µs: b.0.1")
		time.Sleep(ms / 4)
		c.acked("fe-1")
		check("fe-1 acked", "fe-1@0s: a.0.1", "fe-2@500µs: b.0.1", "fe-1@750µs: a.0.2")
		mustAdd(t, c, "fe-1", tok("a", 3), false) // a.0.2 is in flight
		time.Sleep(2 * ms)
		check("no ack: the window", "fe-1@0s: a.0.1", "fe-2@500µs: b.0.1", "fe-1@750µs: a.0.2", "fe-1@2.75ms: a.0.3")
		if err := c.close(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestCoalescerCaps: a batch that reaches MaxEntries or MaxBytes goes at
// once, before its window ends, and the next entry opens a new window.
func TestCoalescerCaps(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  coalescerConfig
	}{
		{"entries", coalescerConfig{MaxEntries: 3}},
		{"bytes", coalescerConfig{MaxBytes: 60}}, // an entry is 22-30 bytes: the third reaches it
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newRecorder(t)
				c := newTestCoalescer(t, r, tt.cfg)
				for i := range 4 {
					mustAdd(t, c, "fe-1", tok("a", i), false)
					time.Sleep(100 * time.Microsecond)
				}
				synctest.Wait()
				want := []string{"fe-1@200µs: a.0.0 a.0.1 a.0.2"}
				if got := summaries(r.batches()); !slices.Equal(got, want) {
					t.Fatalf("batches %q, want %q", got, want)
				}
				time.Sleep(2 * time.Millisecond)
				synctest.Wait()
				want = append(want, "fe-1@2.3ms: a.0.3")
				if got := summaries(r.batches()); !slices.Equal(got, want) {
					t.Fatalf("then %q, want %q", got, want)
				}
			})
		})
	}
}

// TestCoalescerOrder: the deltas of many attempts, interleaved over two
// destinations with caps, windows and first deltas mixed, reach flush in
// the order they were added, each attempt's offsets one after the other,
// each exactly once; close sends what was left and refuses more.
func TestCoalescerOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(t)
		c := newTestCoalescer(t, r, coalescerConfig{MaxEntries: 7})
		reqs := []string{"a", "b", "c", "d", "e"}
		next := map[string]int{}
		var added []string
		for i := range 300 {
			req := reqs[(i*7+i/3)%len(reqs)]
			dest := "fe-1"
			if req == "b" || req == "d" {
				dest = "fe-2"
			}
			n := next[req]
			next[req]++
			mustAdd(t, c, dest, tok(req, n), n == 0)
			added = append(added, dest+" "+events.ID(req, 0, n))
			time.Sleep(time.Duration(i%5) * 300 * time.Microsecond)
		}
		if err := c.close(); err != nil {
			t.Fatal(err)
		}
		if err := c.close(); err != nil {
			t.Fatalf("second close: %v", err)
		}
		if err := c.addDelta("fe-1", "", time.Now(), tok("a", 999), false); !errors.Is(err, errCoalescerClosed) {
			t.Errorf("add after close: %v, want errCoalescerClosed", err)
		}
		synctest.Wait()
		perDest := map[string][]string{}
		for _, want := range added {
			dest, _, _ := strings.Cut(want, " ")
			perDest[dest] = append(perDest[dest], want)
		}
		got := map[string][]string{}
		for _, b := range r.batches() {
			if len(b.entries) == 0 || len(b.entries) > 7 {
				t.Errorf("batch %s: %d entries, want 1 to 7", b.id, len(b.entries))
			}
			for _, e := range b.entries {
				got[b.dest] = append(got[b.dest], b.dest+" "+e.ID)
				ev := e.Event.(events.TokensGenerated)
				if want := tok(ev.RequestID, ev.Offset); !slices.Equal(ev.Tokens, want.Tokens) || !slices.Equal(ev.IDs, want.IDs) {
					t.Errorf("%s: %v, want %v", e.ID, ev, want)
				}
			}
		}
		for dest, want := range perDest {
			if !slices.Equal(got[dest], want) {
				t.Errorf("%s: got %d entries\n%q\nwant in the order added\n%q", dest, len(got[dest]), got[dest], want)
			}
		}
	})
}

// TestCoalescerClose: close sends every waiting batch at once, and no
// window that was open fires afterwards.
func TestCoalescerClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(t)
		c := newTestCoalescer(t, r, coalescerConfig{})
		mustAdd(t, c, "fe-2", tok("b", 3), false)
		mustAdd(t, c, "fe-1", tok("a", 1), false)
		time.Sleep(time.Millisecond)
		if err := c.addEvent("fe-1", events.Envelope{ID: "a.0.completed", Subject: "a", Time: time.Now(),
			Event: events.RequestCompleted{RequestID: "a", FinishReason: "stop", CompletionTokens: 2}}, false); err != nil {
			t.Fatal(err)
		}
		if err := c.close(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		want := []string{"fe-1@1ms: a.0.1 a.0.completed", "fe-2@1ms: b.0.3"}
		if got := summaries(r.batches()); !slices.Equal(got, want) {
			t.Errorf("batches %q, want %q", got, want)
		}
	})
}

// TestCoalescerRefusedEntry: an entry the batch format refuses is not
// added, leaves no batch behind and opens no window.
func TestCoalescerRefusedEntry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(t)
		c := newTestCoalescer(t, r, coalescerConfig{})
		if err := c.addDelta("fe-1", "", time.Now(), tok("a b", 0), true); err == nil {
			t.Fatal("a request id with a space: got nil error")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := r.batches(); len(got) != 0 {
			t.Errorf("batches %q, want none", summaries(got))
		}
		if err := c.close(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestCoalescerConfig(t *testing.T) {
	flush := func(string, events.Header, []byte) {}
	c, err := newCoalescer(coalescerConfig{Source: "baton/worker/w1", IDPrefix: "w1"}, flush)
	if err != nil {
		t.Fatal(err)
	}
	if c.cfg.Window != 2*time.Millisecond || c.cfg.MaxBytes != 64<<10 || c.cfg.MaxEntries != 500 {
		t.Errorf("defaults %+v, want 2ms, 64 KiB, 500", c.cfg)
	}
	_, err = newCoalescer(coalescerConfig{Source: "%zz", IDPrefix: "a b", Window: -1}, nil)
	for _, want := range []string{"source", "prefix", "negative", "flush"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bad config: %v, want it to name the %s", err, want)
		}
	}
}

// BenchmarkCoalescerAdd is a worker's cost of one delta through the
// coalescer (lock, entry, a flush every 500 entries into a function that
// keeps nothing), its event id left to the format.
//
// Run: go test -run '^$' -bench BenchmarkCoalescerAdd -benchmem ./services/worker/
func BenchmarkCoalescerAdd(b *testing.B) {
	var flushed int
	c, err := newCoalescer(coalescerConfig{Source: "baton/worker/w1", IDPrefix: "w1", Window: time.Hour},
		func(_ string, _ events.Header, body []byte) { flushed += len(body) })
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]string, 64)
	for i := range reqs {
		reqs[i] = fmt.Sprintf("alice:req-%016d", i)
	}
	now := time.Now()
	tokens, ids := []string{" word"}, []int{42} // the worker's: slices of what it already holds
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		ev := events.TokensGenerated{RequestID: reqs[i%len(reqs)], Attempt: 1, Offset: 100 + i, Tokens: tokens, IDs: ids}
		if err := c.addDelta("fe-1", "", now, ev, false); err != nil {
			b.Fatal(err)
		}
	}
	if err := c.close(); err != nil {
		b.Fatal(err)
	}
}
