package projections_test

import (
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

func yes() *bool { v := true; return &v }
func no() *bool  { v := false; return &v }

// TestRequestExact: the fold keeps each continuation's verdict, from its
// first delta or its completion, and a request is exact unless a
// continuation that contributed to its answer was approximate or not
// shown exact; the verdict survives compaction.
func TestRequestExact(t *testing.T) {
	firstDelta := func(k, off int, text string, exact *bool) events.TokensGenerated {
		d := delta(k, off, text)
		d.Exact = exact
		return d
	}
	done := func(k int, exact *bool) events.RequestCompleted {
		c := completed(k)
		c.Exact = exact
		return c
	}
	migratedAt := func(cut int) []events.Event {
		return []events.Event{accepted(10), routed(0, "w", 0), delta(0, 0, "abc"), fenced(0, 3), migrated(0, 3), routed(1, "w2", 3)}
	}
	for _, c := range []struct {
		name            string
		evs             []events.Event
		continued, want bool
	}{
		{"no migration", []events.Event{accepted(10), routed(0, "w", 0), delta(0, 0, "abc"), completed(0)}, false, true},
		{"token ids: exact from the first delta", append(migratedAt(3), firstDelta(1, 3, "de", yes())), true, true},
		{"token ids, completed", append(migratedAt(3), firstDelta(1, 3, "de", yes()), done(1, yes())), true, true},
		{"prefill, running: not shown exact yet", append(migratedAt(3), delta(1, 3, "de")), true, false},
		{"prefill, the engine's usage shows it exact", append(migratedAt(3), delta(1, 3, "de"), done(1, yes())), true, true},
		{"prefill, approximate", append(migratedAt(3), delta(1, 3, "de"), done(1, no())), true, false},
		{"an older worker reports nothing", append(migratedAt(3), delta(1, 3, "de"), done(1, nil)), true, false},
		{"a continuation that produced nothing and moved on does not count",
			append(migratedAt(3), fenced(1, 3), migrated(1, 3), routed(2, "w3", 3), firstDelta(2, 3, "de", yes()), done(2, yes())), true, true},
		{"an approximate continuation cut later still counts",
			append(migratedAt(3), delta(1, 3, "de"), fenced(1, 5), migrated(1, 5), routed(2, "w3", 5), firstDelta(2, 5, "f", yes()), done(2, yes())), true, false},
		{"a continuation that completed with no token counts", append(migratedAt(3), done(1, no())), true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := fold(stored(c.evs...))
			if got := r.Continued(); got != c.continued {
				t.Errorf("Continued() = %v, want %v", got, c.continued)
			}
			if got := r.Exact(); got != c.want {
				t.Errorf("Exact() = %v, want %v", got, c.want)
			}
			if got := r.State().Exact; got != c.want {
				t.Errorf("State().Exact = %v, want %v", got, c.want)
			}
			if !r.Status.Terminal() {
				return
			}
			rec, err := r.Compact()
			if err != nil {
				t.Fatal(err)
			}
			again := fold(stored(accepted(10), rec))
			if again.Exact() != c.want || again.Continued() != c.continued {
				t.Errorf("after compaction: Exact() = %v, Continued() = %v, want %v, %v", again.Exact(), again.Continued(), c.want, c.continued)
			}
			cnt := projections.NewRequestCounter()
			for _, e := range stored(c.evs...) {
				cnt.Apply(e)
			}
			if cnt.Exact() != c.want {
				t.Errorf("a counter's Exact() = %v, want %v", cnt.Exact(), c.want)
			}
		})
	}
}
