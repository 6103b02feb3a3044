package notify

import "testing"

func TestSignalListen(t *testing.T) {
	a, b := NewSignal(), NewSignal()
	ch := make(chan struct{}, 1)
	stopA, stopB := a.Listen(ch), b.Listen(ch)
	a.Notify()
	b.Notify() // coalesces with a's poke
	select {
	case <-ch:
	default:
		t.Fatal("no poke after Notify")
	}
	select {
	case <-ch:
		t.Fatal("two pokes, want them coalesced")
	default:
	}
	stopA()
	a.Notify()
	select {
	case <-ch:
		t.Fatal("poked after stop")
	default:
	}
	b.Notify()
	if len(ch) != 1 {
		t.Error("the other signal no longer pokes")
	}
	stopB()
	w := a.C()
	a.Notify()
	select {
	case <-w:
	default:
		t.Error("C's channel not closed by Notify")
	}
}

// TestSignalUntakenChannel: a Notify that nobody waited for keeps the
// channel, and the next waiter is still woken by the next Notify, not by
// the earlier one.
func TestSignalUntakenChannel(t *testing.T) {
	s := NewSignal()
	w := s.C()
	s.Notify()
	s.Notify() // nobody took the new channel
	select {
	case <-w:
	default:
		t.Fatal("the waiter's channel not closed by Notify")
	}
	next := s.C()
	select {
	case <-next:
		t.Fatal("a channel taken after the last Notify is already closed")
	default:
	}
	s.Notify()
	select {
	case <-next:
	default:
		t.Fatal("the channel taken after an untaken Notify not closed by the next")
	}
}

// TestSignalListenTwice: a channel that listens twice is poked once per
// Notify, and either stop ends it (as when the listeners were a set).
func TestSignalListenTwice(t *testing.T) {
	s := NewSignal()
	ch := make(chan struct{}, 2)
	stop1, stop2 := s.Listen(ch), s.Listen(ch)
	s.Notify()
	if got, want := len(ch), 1; got != want {
		t.Fatalf("got %d pokes, want %d", got, want)
	}
	<-ch
	stop1()
	s.Notify()
	if got, want := len(ch), 0; got != want {
		t.Fatalf("after one stop: got %d pokes, want %d", got, want)
	}
	stop2() // a no-op now
	other := make(chan struct{}, 1)
	defer s.Listen(other)()
	s.Notify()
	if len(other) != 1 || len(ch) != 0 {
		t.Errorf("got %d pokes of the other listener and %d of the stopped one, want 1 and 0", len(other), len(ch))
	}
}
