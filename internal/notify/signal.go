// Package notify is the broadcast of "something changed" that baton's
// services share: the request runtime's followers, the fleet view and the
// HTTP edge's counters.
package notify

import (
	"slices"
	"sync"
)

// Signal is a broadcast of "something changed": waiters take the current
// channel with C and are woken when Notify closes it; listeners get a poke
// on their own channel. Notifications coalesce. It is safe for concurrent
// use.
//
// A signal nobody waits on or listens to holds nothing but its lock: every
// followed request has two (thousands of streams at once), and most of
// their notifications wake one listener or none.
type Signal struct {
	mu        sync.Mutex
	ch        chan struct{}   // handed out by C, closed by the next Notify; nil: none handed out
	listeners []chan struct{} // each at most once
}

// NewSignal returns a signal nobody waits on yet.
func NewSignal() *Signal { return &Signal{} }

// C returns a channel closed at the next Notify.
func (s *Signal) C() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

// Listen pokes ch at every Notify until stop is called, without blocking:
// give ch a capacity of 1 and the pokes coalesce. One channel may listen to
// several signals, so a waiter needs no select over a varying number of
// channels. A channel already listening is not added twice; one stop ends it.
func (s *Signal) Listen(ch chan struct{}) (stop func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Contains(s.listeners, ch) {
		s.listeners = append(s.listeners, ch)
	}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.listeners = slices.DeleteFunc(s.listeners, func(c chan struct{}) bool { return c == ch })
	}
}

// Notify wakes every waiter and pokes every listener. When nobody took a
// channel since the last Notify there is none to close (and none is made):
// a follower notifies at every token, and most are waited on by listeners.
func (s *Signal) Notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
	for _, ch := range s.listeners {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
