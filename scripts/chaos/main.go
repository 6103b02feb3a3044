// Command chaos is baton's bounded soak. It starts real baton processes on
// loopback (a 3-node `baton nats` cluster with R3 streams, two frontends,
// three mock workers), keeps steady streaming load with clients that resume
// on any frontend, and injects faults at random moments: worker kill -9,
// SIGSTOP/SIGCONT, SIGTERM, frontend kill -9, NATS node kill -9 (the
// leader of a request partition included), each followed by a restart. At the end it
// checks every request against the fault-free text and the log, and every
// frontend's counters against the log and the clients; it prints a summary
// table and exits 1 on any violation.
//
//	go run ./scripts/chaos -duration 30s               # the CI profile
//	go run ./scripts/chaos -duration 10m -profile long
//	go run ./scripts/chaos -duration 30s -partitions 3  # a request log of 3 streams
//	go run ./scripts/chaos -profile churn -duration 2m  # an autoscaler's churn (churn.go)
//	scripts/upgrade-test                                # -profile upgrade: the previous release and back (upgrade.go)
//
// With -compose-check it is instead one resilient client of a running stack
// (scripts/compose-test): it streams one request, resuming across the given
// frontends, and exits 0 only if the text is the fault-free one.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/baton-dev/baton/streams"
)

// profile is the soak's shape.
type profile struct {
	clients        int
	gapMin, gapMax time.Duration // between faults
	minTokens      int
	spanTokens     int // max_tokens is minTokens + a deterministic value below spanTokens
	tokensPerSec   int
	migrationLimit int
	drainSecs      int    // DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS: short, so SIGTERM hands requests off too
	engine         string // "mock", or "openai": workers in front of vLLM simulators
	partitions     int    // --request-partitions of every component; NATS leader kills pick a partition's leader
	// noopFaults sends no fault signal at all, as a broken injector would:
	// a self-test of the checks that each fault took effect (the run must
	// fail, loudly).
	noopFaults bool
	workers    int // mock workers at the start
	// churn replaces the fault cycle with an autoscaler's churn (churn.go):
	// workers added and removed at least every 2 s, at a pool of 4-8, and
	// frontends replaced.
	churn bool
	// upgrade replaces the faults with an upgrade from -old-baton to the
	// current binary and a downgrade back (upgrade.go).
	upgrade bool
}

var profiles = map[string]profile{
	"short": {clients: 8, gapMin: 500 * time.Millisecond, gapMax: 2 * time.Second, minTokens: 40, spanTokens: 260,
		tokensPerSec: 150, migrationLimit: 5, drainSecs: 1},
	"long": {clients: 8, gapMin: 2 * time.Second, gapMax: 8 * time.Second, minTokens: 40, spanTokens: 560,
		tokensPerSec: 150, migrationLimit: 5, drainSecs: 1},
	// churn: a pool change every 0.3-1.5 s; many removals per request's
	// life, so more migrations may be needed than under one fault at a time.
	"churn": {clients: 8, gapMin: 300 * time.Millisecond, gapMax: 1500 * time.Millisecond, minTokens: 40, spanTokens: 260,
		tokensPerSec: 150, migrationLimit: 10, drainSecs: 1, workers: 6, churn: true},
	// upgrade: 1-3 s of traffic between two upgrade steps.
	"upgrade": {clients: 8, gapMin: time.Second, gapMax: 3 * time.Second, minTokens: 40, spanTokens: 260,
		tokensPerSec: 150, migrationLimit: 5, drainSecs: 1, upgrade: true},
}

func main() {
	var (
		duration = flag.Duration("duration", 30*time.Second, "how long to keep load and inject faults")
		profName = flag.String("profile", "short", "short (CI: faults every 0.5-2 s, requests of 40-300 tokens), long (faults every 2-8 s, 40-600 tokens) or churn (workers added and removed every 0.3-1.5 s at a pool of 4-8, frontends replaced)")
		seed     = flag.Uint64("seed", 0, "seed of the fault timing and victims; 0 picks one (printed)")
		clients  = flag.Int("clients", 0, "concurrent clients (default: the profile's, 8)")
		bin      = flag.String("baton", "", "a built baton binary (default: go build ./cmd/baton into the run directory)")
		keep     = flag.Bool("keep", false, "keep the run directory (process logs, JetStream stores) even on success")
		engName  = flag.String("engine", "mock", "workers' engine: mock, or openai (each worker in front of its own vLLM simulator, cmd/vllmsim)")
		parts    = flag.Int("partitions", 1, "request log partitions (--request-partitions, 1 to 64); a leader kill picks one partition's leader")
		oldBin   = flag.String("old-baton", "", "-profile upgrade: the previous release's baton binary (scripts/upgrade-test builds it)")
		noop     = flag.Bool("noop-faults", false, "self-test: send no kill or stop signal, as a broken injector would; the checks that each fault took effect must fail the run")

		composeCheck = flag.Bool("compose-check", false, "be one resilient client of a running stack (see -urls); exit 0 iff the text is the fault-free one")
		urls         = flag.String("urls", "http://127.0.0.1:8000,http://127.0.0.1:8001", "-compose-check: frontends, the first preferred")
		reqID        = flag.String("id", "", "-compose-check: X-Request-Id")
		prompt       = flag.String("prompt", "compose check", "-compose-check: prompt")
		maxTokens    = flag.Int("max-tokens", 300, "-compose-check: max_tokens")
		timeout      = flag.Duration("timeout", 3*time.Minute, "-compose-check: give up after this long")
	)
	flag.Parse()
	if *composeCheck {
		os.Exit(runComposeCheck(strings.Split(*urls, ","), *reqID, *prompt, *maxTokens, *timeout))
	}
	cfg, ok := profiles[*profName]
	if !ok {
		fmt.Fprintf(os.Stderr, "chaos: unknown profile %q (short, long or churn)\n", *profName)
		os.Exit(2)
	}
	if *clients > 0 {
		cfg.clients = *clients
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	if *engName != "mock" && *engName != "openai" {
		fmt.Fprintf(os.Stderr, "chaos: unknown engine %q (mock or openai)\n", *engName)
		os.Exit(2)
	}
	cfg.engine = *engName
	if err := streams.Partitions(*parts).Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "chaos: -partitions: %v\n", err)
		os.Exit(2)
	}
	cfg.partitions = *parts
	cfg.noopFaults = *noop
	if cfg.upgrade != (*oldBin != "") {
		fmt.Fprintln(os.Stderr, "chaos: -profile upgrade and -old-baton go together")
		os.Exit(2)
	}
	upgradeFrom = *oldBin
	os.Exit(soak(cfg, *duration, *seed, *bin, *keep, strings.Join(os.Args, " ")))
}

// upgradeFrom is -old-baton.
var upgradeFrom string

func soak(cfg profile, duration time.Duration, seed uint64, bin string, keep bool, cmdline string) (code int) {
	began := time.Now()
	dir, err := os.MkdirTemp("", "baton-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 1
	}
	defer func() {
		if keep || code != 0 {
			fmt.Printf("process logs and stores kept in %s\n", dir)
			return
		}
		os.RemoveAll(dir)
	}()
	if bin == "" {
		if bin, err = build(dir, "baton"); err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			return 1
		}
	}
	h := &harness{bin: bin, dir: dir, cfg: cfg, fronts: make([]*feInc, 2), gen: make([]int, 2)}
	if cfg.upgrade {
		h.oldBin, h.newBin, h.bin = upgradeFrom, bin, upgradeFrom // the stack starts on the previous release
	}
	if cfg.engine == "openai" {
		if h.simBin, err = build(dir, "vllmsim"); err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			return 1
		}
	}
	defer h.stopAll()
	h.stopOnInterrupt()

	fmt.Printf("seed %d, profile %+v, run directory %s\n", seed, cfg, dir)
	if err := h.up(); err != nil {
		fmt.Fprintln(os.Stderr, "chaos: start the stack:", err)
		return 1
	}
	fmt.Printf("stack up in %v: nats %s\n", time.Since(began).Round(100*time.Millisecond), h.natsURLs())

	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	ctx := context.Background()
	scrapeCtx, stopScrape := context.WithCancel(ctx)
	go h.scrapeLoop(scrapeCtx)

	loadCtx, stopLoad := context.WithCancel(ctx)
	outs, wait := h.load(loadCtx)
	loadStart := time.Now()
	faultCtx, stopFaults := context.WithTimeout(ctx, duration)
	var faults []fault
	var churned *churnStats
	switch {
	case cfg.churn:
		faults, churned = h.churn(faultCtx, rng, loadStart)
	case cfg.upgrade:
		faults = h.upgrade(rng, loadStart) // the whole upgrade and downgrade, however long -duration is
	default:
		faults = h.injectFaults(faultCtx, rng, loadStart)
	}
	stopFaults()
	stopLoad() // clients finish the request in hand, then stop
	fmt.Printf("load stopped after %v; waiting for in-flight requests\n", time.Since(loadStart).Round(100*time.Millisecond))
	if !wait(3 * time.Minute) {
		fmt.Println("chaos: clients did not finish within 3m")
	}
	stopScrape()
	h.finalScrape()
	r := h.check(ctx, outs(), faults)
	r.churn = churned
	h.checkChurn(r)
	h.checkUpgrade(ctx, r, outs())
	r.print(os.Stdout, cmdline, time.Since(began))
	if len(r.violations) > 0 {
		return 1
	}
	return 0
}

// build builds ./cmd/<name> into dir/<name> and returns its path; the
// compiler's output goes to stderr.
func build(dir, name string) (string, error) {
	bin := filepath.Join(dir, name)
	fmt.Printf("building %s ...\n", name)
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/"+name)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build %s: %w", name, err)
	}
	return bin, nil
}

// stopOnInterrupt makes Ctrl-C (or SIGTERM) stop every process the harness
// started, then exit.
func (h *harness) stopOnInterrupt() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigs
		h.stopAll()
		fmt.Fprintf(os.Stderr, "chaos: interrupted; logs in %s\n", h.dir)
		os.Exit(130)
	}()
}

// finalScrape scrapes each live frontend's metrics once more, with up to 10
// tries, and records whether that worked. Every counted migration and resume
// precedes the end of its request, so once the clients are done the
// counters are final.
func (h *harness) finalScrape() {
	for _, f := range h.current() {
		ok := false
		for range 10 {
			if ok = f.scrapeOnce(); ok {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		f.mu.Lock()
		f.finalScrap = ok
		f.mu.Unlock()
	}
}

// up starts the cluster, the frontends and the workers, and waits until every
// frontend sees every worker ready.
func (h *harness) up() error {
	if err := h.startCluster(); err != nil {
		return err
	}
	for i := range 2 {
		if _, err := h.startFrontend(i); err != nil {
			return err
		}
	}
	for i := range max(h.cfg.workers, 3) {
		h.workers = append(h.workers, &workerSlot{id: fmt.Sprintf("w%d", i+1)})
		if err := h.startWorker(i); err != nil {
			return err
		}
	}
	for _, w := range h.workers {
		if err := h.waitReady(w.id, 60*time.Second); err != nil {
			return err
		}
	}
	var leaders []string
	for k := range h.parts().Count() {
		leader, _, err := h.requestsLeader(k, 60*time.Second)
		if err != nil {
			return err
		}
		leaders = append(leaders, h.parts().Stream(k)+"@"+leader)
	}
	fmt.Printf("request log leaders: %s\n", strings.Join(leaders, " "))
	return nil
}

// load starts the clients. Each runs requests back to back until ctx is done;
// request i of client c has a deterministic id, prompt and max_tokens. It
// returns the outcomes (once wait returned true) and a bounded wait.
func (h *harness) load(ctx context.Context) (func() []*outcome, func(time.Duration) bool) {
	var mu sync.Mutex
	var all []*outcome
	var wg sync.WaitGroup
	for c := range h.cfg.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := c
			pick := func(int) (target, error) {
				fs := h.current()
				for range len(fs) {
					next++
					f := fs[next%len(fs)]
					f.mu.Lock()
					draining := f.draining
					f.mu.Unlock()
					if !draining {
						return target{url: f.url, inc: f}, nil
					}
				}
				return target{}, errNoFrontend
			}
			for i := 0; ctx.Err() == nil; i++ {
				o := &outcome{
					id:        fmt.Sprintf("chaos-c%d-%d", c, i),
					prompt:    fmt.Sprintf("chaos soak client %d request %d", c, i),
					maxTokens: h.cfg.minTokens + (c*37+i*53)%h.cfg.spanTokens,
				}
				// Responses need every frontend to serve them: not while a
				// release that predates them is up (-profile upgrade).
				if h.cfg.engine == "mock" && !h.cfg.upgrade && i%responseShare == responseShare-1 {
					o.input, o.seq = o.prompt, -1
					o.prompt = "user: " + o.input // what the engine is asked
				}
				mu.Lock()
				all = append(all, o)
				mu.Unlock()
				// The request runs to its end even after ctx is done: the
				// soak stops starting requests, not finishing them.
				runRequest(context.Background(), pick, o, 2*time.Minute)
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	wait := func(d time.Duration) bool {
		select {
		case <-done:
			return true
		case <-time.After(d):
			return false
		}
	}
	outs := func() []*outcome {
		mu.Lock()
		defer mu.Unlock()
		return append([]*outcome(nil), all...)
	}
	return outs, wait
}

// runComposeCheck streams one request through a running stack, preferring
// urls[0] and resuming on the others when a stream is cut.
func runComposeCheck(urls []string, id, prompt string, maxTokens int, timeout time.Duration) int {
	if id == "" {
		id = fmt.Sprintf("compose-%d", time.Now().UnixNano())
	}
	o := &outcome{id: id, prompt: prompt, maxTokens: maxTokens}
	cur := 0
	pick := func(try int) (target, error) {
		if try > 0 {
			cur++ // the last try failed or was cut: move on
		}
		return target{url: urls[cur%len(urls)]}, nil
	}
	start := time.Now()
	runRequest(context.Background(), pick, o, timeout)
	want := engineText(prompt, maxTokens)
	got := o.text.String()
	fmt.Printf("%s: %d tokens in %v, resumes %d, cuts %d, longest pause %v, done %v\n",
		id, o.tokens, time.Since(start).Round(time.Millisecond), o.resumes, o.cuts, o.maxGap.Round(time.Millisecond), o.done)
	var bad []string
	bad = append(bad, o.problems...)
	if o.gaveUp != "" {
		bad = append(bad, "gave up: "+o.gaveUp)
	}
	if !o.done {
		bad = append(bad, fmt.Sprintf("did not complete: status %d %s", o.status, o.errEvent))
	}
	if got != want {
		bad = append(bad, fmt.Sprintf("text differs from a fault-free run:\n  got  %q\n  want %q", clip(got), clip(want)))
	}
	for _, b := range bad {
		fmt.Println("  VIOLATION:", b)
	}
	if len(bad) > 0 {
		return 1
	}
	fmt.Printf("%s: text identical to a fault-free run\n", id)
	return 0
}
