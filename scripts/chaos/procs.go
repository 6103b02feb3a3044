package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/baton-dev/baton/internal/faultcheck"
	"github.com/baton-dev/baton/internal/freeport"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// proc is one running baton process. Its output goes to a log file under the
// run directory (appended, so restarts of a component share one file).
type proc struct {
	*faultcheck.Process
	noop bool // -noop-faults: kill and pause send nothing, and still check
}

// term sends SIGTERM and waits up to timeout for the process to exit 0: one
// still running then is killed, and who names it in the error.
func (p *proc) term(who string, timeout time.Duration) error {
	p.Signal(syscall.SIGTERM)
	if !p.WaitFor(timeout) {
		p.Stop()
		return fmt.Errorf("%s did not exit within %v of SIGTERM; killed", who, timeout)
	}
	if err := p.Err(); err != nil {
		return fmt.Errorf("%s: exit after SIGTERM: %v, want 0", who, err)
	}
	return nil
}

// The faults below are checked to have taken effect (Dynamo's TCP-reset
// injection was a no-op for two whole test runs): a fault that did nothing
// is an error, which the soak reports as a violation. They honour
// -noop-faults, which the embedded Kill and Pause do not.

// kill sends SIGKILL and checks that the process died of it and is gone
// from /proc.
func (p *proc) kill(timeout time.Duration) error {
	if p.Exited() {
		return fmt.Errorf("%s had already exited (%v) before the kill: the fault did nothing", p.Name, p.Err())
	}
	check := p.Kill
	if p.noop {
		check = p.Killed
	}
	if err := check(timeout); err != nil {
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	return nil
}

// pause sends SIGSTOP and checks that the process is in state T.
func (p *proc) pause() error {
	if p.Exited() {
		return fmt.Errorf("%s had already exited (%v) before SIGSTOP: the fault did nothing", p.Name, p.Err())
	}
	if p.noop {
		_, err := faultcheck.Stopped(p.Pid(), 5*time.Second)
		return err
	}
	return p.Pause()
}

// feInc is one incarnation of a frontend slot: a process with its own id and
// port, so that the log's `migrated` events (which name the frontend id) and
// the client's resumes can be attributed to exactly one metrics endpoint.
type feInc struct {
	slot int
	id   string
	url  string
	p    *proc

	mu         sync.Mutex
	killed     bool     // ended by SIGKILL (or, churning, SIGTERM): counts since its last scrape are lost
	draining   bool     // taken out of the clients' rotation before its SIGTERM
	termed     bool     // ended by SIGTERM (churn), not kill -9
	scraped    bool     // at least one successful scrape
	last       counters // the last successful scrape
	resumes    int      // GET .../stream answered by this incarnation (client count)
	resumeTry  int      // GET .../stream sent to it, answered or not
	ambiguous  int      // re-POSTs after an unanswered POST: may have attached (a resume)
	finalScrap bool     // the end-of-run scrape succeeded
}

// counters are the metric sums this soak compares with the log.
type counters struct {
	migrations float64 // dynamo_frontend_model_migration_total
	resumes    float64 // dynamo_frontend_model_resume_total
}

// workerSlot is one worker id; restarts keep the id (and the simulator in
// front of which an openai worker runs, which the faults leave alone).
type workerSlot struct {
	id     string
	p      *proc
	simURL string
	// With -profile churn, under harness.mu: an action is under way on the
	// slot, or it was removed for good.
	busy, gone bool
}

// harness owns every process of the soak and its run directory.
type harness struct {
	bin string // the binary new processes start with
	// With -profile upgrade: the previous release's binary and the current
	// one; bin is one or the other as the upgrade goes.
	oldBin, newBin string
	simBin         string // the vLLM simulator, with -engine openai
	sysPassword    string // of every node's system account
	dir            string
	cfg            profile
	nodes          []*natsNode
	workers        []*workerSlot

	mu     sync.Mutex
	fronts []*feInc // current incarnation per slot
	allFE  []*feInc // every incarnation ever started
	gen    []int    // incarnations per slot
	procs  []*proc  // every process ever started, to stop at the end

	js jetstream.JetStream
	nc *nats.Conn
}

// startSim starts the vLLM simulator of worker w: greedy, so that every
// answer is the fault-free one, at the profile's decode rate.
func (h *harness) startSim(w *workerSlot) error {
	port, err := freeport.Get()
	if err != nil {
		return err
	}
	delay := time.Second / time.Duration(h.cfg.tokensPerSec)
	if _, err := h.startBin(h.simBin, "sim-"+w.id, nil, "--port", strconv.Itoa(port), "--model", "mock", "--greedy",
		"--ttft", "10ms", "--token-delay", delay.String()); err != nil {
		return err
	}
	w.simURL = "http://127.0.0.1:" + strconv.Itoa(port)
	return waitUntil(20*time.Second, "simulator of "+w.id, func() bool {
		resp, err := http.Get(w.simURL + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
}

func (h *harness) start(name string, env []string, args ...string) (*proc, error) {
	return h.startBin(h.bin, name, env, args...)
}

func (h *harness) startBin(bin, name string, env []string, args ...string) (*proc, error) {
	f, err := os.OpenFile(filepath.Join(h.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fmt.Fprintf(f, "==== %s %s %s\n", time.Now().Format(time.RFC3339Nano), filepath.Base(bin), strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // nothing outlives the soak
	fp, err := faultcheck.Start(name, cmd)
	if err != nil {
		return nil, err
	}
	p := &proc{Process: fp, noop: h.cfg.noopFaults}
	h.mu.Lock()
	h.procs = append(h.procs, p)
	h.mu.Unlock()
	return p, nil
}

// stopAll kills every process still running.
func (h *harness) stopAll() {
	if h.nc != nil {
		h.nc.Close()
	}
	h.mu.Lock()
	ps := append([]*proc(nil), h.procs...)
	h.mu.Unlock()
	for _, p := range ps {
		p.Stop()
	}
}

// waitUntil polls cond every 50 ms until it holds or timeout passes.
func waitUntil(timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// startFrontend starts a new incarnation of frontend slot, on a fresh port
// with a fresh id, and waits until it serves.
func (h *harness) startFrontend(slot int) (*feInc, error) {
	port, err := freeport.Get()
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	gen := h.gen[slot]
	h.gen[slot]++
	h.mu.Unlock()
	inc := &feInc{slot: slot, id: fmt.Sprintf("fe%d-r%d", slot+1, gen), url: "http://127.0.0.1:" + strconv.Itoa(port)}
	// Every client is on loopback, one address: the per-address cap is off
	// (by its variable, which a previous release ignores).
	p, err := h.start(fmt.Sprintf("frontend-%d", slot+1), []string{"BATON_MAX_CONNECTIONS_PER_ADDRESS=0"}, "frontend", "--nats", h.natsURLs(),
		"--nats-system-url", h.sysURLs(), "--replicas", "3", "--request-partitions", strconv.Itoa(h.parts().Count()), "--http-port", strconv.Itoa(port),
		"--frontend-id", inc.id, "--migration-limit", strconv.Itoa(h.cfg.migrationLimit),
		"--detach-timeout", "5m")
	if err != nil {
		return nil, err
	}
	inc.p = p
	err = waitUntil(30*time.Second, inc.id+" to serve", func() bool {
		if p.Exited() {
			return true
		}
		resp, err := http.Get(inc.url + "/live")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	if err == nil && p.Exited() {
		err = fmt.Errorf("%s exited at start: %v (see %s)", inc.id, p.Err(), filepath.Join(h.dir, p.Name+".log"))
	}
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.fronts[slot] = inc
	h.allFE = append(h.allFE, inc)
	h.mu.Unlock()
	return inc, nil
}

// startWorker (re)starts the worker in slot i with its id.
func (h *harness) startWorker(i int) error { return h.startSlot(h.workers[i]) }

// startSlot (re)starts worker w with its id.
func (h *harness) startSlot(w *workerSlot) error {
	args := []string{"worker", "--nats", h.natsURLs(), "--replicas", "3", "--request-partitions", strconv.Itoa(h.parts().Count()), "--worker-id", w.id}
	if h.cfg.engine == "openai" {
		if w.simURL == "" {
			if err := h.startSim(w); err != nil {
				return err
			}
		}
		args = append(args, "--engine", "openai", "--openai-url", w.simURL, "--model", "mock", "--first-token-timeout", "10s")
	} else {
		args = append(args, "--mock-tokens-per-sec", strconv.Itoa(h.cfg.tokensPerSec), "--mock-ttft", "10ms")
	}
	if h.cfg.churn {
		args = append(args, "--lease-ttl", churnLeaseTTL.String()) // lease-expiry removals take a few seconds
	}
	p, err := h.start("worker-"+w.id, []string{"DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS=" + strconv.Itoa(h.cfg.drainSecs)}, args...)
	if err != nil {
		return err
	}
	h.mu.Lock()
	w.p = p
	h.mu.Unlock()
	return nil
}

// waitReady waits until every current frontend sees worker id ready, served
// by its current process.
func (h *harness) waitReady(id string, timeout time.Duration) error {
	pid := 0
	h.mu.Lock()
	for _, w := range h.workers {
		if w.id == id && w.p != nil {
			pid = w.p.Pid()
		}
	}
	h.mu.Unlock()
	return waitUntil(timeout, "worker "+id+" ready", func() bool {
		for _, f := range h.current() {
			f.mu.Lock()
			leaving := f.draining
			f.mu.Unlock()
			if leaving || f.p.Exited() {
				continue // being replaced (churn): its successor is waited for
			}
			if !f.workerReady(id, pid) {
				return false
			}
		}
		return true
	})
}

// current returns the current incarnation of every frontend slot.
func (h *harness) current() []*feInc {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*feInc(nil), h.fronts...)
}

var errNoFrontend = errors.New("no frontend")

// secret is a random password.
func secret() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
