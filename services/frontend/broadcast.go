package frontend

import "sync"

// signal is a broadcast of "something changed": waiters take the current
// channel with C and are woken when Notify closes it. Notifications coalesce.
type signal struct {
	mu sync.Mutex
	ch chan struct{}
}

func newSignal() *signal { return &signal{ch: make(chan struct{})} }

// C returns a channel closed at the next Notify.
func (s *signal) C() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ch
}

// Notify wakes every waiter.
func (s *signal) Notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.ch)
	s.ch = make(chan struct{})
}
