package frontend

import (
	"context"
	"net/http"
	"sync"

	"github.com/baton-dev/baton/internal/notify"
)

// drain is the frontend's shutdown as its handlers see it: whether it is
// draining (refusing new requests) or closing (cutting open streams at the
// end of its budget), the responses still open, which the shutdown waits
// for, and the watchers of background responses, which it stops. Its
// channels are closed once each, in that order: draining, closing (only
// when the budget runs out), stopped.
type drain struct {
	draining chan struct{} // closed when shutdown starts
	closing  chan struct{} // closed when open streams are cut at the end of the budget
	stopped  chan struct{} // closed when Run ends: background responses stop counting

	background sync.WaitGroup // countUntilEnd's watchers of background responses

	mu       sync.Mutex     // guards open, and stopped's closing against background.Add
	open     int            // API responses being served (completions, resumes); guarded by mu
	openDone *notify.Signal // notified when open drops to zero
}

func newDrain() *drain {
	return &drain{draining: make(chan struct{}), closing: make(chan struct{}), stopped: make(chan struct{}),
		openDone: notify.NewSignal()}
}

// startBackground counts one more watcher of a background response, unless
// stopCounting began (false); the watcher calls background.Done when it
// ends.
func (d *drain) startBackground() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if isClosed(d.stopped) { // a handler cut at the end of a shutdown
		return false
	}
	d.background.Add(1)
	return true
}

// stopCounting ends the watchers of background responses (countUntilEnd)
// and waits for them.
func (d *drain) stopCounting() {
	d.mu.Lock()
	close(d.stopped)
	d.mu.Unlock()
	d.background.Wait()
}

// counted counts h's responses as open, so that a shutdown keeps accepting
// connections until they end (or the budget does).
func (d *drain) counted(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		d.open++
		d.mu.Unlock()
		defer func() {
			d.mu.Lock()
			d.open--
			idle := d.open == 0
			d.mu.Unlock()
			if idle {
				d.openDone.Notify()
			}
		}()
		h(w, r)
	}
}

// waitResponses waits until no counted response is open, or ctx is done.
func (d *drain) waitResponses(ctx context.Context) {
	for {
		ch := d.openDone.C()
		d.mu.Lock()
		n := d.open
		d.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

func (d *drain) isDraining() bool {
	select {
	case <-d.draining:
		return true
	default:
		return false
	}
}

func (d *drain) isClosing() bool { return isClosed(d.closing) }

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
