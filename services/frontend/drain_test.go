package frontend

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"
)

// TestDrainWaitsForCountedResponses: waitResponses returns once every
// counted response ended, or when its ctx is done, whichever comes first.
func TestDrainWaitsForCountedResponses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDrain()
		release := make(chan struct{})
		h := d.counted(func(w http.ResponseWriter, r *http.Request) { <-release })
		for range 2 {
			go h(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
		}
		synctest.Wait() // both handlers are in
		waited := make(chan struct{})
		go func() {
			defer close(waited)
			d.waitResponses(context.Background())
		}()
		synctest.Wait()
		select {
		case <-waited:
			t.Fatal("waitResponses returned while two responses are open")
		default:
		}
		release <- struct{}{}
		synctest.Wait()
		select {
		case <-waited:
			t.Fatal("waitResponses returned while one response is open")
		default:
		}
		release <- struct{}{}
		<-waited

		// A response that does not end holds the wait until its ctx is done.
		go h(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		d.waitResponses(ctx)
		if got := time.Since(start); got != 5*time.Second {
			t.Errorf("waitResponses with a response open: returned after %v, want the ctx's 5s", got)
		}
		close(release)
	})
}

// TestDrainStopsBackground: stopCounting waits for the watchers of
// background responses that started, and no watcher starts after it.
func TestDrainStopsBackground(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDrain()
		if d.isDraining() || d.isClosing() {
			t.Fatal("a new drain is draining or closing")
		}
		if !d.startBackground() {
			t.Fatal("startBackground before stopCounting: false, want true")
		}
		watcherDone := false
		go func() {
			<-d.stopped
			watcherDone = true
			d.background.Done()
		}()
		d.stopCounting()
		if !watcherDone {
			t.Error("stopCounting returned before the watcher it stopped ended")
		}
		if d.startBackground() {
			t.Error("startBackground after stopCounting: true, want false")
		}
		close(d.draining)
		close(d.closing)
		if !d.isDraining() || !d.isClosing() {
			t.Error("draining and closing closed: isDraining or isClosing still false")
		}
	})
}
