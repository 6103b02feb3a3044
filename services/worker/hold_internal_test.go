package worker

import (
	"testing"
	"time"
)

// A routed notice for a dispatch not seen yet is kept for earlyTTL, once,
// and the notices kept are bounded: the oldest beyond earlyTTL go first,
// and at the bound room is made whatever their age.
func TestEarlyNoticesBounded(t *testing.T) {
	w := &Worker{early: map[jobKey]time.Time{}}
	now := time.Now()
	w.noteEarly(jobKey{"r1", 0}, now)
	if !w.takeEarly(jobKey{"r1", 0}) {
		t.Fatal("a fresh notice was not kept")
	}
	if w.takeEarly(jobKey{"r1", 0}) {
		t.Fatal("a notice was taken twice")
	}
	w.noteEarly(jobKey{"stale", 0}, now.Add(-2*earlyTTL))
	if w.takeEarly(jobKey{"stale", 0}) {
		t.Fatal("a notice older than earlyTTL was taken")
	}
	for i := range maxEarly + 10 {
		w.noteEarly(jobKey{"r", i}, now)
	}
	if n := len(w.early); n > maxEarly {
		t.Fatalf("%d notices kept, more than %d", n, maxEarly)
	}
	if !w.takeEarly(jobKey{"r", maxEarly + 9}) {
		t.Fatal("the latest notice was dropped to make room")
	}
}
