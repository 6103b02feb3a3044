package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// The upgrade profile (scripts/upgrade-test) starts the whole stack on the
// previous release's binary (-old-baton) and, under the same streaming load
// as the other profiles, upgrades it to the current one (-baton) one process
// at a time, in the order of docs/deployment.md, then downgrades it back:
//
//   - each worker: a new worker on the other binary, ready on every
//     frontend, then the old one SIGTERMed (it drains, exits 0);
//   - each NATS node: SIGTERM, restarted on the other binary with its store;
//     every replica current again before the next;
//   - each frontend: a new one on the other binary, serving and routing,
//     then the old one taken out of the clients' rotation and SIGTERMed
//     (exits 0).
//
// Up, the order is workers, NATS nodes, frontends; down, NATS nodes,
// workers, frontends: the NATS nodes restart while the workers run the newer
// release (the previous release's workers can store token deltas out of
// order when a node shuts down).
//
// Between two steps the traffic runs for a while on the mixed versions. The
// checks are the soak's, stricter: no request may fail and no 503 may be
// answered, and every request is replayed from the log by both binaries'
// `baton replay`, which must agree with the client.

// upgrade runs the upgrade and the downgrade; it returns the steps as faults
// (kind, target, how long the step took).
func (h *harness) upgrade(rng *rand.Rand, begin time.Time) []fault {
	var out []fault
	step := func(kind, target string, do func() error) bool {
		f := fault{kind: kind, target: target, at: time.Since(begin)}
		start := time.Now()
		if err := do(); err != nil {
			f.err = err.Error()
		}
		f.recover = time.Since(start)
		fmt.Printf("  %6.1fs  %-18s %-10s took %v %s\n", f.at.Seconds(), f.kind, f.target, f.recover.Round(time.Millisecond), f.err)
		out = append(out, f)
		time.Sleep(h.cfg.gapMin + time.Duration(rng.Int64N(int64(h.cfg.gapMax-h.cfg.gapMin)+1))) // traffic on the mixed versions
		return f.err == ""
	}
	oldBin, newBin := h.oldBin, h.newBin
	nextID := 1
	nats := func(phase string) bool {
		for _, n := range h.nodes {
			if !step(phase+"_nats", n.name, func() error { return h.restartNode(n) }) {
				return false
			}
		}
		return true
	}
	workers := func(phase string) bool {
		h.mu.Lock()
		var olds []*workerSlot
		for _, w := range h.workers {
			if !w.gone {
				olds = append(olds, w)
			}
		}
		h.mu.Unlock()
		for _, old := range olds {
			nw := &workerSlot{id: fmt.Sprintf("u%d", nextID)}
			nextID++
			if !step(phase+"_worker", old.id+"→"+nw.id, func() error { return h.rollWorker(old, nw) }) {
				return false
			}
		}
		return true
	}
	frontends := func(phase string) bool {
		for slot := range h.fronts {
			if !step(phase+"_frontend", fmt.Sprintf("fe%d", slot+1), func() error { return h.rollFrontend(slot) }) {
				return false
			}
		}
		return true
	}
	// NATS nodes restart while the workers run the newer release (see
	// docs/deployment.md): workers first on the way up, NATS first on the
	// way down.
	h.bin = newBin
	if !workers("upgrade") || !nats("upgrade") || !frontends("upgrade") {
		return out
	}
	h.bin = oldBin
	if !nats("downgrade") || !workers("downgrade") || !frontends("downgrade") {
		return out
	}
	return out
}

// restartNode stops NATS node n with SIGTERM (it must exit 0) and starts it
// again, with its store, on the harness's current binary; it returns once
// every request partition has a leader and current replicas.
func (h *harness) restartNode(n *natsNode) error {
	if err := n.p.term(n.name, 30*time.Second); err != nil {
		return err
	}
	if err := h.startNode(n); err != nil {
		return err
	}
	for k := range h.parts().Count() {
		if _, _, err := h.requestsLeader(k, 90*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// rollWorker starts nw on the current binary, waits until every frontend
// routes to it, then SIGTERMs old, which must drain and exit 0 and leave
// every frontend's routing.
func (h *harness) rollWorker(old, nw *workerSlot) error {
	h.mu.Lock()
	h.workers = append(h.workers, nw)
	h.mu.Unlock()
	if err := h.startSlot(nw); err != nil {
		return err
	}
	if err := h.waitReady(nw.id, 30*time.Second); err != nil {
		return err
	}
	old.p.Signal(syscall.SIGTERM)
	if !old.p.WaitFor(time.Duration(h.cfg.drainSecs)*time.Second + 20*time.Second) {
		old.p.Stop()
		return fmt.Errorf("%s did not exit after SIGTERM; killed", old.id)
	}
	h.mu.Lock()
	old.gone = true
	h.mu.Unlock()
	if err := old.p.Err(); err != nil {
		return fmt.Errorf("%s: exit after SIGTERM: %v, want 0", old.id, err)
	}
	return h.waitUnroutable(old.id, 30*time.Second)
}

// rollFrontend starts a new frontend process in slot on the current binary,
// waits until it routes, then takes the old one out of the clients'
// rotation and SIGTERMs it: it must exit 0 (its open streams resume on the
// others).
func (h *harness) rollFrontend(slot int) error {
	old := h.current()[slot]
	inc, err := h.startFrontend(slot)
	if err != nil {
		return err
	}
	if err := waitUntil(30*time.Second, inc.id+" to route", func() bool {
		ready, ok := inc.readyWorkers()
		return ok && len(ready) > 0
	}); err != nil {
		return err
	}
	old.mu.Lock()
	old.killed, old.termed, old.draining = true, true, true
	old.mu.Unlock()
	return old.p.term(old.id, 30*time.Second)
}

// checkUpgrade holds the upgrade profile's bars: no failed request, no 503,
// and every request replayed by both binaries as its client saw it.
func (h *harness) checkUpgrade(ctx context.Context, r *report, outs []*outcome) {
	if h.oldBin == "" {
		return
	}
	if r.failed > 0 || r.unavail > 0 {
		r.violate("upgrade: %d requests failed and %d 503s were answered, want none", r.failed, r.unavail)
	}
	type job struct {
		bin, name string
		o         *outcome
	}
	jobs := make(chan job)
	var mu sync.Mutex
	var wg sync.WaitGroup
	replayed := map[string]int{}
	for range 4 {
		wg.Go(func() {
			for j := range jobs {
				err := h.replayAgrees(ctx, j.bin, j.o)
				mu.Lock()
				if err != nil {
					r.violate("%s: `baton replay` of the %s release: %v", j.o.id, j.name, err)
				} else {
					replayed[j.name]++
				}
				mu.Unlock()
			}
		})
	}
	for _, o := range outs {
		if !o.done {
			continue
		}
		jobs <- job{h.oldBin, "previous", o}
		jobs <- job{h.newBin, "current", o}
	}
	close(jobs)
	wg.Wait()
	r.replayed = replayed
}

// replayAgrees runs bin's `baton replay --json` of o and checks that the log,
// read by that version, says completed with the client's text.
func (h *harness) replayAgrees(ctx context.Context, bin string, o *outcome) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "replay", "--json", "--nats", h.natsURLs(), o.id).Output()
	if err != nil {
		return fmt.Errorf("%v: %s", err, clip(string(out)))
	}
	var doc struct {
		Request struct {
			Status string `json:"status"`
		} `json:"request"`
		Output string `json:"output"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return fmt.Errorf("not JSON: %v", err)
	}
	if doc.Request.Status != "completed" || doc.Output != o.text.String() {
		return fmt.Errorf("status %q, output equal to the client's: %v", doc.Request.Status, doc.Output == o.text.String())
	}
	return nil
}
