package worker

import (
	"testing"
	"time"
)

// A routed notice for a dispatch not seen yet is kept for earlyTTL, once,
// and the notices kept are bounded: the oldest beyond earlyTTL go first,
// and at the bound room is made whatever their age.
func TestEarlyNoticesBounded(t *testing.T) {
	e := earlyNotices{}
	now := time.Now()
	e.note(jobKey{"r1", 0}, now)
	if !e.take(jobKey{"r1", 0}) {
		t.Fatal("a fresh notice was not kept")
	}
	if e.take(jobKey{"r1", 0}) {
		t.Fatal("a notice was taken twice")
	}
	e.note(jobKey{"stale", 0}, now.Add(-2*earlyTTL))
	if e.take(jobKey{"stale", 0}) {
		t.Fatal("a notice older than earlyTTL was taken")
	}
	for i := range maxEarly + 10 {
		e.note(jobKey{"r", i}, now)
	}
	if n := len(e); n > maxEarly {
		t.Fatalf("%d notices kept, more than %d", n, maxEarly)
	}
	if !e.take(jobKey{"r", maxEarly + 9}) {
		t.Fatal("the latest notice was dropped to make room")
	}
}
