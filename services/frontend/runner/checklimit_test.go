package runner

import (
	"testing"
	"time"
)

// TestCheckLimiter: a worker's checks are admitted while it has answering
// time left (charged with each check's cost) and fewer than checkInFlight in
// progress; one worker's use does not touch another's.
func TestCheckLimiter(t *testing.T) {
	now := time.Unix(0, 0)
	l := newCheckLimiter(0.1, 300*time.Millisecond, func() time.Time { return now })
	for i := range 3 { // three checks of 100 ms spend the burst
		if _, ok := l.allow("w1"); !ok {
			t.Fatalf("check %d of the burst refused", i)
		}
		l.done("w1", 100*time.Millisecond)
	}
	if wait, ok := l.allow("w1"); ok || wait != time.Millisecond {
		t.Errorf("the burst spent: got %v, %v; want refused, retry after 1ms", wait, ok)
	}
	if _, ok := l.allow("w2"); !ok {
		t.Error("w2 refused for w1's checks")
	}
	l.done("w2", 0)
	// A check of 1 s overdraws: 10 s at 10% to pay it back.
	now = now.Add(time.Second)
	if _, ok := l.allow("w1"); !ok {
		t.Fatal("after 1 s at 10%: refused")
	}
	l.done("w1", time.Second)
	if wait, ok := l.allow("w1"); ok || wait < 8*time.Second || wait > 10*time.Second {
		t.Errorf("after an overdraft of 900 ms: got %v, %v; want refused for about 9 s", wait, ok)
	}
	now = now.Add(time.Hour)
	for i := range checkInFlight + 1 {
		if _, ok := l.allow("w1"); ok != (i < checkInFlight) {
			t.Errorf("check %d in progress at once: got %v, want %v", i, ok, i < checkInFlight)
		}
	}
	l.done("w1", 0)
	if _, ok := l.allow("w1"); !ok {
		t.Error("a check after one ended: refused")
	}
}

// TestCheckRefusalsAnswered: at most checkRefusals refusals a second are
// answered; the rest of a flood gets no reply.
func TestCheckRefusalsAnswered(t *testing.T) {
	now := time.Unix(0, 0)
	l := newCheckLimiter(0.1, time.Second, func() time.Time { return now })
	for i := range checkRefusals + 5 {
		if got := l.answerRefusal("w1"); got != (i < checkRefusals) {
			t.Errorf("refusal %d: answered %v, want %v", i, got, i < checkRefusals)
		}
	}
	if !l.answerRefusal("w2") {
		t.Error("w2's refusal dropped for w1's flood")
	}
	now = now.Add(time.Second)
	if !l.answerRefusal("w1") {
		t.Error("a second later: dropped, want answered")
	}
}
