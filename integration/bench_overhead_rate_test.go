package integration

import (
	"cmp"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The open-loop search of BenchmarkOverhead/rate=max. A rate R means R
// requests a second direct and R through baton, alternated in one arrival
// stream of 2R a second, each request started when it is due whatever the
// others are doing, its time to first token counted from that moment.
const (
	rateCalibration = 40                     // sequential pairs that give baton's p50 time to first token at concurrency 1
	rateBoundFactor = 10                     // a sustained rate keeps the p99 time to first token baton adds under this many times that p50
	rateStart       = 20.0                   // the first rate tried, per second of each kind
	rateCeiling     = 2560.0                 // the search stops doubling here
	rateBisections  = 3                      // bisections after the first unsustained rate
	rateStep        = 2 * time.Second        // each rate tried runs this long
	rateMeasure     = 8 * time.Second        // the measurement at the rate found
	rateAttempts    = 4                      // measurements, each at rateBackoff times the rate of the last, until one keeps within the criterion
	rateBackoff     = 0.75                   // see rateAttempts
	rateTimeout     = 10 * time.Second       // a request that takes longer has failed
	rateBacklog     = 500 * time.Millisecond // a step with more than this much arrivals in flight stops: not sustained
)

// rateRun is what an open-loop run at one rate saw.
type rateRun struct {
	rate                     float64
	dTTFT, bTTFT, dITL, bITL []time.Duration
	failed                   int             // requests of either kind with an error or no token
	firstErr                 error           // the first of them
	late                     time.Duration   // the longest a request started after it was due
	stopped                  bool            // the backlog passed rateBacklog and the run stopped early
	bDue                     []time.Duration // when each of bTTFT was due, from the start of the run
	bTiming                  []string        // each of bTTFT's Server-Timing (serverTimings)
}

// sustained reports whether run r kept within the criterion: every request
// answered, no backlog, and the time baton adds to the first token at p99
// (its p99 minus direct's, as reported) at most bound.
func (r rateRun) sustained(bound time.Duration) bool {
	return r.failed == 0 && !r.stopped && len(r.bTTFT) > 0 && r.addedP99() <= bound
}

// addedP99 is baton's p99 time to first token minus direct's.
func (r rateRun) addedP99() time.Duration {
	return quantiles(r.bTTFT)[1] - quantiles(r.dTTFT)[1]
}

// brief is r in a few words: the rate, the two p99 times to first token,
// the requests failed, and whether it kept within bound.
func (r rateRun) brief(bound time.Duration) string {
	verdict := "sustained"
	if !r.sustained(bound) {
		verdict = "not sustained"
	}
	if r.stopped {
		verdict += ", stopped on its backlog"
	}
	return fmt.Sprintf("%.0f/s: %v, %v, %d, %s", r.rate, quantiles(r.bTTFT)[1].Round(10*time.Microsecond),
		quantiles(r.dTTFT)[1].Round(10*time.Microsecond), r.failed, verdict)
}

// slowest says when baton's n slowest first tokens were due, in the order
// they were due, how long each took and where the frontend says the time
// went (its Server-Timing): a stall shows as a cluster.
func (r rateRun) slowest(n int) string {
	idx := make([]int, len(r.bTTFT))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(r.bTTFT[b], r.bTTFT[a]) })
	idx = idx[:min(n, len(idx))]
	slices.Sort(idx)
	var parts []string
	for _, i := range idx {
		parts = append(parts, fmt.Sprintf("%v at %v (%s)", r.bTTFT[i].Round(time.Millisecond), r.bDue[i].Round(10*time.Millisecond), r.bTiming[i]))
	}
	return strings.Join(parts, ", ")
}

func (r rateRun) String() string {
	return fmt.Sprintf("rate %.0f/s: %d+%d requests, %d failed (%v), baton TTFT p50 %v p99 %v, direct TTFT p50 %v p99 %v, started up to %v late, stopped early %v; baton's slowest first tokens: %s",
		r.rate, len(r.dTTFT), len(r.bTTFT), r.failed, r.firstErr, quantiles(r.bTTFT)[0].Round(10*time.Microsecond),
		quantiles(r.bTTFT)[1].Round(10*time.Microsecond), quantiles(r.dTTFT)[0].Round(10*time.Microsecond),
		quantiles(r.dTTFT)[1].Round(10*time.Microsecond), r.late.Round(time.Microsecond), r.stopped, r.slowest(8))
}

// runAtRate streams chats of tokens for d at rate per second of each kind,
// alternating direct (simURL) and through baton (feURL), and waits for the
// last to finish.
// Requests due before the backlog stopped the run still count.
func runAtRate(client *http.Client, simURL, feURL string, tokens int, rate float64, d time.Duration, tag string) rateRun {
	r := rateRun{rate: rate}
	interval := time.Duration(float64(time.Second) / (2 * rate))
	n := int(d / interval)
	maxInFlight := int64(2 * rate * rateBacklog.Seconds())
	var inFlight atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now().Add(time.Millisecond)
	for i := range n {
		due := start.Add(time.Duration(i) * interval)
		if w := time.Until(due); w > 0 {
			time.Sleep(w)
		} else {
			r.late = max(r.late, -w)
		}
		if inFlight.Load() > maxInFlight {
			r.stopped = true
			break
		}
		url := simURL
		if i%2 == 1 {
			url = feURL
		}
		inFlight.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer inFlight.Add(-1)
			s := streamTimedFrom(client, url, fmt.Sprintf("rate %s %d", tag, i/2), tokens, due)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case s.err != nil:
				r.failed++
				if r.firstErr == nil {
					r.firstErr = s.err
				}
			case url == simURL:
				r.dTTFT, r.dITL = append(r.dTTFT, s.ttft), append(r.dITL, s.itl...)
			default:
				r.bTTFT, r.bITL = append(r.bTTFT, s.ttft), append(r.bITL, s.itl...)
				r.bDue, r.bTiming = append(r.bDue, due.Sub(start)), append(r.bTiming, s.timing)
			}
		}()
	}
	wg.Wait()
	return r
}

// benchOverheadMaxRate is BenchmarkOverhead at the highest open-loop rate
// baton sustains on this machine. It first measures baton's p50 time to
// first token at concurrency 1 (rateCalibration pairs, direct and through
// baton in turn). A rate is sustained when, in a run of rateStep, every
// request of either kind succeeds, the requests in flight never exceed
// rateBacklog's worth of arrivals, and the time baton adds to the first
// token at p99 (baton's p99 minus direct's in the same run, each counted
// from when its request was due) stays under rateBoundFactor times that
// p50. The bound is on the added time, not on baton's p99 alone, because
// on a shared machine the p99 of either path is set by the other processes
// more than by the rate, and direct's shows by how much. A rate breaks the
// criterion only when two runs of it in a row do: one burst of another
// process's work can break a short step at any rate, where a rate baton
// cannot keep up with breaks it every time.
//
// The search doubles from rateStart until a rate is not sustained (or up
// to rateCeiling), then bisects rateBisections times between the last
// rate sustained and the first not. It then measures direct and through
// baton, alternated in one arrival stream, for rateMeasure at the rate
// found; a short step can pass at a rate a longer run does not sustain,
// so when the measurement breaks the criterion it is made again at
// rateBackoff times the rate, up to rateAttempts in all. It reports the
// figures of the other sub-benchmarks for the last measurement, the rate
// found and the rate measured, the bound, the requests that failed and
// whether that measurement kept within the criterion. About 45 s on 2 busy
// cores, up to 90 s when every measurement breaks the criterion. traces
// names the pprof addresses of the servers whose execution traces each
// measurement saves (saveRateProfiles), by server. The CPU time the
// servers of pids (by name) spend over the last measurement is reported
// per request: the simulator's per request it serves (direct and the
// worker's, both), baton's three per request through baton, and their
// ratio.
func benchOverheadMaxRate(b *testing.B, client *http.Client, simURL, feURL string, tokens int, traces map[string]string, pids map[string]int) {
	client = &http.Client{Transport: client.Transport, Timeout: rateTimeout}
	for b.Loop() {
		var c1 []time.Duration
		for i := range rateCalibration {
			prompt := fmt.Sprintf("rate calibration %d", i)
			d := streamTimed(client, simURL, prompt, tokens)
			t := streamTimed(client, feURL, prompt, tokens)
			if d.err != nil || t.err != nil {
				b.Fatalf("calibration: direct: %v, through baton: %v", d.err, t.err)
			}
			c1 = append(c1, t.ttft)
		}
		p50 := quantiles(c1)[0]
		bound := rateBoundFactor * p50
		b.Logf("baton's TTFT at concurrency 1: p50 %v over %d requests; a sustained rate keeps the p99 it adds under %v", p50.Round(10*time.Microsecond), len(c1), bound.Round(10*time.Microsecond))

		lo, attempts := 0.0, rateAttempts
		if s := os.Getenv("BATON_BENCH_RATE"); s != "" {
			// No search: one measurement at this rate (per second of each
			// kind), to look at what happens there.
			v, err := strconv.ParseFloat(s, 64)
			if err != nil || v <= 0 {
				b.Fatalf("BATON_BENCH_RATE=%q: not a positive rate", s)
			}
			lo, attempts = v, 1
		} else {
			lo = searchRate(b, client, simURL, feURL, tokens, bound)
		}

		var r rateRun
		var cpu map[string]time.Duration
		rate := lo
		for i := range attempts {
			if i > 0 {
				rate *= rateBackoff
			}
			saved := saveRateProfiles(b, traces, rateMeasure, fmt.Sprintf("rate-measure%d", i+1))
			before := cpuOf(b, pids)
			r = runAtRate(client, simURL, feURL, tokens, rate, rateMeasure, fmt.Sprintf("measure %d", i))
			cpu = cpuOf(b, pids)
			for name := range cpu {
				cpu[name] -= before[name]
			}
			saved()
			b.Logf("measurement %d, %v: within the criterion %v", i+1, r, r.sustained(bound))
			if r.sustained(bound) {
				break
			}
		}
		reportOverhead(b, "ttft", r.dTTFT, r.bTTFT)
		reportOverhead(b, "itl", r.dITL, r.bITL)
		if n := len(r.bTTFT); n > 0 {
			perReq := func(d time.Duration, n int) float64 { return float64(d.Microseconds()) / 1000 / float64(n) }
			var baton time.Duration
			for _, name := range []string{"nats", "frontend", "worker"} {
				b.ReportMetric(perReq(cpu[name], n), "cpu_ms/req_"+name)
				baton += cpu[name]
			}
			sim := perReq(cpu["sim"], n+len(r.dTTFT))
			b.ReportMetric(perReq(baton, n), "cpu_ms/req_baton")
			b.ReportMetric(sim, "cpu_ms/req_sim")
			if sim > 0 {
				b.ReportMetric(perReq(baton, n)/sim, "cpu_baton/sim")
			}
		}
		b.ReportMetric(lo, "rate_found_req/s")
		b.ReportMetric(rate, "rate_req/s")
		b.ReportMetric(float64(bound.Microseconds())/1000, "ttft_bound_ms")
		b.ReportMetric(float64(len(r.bTTFT)), "requests_each")
		b.ReportMetric(float64(r.failed), "requests_failed")
		sustained := 0.0
		if r.sustained(bound) {
			sustained = 1
		}
		b.ReportMetric(sustained, "sustained")
	}
}

// searchRate is rate=max's search: the highest rate found sustained (see
// benchOverheadMaxRate).
func searchRate(b *testing.B, client *http.Client, simURL, feURL string, tokens int, bound time.Duration) float64 {
	// The steps go in one line: a benchmark's log is cut after 10.
	var steps []string
	try := func(rate float64) bool {
		for range 2 {
			r := runAtRate(client, simURL, feURL, tokens, rate, rateStep, fmt.Sprintf("step %d", len(steps)))
			steps = append(steps, r.brief(bound))
			if r.sustained(bound) {
				return true
			}
		}
		return false
	}
	lo, hi := 0.0, 0.0
	for rate := rateStart; rate <= rateCeiling; rate *= 2 {
		if !try(rate) {
			hi = rate
			break
		}
		lo = rate
	}
	if hi > 0 {
		for range rateBisections {
			mid := (lo + hi) / 2
			if try(mid) {
				lo = mid
			} else {
				hi = mid
			}
		}
	}
	b.Logf("steps (rate of each kind: baton's TTFT p99, direct's, requests failed): %s", strings.Join(steps, "; "))
	if lo == 0 {
		b.Fatalf("no rate sustained: even %.1f/s of each kind made baton add more than %v to the p99 TTFT or failed", hi, bound)
	}
	return lo
}

// saveRateProfiles starts an execution trace (BATON_BENCH_TRACE=dir) or a
// CPU profile (BATON_BENCH_PROFILE=dir) of d of each server in servers (by
// name, its pprof address), saved as dir/<tag>-<name>.trace or .pprof, and
// of this process, the client (<tag>-client), and returns a wait for them.
// Each starts when its server receives the request, within a millisecond
// of the others; go tool trace and golang.org/x/exp/trace align traces by
// the wall clock each records.
func saveRateProfiles(b *testing.B, servers map[string]string, d time.Duration, tag string) func() {
	var wg sync.WaitGroup
	if len(servers) == 0 {
		return wg.Wait
	}
	dir, ext, path, start, stop := os.Getenv("BATON_BENCH_TRACE"), ".trace", "trace", trace.Start, trace.Stop
	if dir == "" {
		dir, ext, path, start, stop = os.Getenv("BATON_BENCH_PROFILE"), ".pprof", "profile", pprof.StartCPUProfile, pprof.StopCPUProfile
	}
	f, err := os.Create(filepath.Join(dir, tag+"-client"+ext))
	if err != nil {
		b.Fatal(err)
	}
	if err := start(f); err != nil {
		b.Fatal(err)
	}
	wg.Go(func() {
		<-time.After(d) // the length the servers are asked for
		stop()
		f.Close()
	})
	for name, addr := range servers {
		wg.Go(func() {
			url := fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%g", addr, path, d.Seconds())
			if err := saveProfile(url, filepath.Join(dir, tag+"-"+name+ext)); err != nil {
				b.Errorf("%s of %s: %v", path, name, err)
			}
		})
	}
	return wg.Wait
}

// cpuOf is the CPU time (user and system) each process of pids has spent.
func cpuOf(b *testing.B, pids map[string]int) map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, pid := range pids {
		out[name], _ = procCPU(b, pid)
	}
	return out
}
