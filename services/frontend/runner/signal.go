package runner

import "sync"

// Signal is a broadcast of "something changed": waiters take the current
// channel with C and are woken when Notify closes it; listeners get a poke
// on their own channel. Notifications coalesce. It is safe for concurrent
// use; the HTTP edge uses it too, for its own counters and views.
type Signal struct {
	mu        sync.Mutex
	ch        chan struct{}
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

// Notify wakes every waiter and pokes every listener.
func (s *Signal) Notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.ch)
	s.ch = make(chan struct{})
	for ch := range s.listeners {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
