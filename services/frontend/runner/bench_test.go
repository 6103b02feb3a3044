package runner

import (
	"slices"
	"testing"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
)

func TestEmitTimes(t *testing.T) {
	stamped := func(v string) events.Envelope {
		return events.Envelope{Header: events.Header{streams.HeaderBenchEmit: {v}}}
	}
	type note struct {
		e        events.Envelope
		from, to int
	}
	for _, tc := range []struct {
		name     string
		notes    []note
		from, to int
		want     []int64
	}{
		{name: "no stamp: nothing kept", notes: []note{{events.Envelope{}, 0, 3}}, to: 3},
		{name: "every token of a delta gets its stamp", notes: []note{{stamped("7"), 0, 2}, {stamped("9"), 2, 3}},
			to: 3, want: []int64{7, 7, 9}},
		{name: "tokens before the first stamp are unknown", notes: []note{{events.Envelope{}, 0, 2}, {stamped("5"), 2, 3}},
			to: 3, want: []int64{0, 0, 5}},
		{name: "a malformed stamp is unknown", notes: []note{{stamped("5"), 0, 1}, {stamped("soon"), 1, 2}},
			to: 2, want: []int64{5, 0}},
		{name: "from an offset", notes: []note{{stamped("1"), 0, 1}, {stamped("2"), 1, 2}}, from: 1, to: 2, want: []int64{2}},
		{name: "past the end", notes: []note{{stamped("1"), 0, 1}}, from: 1, to: 3},
		{name: "to past the end is cut", notes: []note{{stamped("1"), 0, 1}}, to: 3, want: []int64{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var et emitTimes
			for _, n := range tc.notes {
				et.note(n.e, n.from, n.to)
			}
			if got := et.between(tc.from, tc.to); !slices.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
