package runner

import "sync"

// Signal is a broadcast of "something changed": waiters take the current
// channel with C and are woken when Notify closes it; listeners get a poke
// on their own channel. Notifications coalesce. It is safe for concurrent
// use; the HTTP edge uses it too, for its own counters and views.
type Signal struct {
	mu        sync.Mutex
	ch        chan struct{}
	taken     bool // C handed out ch: Notify must close it
	listeners map[chan struct{}]struct{}
}

// NewSignal returns a signal nobody waits on yet.
func NewSignal() *Signal {
	return &Signal{ch: make(chan struct{}), listeners: map[chan struct{}]struct{}{}}
}

// C returns a channel closed at the next Notify.
func (s *Signal) C() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.taken = true
	return s.ch
}

// Listen pokes ch at every Notify until stop is called, without blocking:
// give ch a capacity of 1 and the pokes coalesce. One channel may listen to
// several signals, so a waiter needs no select over a varying number of
// channels.
func (s *Signal) Listen(ch chan struct{}) (stop func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listeners[ch] = struct{}{}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.listeners, ch)
	}
}

// Notify wakes every waiter and pokes every listener. A channel nobody took
// is left open for the next Notify (closing it would wake nobody): a
// follower notifies at every token, and most are waited on by listeners.
func (s *Signal) Notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.taken {
		close(s.ch)
		s.ch, s.taken = make(chan struct{}), false
	}
	for ch := range s.listeners {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
