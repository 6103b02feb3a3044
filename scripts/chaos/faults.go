package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/baton-dev/baton/internal/promtext"
)

// Fault kinds, injected in this order, round and round; only the timing and
// the victims are random (seeded).
var faultKinds = []string{
	"worker_kill", "worker_stop", "frontend_kill", "nats_kill", "worker_term", "nats_leader_kill",
}

// fault is one injected fault and how long the stack took to recover.
type fault struct {
	kind    string
	target  string
	at      time.Duration // since the load started
	recover time.Duration // until the victim was back (restarted and ready)
	err     string        // the recovery did not complete
}

// injectFaults injects faults until ctx is done, one at a time, each followed
// by its recovery; it returns them all. A fault that started before ctx ended
// is completed (restart included) before it returns.
func (h *harness) injectFaults(ctx context.Context, rng *rand.Rand, begin time.Time) []fault {
	var out []fault
	for i := 0; ; i++ {
		gap := h.cfg.gapMin + time.Duration(rng.Int64N(int64(h.cfg.gapMax-h.cfg.gapMin)+1))
		select {
		case <-ctx.Done():
			return out
		case <-time.After(gap):
		}
		f := fault{kind: faultKinds[i%len(faultKinds)], at: time.Since(begin)}
		start := time.Now()
		var err error
		f.target, err = h.inject(f.kind, rng)
		f.recover = time.Since(start)
		if err != nil {
			f.err = err.Error()
		}
		fmt.Printf("  %6.1fs  %-16s %-8s recovered in %v %s\n", f.at.Seconds(), f.kind, f.target, f.recover.Round(time.Millisecond), f.err)
		out = append(out, f)
	}
}

// inject injects one fault of kind, checks that it took effect (a fault
// that did nothing is an error: the run would test nothing), and waits for
// the stack to recover.
func (h *harness) inject(kind string, rng *rand.Rand) (string, error) {
	switch kind {
	case "worker_kill", "worker_stop", "worker_term":
		return h.injectWorker(kind, rng)
	case "frontend_kill":
		return h.killFrontend(rng)
	case "nats_kill", "nats_leader_kill":
		return h.killNode(kind, rng)
	}
	return "", fmt.Errorf("unknown fault %q", kind)
}

// injectWorker kills, pauses or terminates a worker, then starts it again
// (a paused one resumes) and waits until it is ready.
func (h *harness) injectWorker(kind string, rng *rand.Rand) (string, error) {
	w := h.workers[rng.IntN(len(h.workers))]
	i := h.workerIndex(w.id)
	switch kind {
	case "worker_kill":
		if err := w.p.kill(10 * time.Second); err != nil {
			return w.id, err
		}
	case "worker_stop":
		if err := w.p.pause(); err != nil {
			return w.id, err
		}
		time.Sleep(time.Second + time.Duration(rng.Int64N(int64(2*time.Second))))
		return w.id, w.p.Resume()
	case "worker_term":
		w.p.Signal(syscall.SIGTERM)
		if !w.p.WaitFor(time.Duration(h.cfg.drainSecs)*time.Second + 20*time.Second) {
			w.p.Stop()
			return w.id, fmt.Errorf("did not exit after SIGTERM; killed")
		}
		if err := w.p.Err(); err != nil {
			return w.id, fmt.Errorf("exit after SIGTERM: %v, want 0", err)
		}
	}
	if err := h.startWorker(i); err != nil {
		return w.id, err
	}
	return w.id, h.waitReady(w.id, 30*time.Second)
}

// killFrontend kills a frontend with SIGKILL, checks that its address
// refuses connections, starts its successor and waits until every worker is
// ready there.
func (h *harness) killFrontend(rng *rand.Rand) (string, error) {
	slot := rng.IntN(len(h.fronts))
	old := h.current()[slot]
	old.mu.Lock()
	old.killed = true
	old.mu.Unlock()
	if err := old.p.kill(10 * time.Second); err != nil {
		return old.id, err
	}
	if err := refused(old.url); err != nil {
		return old.id, err
	}
	inc, err := h.startFrontend(slot)
	if err != nil {
		return old.id, err
	}
	for _, w := range h.workers {
		if err := h.waitReady(w.id, 30*time.Second); err != nil {
			return old.id + "→" + inc.id, err
		}
	}
	return old.id + "→" + inc.id, nil
}

// killNode kills a NATS node of a request partition's group, its leader
// (nats_leader_kill, which must move the leadership) or a follower
// (nats_kill), starts it again and waits until the partition has a leader.
func (h *harness) killNode(kind string, rng *rand.Rand) (string, error) {
	k := 0
	if n := h.parts().Count(); n > 1 {
		k = rng.IntN(n) // the same victims for a seed as before partitions when there is one
	}
	leader, followers, err := h.requestsLeader(k, 60*time.Second)
	if err != nil {
		return "", err
	}
	victim := leader
	if kind == "nats_kill" {
		victim = followers[rng.IntN(len(followers))]
	}
	n := h.node(victim)
	if n == nil {
		return victim, fmt.Errorf("no node %q", victim)
	}
	if err := n.p.kill(10 * time.Second); err != nil {
		return victim, err
	}
	if kind == "nats_leader_kill" {
		// Before the victim comes back: the kill must have moved the
		// partition's leadership to another node.
		if err := h.newLeader(k, victim, 60*time.Second); err != nil {
			return victim, err
		}
	}
	if err := h.startNode(n); err != nil {
		return victim, err
	}
	_, _, err = h.requestsLeader(k, 90*time.Second)
	return victim, err
}

// refused checks that nothing listens at a killed frontend's address any
// more: every connection to it was cut.
func refused(url string) error {
	addr := strings.TrimPrefix(url, "http://")
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("%s still accepts connections after the kill: the fault did not take effect", addr)
	}
	return nil
}

// newLeader waits until request partition k has a leader other than old.
func (h *harness) newLeader(k int, old string, timeout time.Duration) error {
	name := h.parts().Stream(k)
	var leader string
	err := waitUntil(timeout, name+" to elect a leader other than "+old, func() bool {
		info, err := h.streamInfo(name)
		if err != nil || info.Cluster == nil {
			return false
		}
		leader = info.Cluster.Leader
		return leader != "" && leader != old
	})
	if err != nil {
		return fmt.Errorf("leader kill of %s produced no new leader (leader %q): %w", old, leader, err)
	}
	return nil
}

func (h *harness) workerIndex(id string) int {
	for i, w := range h.workers {
		if w.id == id {
			return i
		}
	}
	return -1
}

// workerReady reports whether this frontend sees worker id ready, served by
// process pid (so a lease left by the previous process does not count).
func (f *feInc) workerReady(id string, pid int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.url+"/v1/workers", nil)
	resp, err := httpClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var out struct {
		Data []struct {
			ID    string `json:"id"`
			State string `json:"state"`
			PID   int    `json:"pid"`
		} `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&out) != nil {
		return false
	}
	for _, w := range out.Data {
		if w.ID == id && w.State == "ready" && w.PID == pid {
			return true
		}
	}
	return false
}

// scrape reads this incarnation's migration and resume counters.
func (f *feInc) scrape() (counters, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.url+"/metrics", nil)
	resp, err := httpClient.Do(req)
	if err != nil {
		return counters{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return counters{}, fmt.Errorf("metrics: %s", resp.Status)
	}
	const migrations, resumes = "dynamo_frontend_model_migration_total", "dynamo_frontend_model_resume_total"
	m, err := promtext.Sums(resp.Body, migrations, resumes)
	return counters{migrations: m[migrations], resumes: m[resumes]}, err
}

// scrapeLoop scrapes every current frontend once a second until ctx is done,
// keeping each incarnation's last successful scrape.
func (h *harness) scrapeLoop(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, f := range h.current() {
			f.scrapeOnce()
		}
	}
}

func (f *feInc) scrapeOnce() bool {
	c, err := f.scrape()
	if err != nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.killed && f.p.Exited() {
		return false // a stale answer cannot come from a dead process, but be strict
	}
	f.last, f.scraped = c, true
	return true
}
