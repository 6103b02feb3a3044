package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// The churn profile is an aggressive autoscaler (Dynamo issue #13088: 248
// worker adds and 149 removes in about 12 minutes left 24 of 1,536 requests
// hung). Every 0.3-1.5 s the pool changes: a worker is added (a new id), or
// removed by kill -9, by SIGTERM or by losing its lease (SIGSTOPped until
// every frontend has dropped it, then killed), or paused (SIGSTOP/SIGCONT),
// at a pool of 4-8 live workers; about one change in six replaces a
// frontend instead (SIGTERM or kill -9, a new process in its place). Changes
// overlap: each runs in its own goroutine, and the next starts on time.

// Pool bounds and the lease TTL of churned workers.
const (
	churnMinPool  = 4
	churnMaxPool  = 8
	churnLeaseTTL = 3 * time.Second
)

// churnStats is what the churn did to the pool.
type churnStats struct {
	adds, removes     int
	minPool, maxPool  int           // live workers, sampled at each change
	longestGap        time.Duration // between two consecutive changes
	changes           int
	slowest           fault // the change with the slowest recovery
	inFlightAtTheEnd  int   // changes still running when the churn stopped (then completed)
	frontendsReplaced int
}

// churn changes the pool until ctx is done, then waits for the changes in
// progress to complete; it returns them all as faults (kind, target,
// recovery) and the pool's figures.
func (h *harness) churn(ctx context.Context, rng *rand.Rand, begin time.Time) ([]fault, *churnStats) {
	st := &churnStats{minPool: len(h.workers), maxPool: len(h.workers)}
	var (
		mu      sync.Mutex
		out     []fault
		wg      sync.WaitGroup
		feBusy  bool
		lastAt  = time.Now()
		nextID  = 1
		record  = func(f fault) { mu.Lock(); out = append(out, f); mu.Unlock() }
		running int
	)
	run := func(kind, target string, at time.Duration, do func() error) {
		mu.Lock()
		running++
		mu.Unlock()
		wg.Go(func() {
			start := time.Now()
			err := do()
			f := fault{kind: kind, target: target, at: at, recover: time.Since(start)}
			if err != nil {
				f.err = err.Error()
			}
			fmt.Printf("  %6.1fs  %-20s %-12s recovered in %v %s\n", f.at.Seconds(), f.kind, f.target, f.recover.Round(time.Millisecond), f.err)
			record(f)
			mu.Lock()
			running--
			mu.Unlock()
		})
	}
	for tick := 0; ; tick++ {
		gap := h.cfg.gapMin + time.Duration(rng.Int64N(int64(h.cfg.gapMax-h.cfg.gapMin)+1))
		select {
		case <-ctx.Done():
			mu.Lock()
			st.inFlightAtTheEnd = running
			mu.Unlock()
			wg.Wait()
			for _, f := range out {
				if f.recover > st.slowest.recover {
					st.slowest = f
				}
			}
			return out, st
		case <-time.After(gap):
		}
		now := time.Now()
		at := now.Sub(begin)
		st.longestGap = max(st.longestGap, now.Sub(lastAt))
		lastAt = now
		st.changes++

		mu.Lock()
		fe := !feBusy && rng.IntN(6) == 0
		if fe {
			feBusy = true
		}
		mu.Unlock()
		if fe {
			slot := rng.IntN(len(h.fronts))
			kind := []string{"frontend_kill", "frontend_term"}[rng.IntN(2)]
			st.frontendsReplaced++
			run(kind, fmt.Sprintf("fe%d", slot+1), at, func() error {
				defer func() { mu.Lock(); feBusy = false; mu.Unlock() }()
				return h.replaceFrontend(slot, kind == "frontend_term")
			})
			continue
		}

		action, w := h.pickChange(rng, st, &nextID)
		sleep := time.Duration(500+rng.IntN(1500)) * time.Millisecond
		run(action, w.id, at, func() error {
			defer func() { h.mu.Lock(); w.busy = false; h.mu.Unlock() }()
			return h.churnWorker(action, w, sleep)
		})
	}
}

// pickChange picks the pool's next change and the worker it applies to,
// marked busy (and out of the pool, if it removes it): a new one (its id
// from *nextID) to grow the pool, an idle one to remove or pause. It counts
// the change in st.
func (h *harness) pickChange(rng *rand.Rand, st *churnStats, nextID *int) (string, *workerSlot) {
	h.mu.Lock()
	var idle []*workerSlot
	live := 0
	for _, w := range h.workers {
		if !w.gone {
			live++
			if !w.busy {
				idle = append(idle, w)
			}
		}
	}
	st.minPool, st.maxPool = min(st.minPool, live), max(st.maxPool, live)
	action := "worker_add"
	switch {
	case live >= churnMaxPool || (live > churnMinPool && rng.IntN(2) == 0):
		action = []string{"worker_kill", "worker_term", "worker_lease_expiry"}[rng.IntN(3)]
	case live > churnMinPool-1 && rng.IntN(4) == 0:
		action = "worker_stop"
	}
	var w *workerSlot
	if action != "worker_add" {
		if len(idle) == 0 {
			action = "worker_add" // every worker is busy with a change: grow instead
		} else {
			w = idle[rng.IntN(len(idle))]
			w.busy = true
			if action != "worker_stop" {
				w.gone = true // counted out of the pool from now on
			}
		}
	}
	if action == "worker_add" {
		w = &workerSlot{id: fmt.Sprintf("c%d", *nextID), busy: true}
		*nextID++
		h.workers = append(h.workers, w)
	}
	h.mu.Unlock()
	switch action {
	case "worker_add":
		st.adds++
	case "worker_stop":
	default:
		st.removes++
	}
	return action, w
}

// churnWorker applies one change to worker w and waits for the frontends to
// see it: an added worker ready everywhere, a removed one routable nowhere,
// a paused one ready again. Every signal is checked to have taken effect.
func (h *harness) churnWorker(action string, w *workerSlot, pause time.Duration) error {
	switch action {
	case "worker_add":
		if err := h.startSlot(w); err != nil {
			return err
		}
		return h.waitReady(w.id, 30*time.Second)
	case "worker_kill":
		if err := w.p.kill(10 * time.Second); err != nil {
			return err
		}
	case "worker_term":
		w.p.Signal(syscall.SIGTERM)
		if !w.p.WaitFor(time.Duration(h.cfg.drainSecs)*time.Second + 20*time.Second) {
			w.p.Stop()
			return fmt.Errorf("did not exit after SIGTERM; killed")
		}
		if err := w.p.Err(); err != nil {
			return fmt.Errorf("exit after SIGTERM: %v, want 0", err)
		}
	case "worker_lease_expiry":
		// A worker that vanished from the network: it holds its connection
		// and says nothing; only its lease expiring removes it.
		if err := w.p.pause(); err != nil {
			return err
		}
		if err := h.waitUnroutable(w.id, churnLeaseTTL+20*time.Second); err != nil {
			return fmt.Errorf("lease did not expire: %w", err)
		}
		return w.p.kill(10 * time.Second)
	case "worker_stop":
		if err := w.p.pause(); err != nil {
			return err
		}
		time.Sleep(pause)
		if err := w.p.Resume(); err != nil {
			return err
		}
		return h.waitReady(w.id, 30*time.Second)
	}
	return h.waitUnroutable(w.id, 30*time.Second)
}

// waitUnroutable waits until no current frontend lists worker id as ready.
func (h *harness) waitUnroutable(id string, timeout time.Duration) error {
	return waitUntil(timeout, "worker "+id+" out of every frontend's routing", func() bool {
		for _, f := range h.current() {
			if f.p.Exited() {
				continue
			}
			ready, ok := f.readyWorkers()
			if !ok || ready[id] {
				return false
			}
		}
		return true
	})
}

// readyWorkers is the set of workers this frontend routes to.
func (f *feInc) readyWorkers() (map[string]bool, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.url+"/v1/workers", nil)
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	var body struct {
		Data []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&body) != nil {
		return nil, false
	}
	ready := map[string]bool{}
	for _, w := range body.Data {
		if w.State == "ready" {
			ready[w.ID] = true
		}
	}
	return ready, true
}

// replaceFrontend ends the frontend in slot (SIGTERM, which must exit 0
// within its graceful budget, or kill -9) and starts a new process in its
// place, which must serve and see a routable worker.
func (h *harness) replaceFrontend(slot int, term bool) error {
	old := h.current()[slot]
	old.mu.Lock()
	old.killed = true // its counts after the last scrape are not seen, either way
	// A SIGTERM is what a scheduler sends after taking the process out of
	// its load balancer: clients stop picking it first. A kill -9 is not.
	old.draining, old.termed = term, term
	old.mu.Unlock()
	if term {
		if err := old.p.term(old.id, 30*time.Second); err != nil {
			return err
		}
	} else if err := old.p.kill(10 * time.Second); err != nil {
		return err
	}
	if err := refused(old.url); err != nil {
		return err
	}
	inc, err := h.startFrontend(slot)
	if err != nil {
		return err
	}
	return waitUntil(30*time.Second, inc.id+" to route", func() bool {
		ready, ok := inc.readyWorkers()
		return ok && len(ready) > 0
	})
}
