package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/promtext"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkScale: what one stream costs when thousands are open.

// scaleCase is one workload of BenchmarkScale.
type scaleCase struct {
	name    string
	streams int           // concurrent streams
	rate    int           // mock decode rate, tokens/s per stream
	tokens  int           // max_tokens of every stream
	ramp    time.Duration // the streams start evenly over this long
	logOff  bool          // the baseline: deltas over core NATS, not the log (--bench-log-off)
	batched bool          // --batched-output on the frontend and the workers (issue 33)
	keepLog bool          // --log-compaction=false: what compaction costs, by difference
}

// BenchmarkScale measures what one stream costs when thousands are open at
// decode rates, each token in its own delta (as real engines produce them):
// separate processes (`baton nats`, one frontend, two mock workers), a Go
// client opening the streams over a ramp. For each process it reports CPU µs
// per delivered token (from /proc/<pid>/stat), RSS, Go heap in use and
// goroutines per open stream (the processes' /metrics) and the live heap per
// open stream (what their collections marked, from GODEBUG=gctrace=1), then
// delivered against offered
// tokens/s while every stream is open, the emit-to-client latency of every
// token (the workers' mock engines write each token's emit time as its
// text, --bench-emit-time, which the client reads back), the machine's CPU headroom, and how
// the frontend spread the streams: the streams each worker carried, and the
// migrations, inhibitions and unanswered dispatches of the run.
//
// The -logoff workloads are the baseline: the same processes with the log off
// for token deltas (workers run with --bench-log-off and publish them over
// core NATS to the subjects frontends follow). Each workload also reports the
// raw JetStream async publish rate of its server, measured before it.
//
// The processes' CPU is sampled once the request log has settled after
// the last stream (its compactions done: settled_s), so that a token's CPU
// includes its compaction.
//
// BATON_BENCH_PROFILE=dir saves a CPU profile of the frontend, of one
// worker and of the NATS server (5 s, from when 90% of the streams are
// open) to dir, then a heap
// profile of each, and one of each before the streams start (-heap-idle:
// the base of pprof's -diff_base).
func BenchmarkScale(b *testing.B) {
	// Each -logoff baseline runs just before its durable workload (a filter
	// such as Scale/4000x50 selects both), which reports the ratio of their
	// peak delivered rates.
	for _, sc := range []scaleCase{
		// Below saturation: latency and memory per stream without queues.
		{name: "1000x5", streams: 1000, rate: 5, tokens: 64, ramp: 2 * time.Second},
		{name: "1000x50-logoff", streams: 1000, rate: 50, tokens: 256, ramp: 2 * time.Second, logOff: true},
		{name: "1000x50", streams: 1000, rate: 50, tokens: 256, ramp: 2 * time.Second},
		{name: "1000x50-nocompaction", streams: 1000, rate: 50, tokens: 256, ramp: 2 * time.Second, keepLog: true},
		{name: "1000x50-batched", streams: 1000, rate: 50, tokens: 256, ramp: 2 * time.Second, batched: true},
		{name: "4000x50-logoff", streams: 4000, rate: 50, tokens: 256, ramp: 4 * time.Second, logOff: true},
		{name: "4000x50", streams: 4000, rate: 50, tokens: 256, ramp: 4 * time.Second},
		{name: "10000x1", streams: 10000, rate: 1, tokens: 30, ramp: 20 * time.Second},
	} {
		b.Run(sc.name, func(b *testing.B) { runScale(b, sc) })
	}
}

// logOffRate is the delivered rate (over the whole run, and at the peak
// second) of each -logoff baseline run so far, by workload shape ("4000x50").
var logOffRate = map[string][2]float64{}

func (sc scaleCase) shape() string { return fmt.Sprintf("%dx%d", sc.streams, sc.rate) }

// scaleProc is one measured process.
type scaleProc struct {
	name    string
	pid     int
	metrics string // its /metrics URL; "" if it has none (NATS)
	gctrace *proc  // its output, with GODEBUG=gctrace=1 (see gcLiveAt); nil: none
	pprof   string // its --pprof-addr; "" if none
}

// procSample is what one process looked like at one moment.
type procSample struct {
	cpu        time.Duration // user + system since it started
	rss        float64       // bytes
	heap       float64       // go_memstats_heap_inuse_bytes
	logAt      int           // the length of its output (with its gctrace) at the sample
	goroutines float64
	// Routing, from the Dynamo-named series (and baton's own beside them):
	// a worker's requests finished (dynamo_component_requests_total, every
	// status) and in flight; the frontend's migrations
	// (dynamo_frontend_model_migration_total), inhibitions and unanswered
	// dispatches.
	requests, inflight                  float64
	migrations, inhibitions, unanswered float64
}

func runScale(b *testing.B, sc scaleCase) {
	pprofAddr := map[string]string{}
	profDir := os.Getenv("BATON_BENCH_PROFILE")
	var natsArgs []string
	if profDir != "" {
		pprofAddr["nats"] = fmt.Sprintf("127.0.0.1:%d", freePort(b))
		natsArgs = []string{"--pprof-addr", pprofAddr["nats"]}
	}
	s := newStackArgs(b, natsArgs...)
	// A dispatch that times out on a saturated machine is tried again on
	// another worker, as a deployment would configure it.
	// The connection cap (--max-connections) is raised above the workload,
	// which comes from one address: the per-address cap is off.
	feArgs := []string{"--migration-limit", "3", "--max-connections", strconv.Itoa(sc.streams + 1000), "--max-connections-per-address", "0"}
	if sc.logOff || sc.keepLog {
		// Nothing of a log-off request is stored, so there is nothing to
		// compact: the baseline writes nothing to the log.
		feArgs = append(feArgs, "--log-compaction=false")
	}
	if sc.batched {
		feArgs = append(feArgs, "--batched-output")
	}
	// Every Go server traces its collections, which tell its live heap,
	// and serves pprof, through which the run starts with a collection.
	env := []string{gctraceEnv()}
	s.workerEnv = append(s.workerEnv, env...)
	fePprof := fmt.Sprintf("127.0.0.1:%d", freePort(b))
	feArgs = append(feArgs, "--pprof-addr", fePprof)
	if profDir != "" {
		pprofAddr["frontend"] = fePprof
	}
	fe := s.frontend(env, feArgs...)
	procs := []scaleProc{{name: "nats", pid: s.nats.Pid()},
		{name: "frontend", pid: fe.Pid(), metrics: fe.url + "/metrics", gctrace: fe.proc, pprof: fePprof}}
	for _, id := range []string{"w1", "w2"} {
		port := freePort(b)
		args := []string{"--mock-tokens-per-sec", strconv.Itoa(sc.rate), "--mock-kv-blocks", "10000000",
			"--system-port", strconv.Itoa(port), "--bench-emit-time"}
		if sc.logOff {
			args = append(args, "--bench-log-off")
		}
		if sc.batched {
			args = append(args, "--batched-output")
		}
		wPprof := fmt.Sprintf("127.0.0.1:%d", freePort(b))
		args = append(args, "--pprof-addr", wPprof)
		if profDir != "" && id == "w1" {
			pprofAddr["worker"] = wPprof
		}
		p := s.worker(id, args...)
		procs = append(procs, scaleProc{name: "worker-" + id, pid: p.Pid(),
			metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", port), gctrace: p, pprof: wPprof})
	}
	fe.waitRoutable(b, "w1", "w2")
	if sc.batched {
		waitWritesBatched(b, s, "w1", "w2")
	}
	procs = append(procs, scaleProc{name: "client", pid: os.Getpid()})
	raw := rawPublishRate(b, s.natsURL)
	js := asyncPublisher(b, s.natsURL)

	for i := 0; b.Loop(); i++ {
		var settle func() time.Duration
		if !sc.logOff {
			settle = func() time.Duration { return logSettled(b, js, streams.Partitions(s.partitions)) }
		}
		before := storedMessages(b, s.jetStream(b))
		const received = "baton_frontend_nats_received_messages_total"
		receivedBefore := scrape(fe.url+"/metrics", received)[received]
		r := scaleRun(b, sc, fe.url, procs, fmt.Sprintf("scale-%s-%d", sc.name, i), profDir, pprofAddr, settle)
		r.report(b, sc, procs)
		if r.delivered > 0 {
			// Issue 33's measures: what the log stores and the frontend
			// receives a token, and the streams at this rate that one
			// partition could hold at the raw publish rate measured below
			// (a stream costs rate × stored messages a token each second).
			stored := float64(storedMessages(b, s.jetStream(b))-before) / float64(r.delivered)
			b.ReportMetric(stored, "stored_msgs/tok")
			b.ReportMetric((scrape(fe.url+"/metrics", received)[received]-receivedBefore)/float64(r.delivered), "fe_received_msgs/tok")
			if stored > 0 {
				b.ReportMetric(raw/(stored*float64(sc.rate)), "streams/partition")
			}
		}
		b.ReportMetric(raw, "raw_js_msgs/s") // after b.Loop's reset of the metrics
	}
}

// logSettled waits until the request log's message count has not changed
// for a second (at most two minutes), and returns how long that took, less
// that second.
func logSettled(b *testing.B, js jetstream.JetStream, p streams.Partitions) time.Duration {
	start, last, same := time.Now(), uint64(0), time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for ; time.Since(start) < 2*time.Minute; <-tick.C {
		var n uint64
		for _, name := range p.Streams() {
			st, err := js.Stream(context.Background(), name)
			if err != nil {
				b.Fatalf("request log: %v", err)
			}
			n += st.CachedInfo().State.Msgs
		}
		if n != last {
			last, same = n, time.Now()
		} else if time.Since(same) >= time.Second {
			return same.Sub(start)
		}
	}
	b.Logf("the request log still changes two minutes after the last stream")
	return time.Since(start)
}

// scaleResult is what one run of a scaleCase measured.
type scaleResult struct {
	base, open, end []procSample // per process: before, while every stream is open, after
	openStreams     int
	delivered       int
	windowRate      float64 // tokens/s delivered while 95% of the streams were open (if for 1 s or more)
	peakRate        float64 // the most tokens/s delivered over 1 s
	unstamped       int     // tokens delivered without an emit time
	elapsed         time.Duration
	latencies       []time.Duration
	errors          int
	firstErr        string
	errorKinds      map[string]int // errors by their first 60 characters
	busy            float64        // the machine's CPU use over the run, 0-1
	// settled is how long after the last stream the request log stopped
	// changing: the compactions' purges, which go one at a time, still under
	// way. The processes' CPU (end) is sampled after it, so a token's CPU
	// includes its compaction.
	settled time.Duration
}

func scaleRun(b *testing.B, sc scaleCase, url string, procs []scaleProc, tag, profDir string, pprofAddr map[string]string, settle func() time.Duration) *scaleResult {
	r := &scaleResult{base: sampleProcs(b, procs), errorKinds: map[string]int{}}
	// A collection of every idle server, after the sample (which it leaves
	// as it was): the live heap at idle is what it marks. Its heap profile
	// is the idle base of the profiles taken later (pprof -diff_base).
	for _, p := range procs {
		if p.pprof == "" {
			continue
		}
		path := os.DevNull
		for name, addr := range pprofAddr { // the processes profiled, by the names of their profiles
			if addr == p.pprof {
				path = filepath.Join(profDir, fmt.Sprintf("%s-%s-heap-idle.pprof", sc.name, name))
			}
		}
		if err := saveProfile("http://"+p.pprof+"/debug/pprof/heap?gc=1", path); err != nil {
			b.Logf("collect %s: %v", p.name, err)
		}
	}
	cpuStart := machineCPU(b)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: sc.streams, DisableCompression: true}}
	defer client.CloseIdleConnections()

	var open, delivered, unstamped atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for i := range sc.streams {
		wg.Go(func() {
			time.Sleep(time.Until(start.Add(sc.ramp * time.Duration(i) / time.Duration(sc.streams))))
			lat, n, err := scaleStream(client, url, fmt.Sprintf("%s-%d", tag, i), sc.tokens, &open, &delivered, &unstamped)
			mu.Lock()
			defer mu.Unlock()
			r.record(lat, n, sc.tokens, err)
		})
	}

	// Sample while the streams run: the moment most streams are open gives
	// the per-stream figures; the window in which 95% are open gives the
	// delivered rate.
	stop := make(chan struct{})
	sampled := make(chan struct{})
	var profiles sync.WaitGroup
	defer profiles.Wait() // before the processes stop
	go func() {
		defer close(sampled)
		var winStart, winEnd time.Time
		var winFrom, winTo int64
		type point struct {
			t time.Time
			d int64
		}
		var series []point
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		profiled := false
		for {
			select {
			case <-stop:
				if winEnd.Sub(winStart) >= time.Second {
					r.windowRate = float64(winTo-winFrom) / winEnd.Sub(winStart).Seconds()
				}
				return
			case <-tick.C:
			}
			n := int(open.Load())
			now, d := time.Now(), delivered.Load()
			series = append(series, point{now, d})
			for j := len(series) - 1; j >= 0; j-- {
				if el := now.Sub(series[j].t); el >= time.Second {
					r.peakRate = max(r.peakRate, float64(d-series[j].d)/el.Seconds())
					break
				}
			}
			if n >= sc.streams*95/100 {
				if winStart.IsZero() {
					winStart, winFrom = now, d
				}
				winEnd, winTo = now, d
			}
			if n > r.openStreams || (n == sc.streams && r.open == nil) {
				r.openStreams = n
				r.open = sampleProcs(b, procs)
			}
			if n >= sc.streams*9/10 && profDir != "" && !profiled {
				profiled = true
				profiles.Add(1)
				go saveProfiles(b, &profiles, profDir, sc.name, pprofAddr)
			}
		}
	}()
	wg.Wait()
	r.elapsed = time.Since(start)
	close(stop)
	<-sampled
	r.busy = machineCPU(b).busySince(cpuStart)
	if settle != nil {
		r.settled = settle()
	}
	r.end = sampleProcs(b, procs)
	r.delivered = int(delivered.Load())
	r.unstamped = int(unstamped.Load())
	// Failed streams are a measured outcome, reported as the errors metric:
	// past the machine's capacity they fail (dispatch timeouts inhibit the
	// workers, then 503s), and the targets in BENCHMARKS.md say how many may.
	return r
}

// record takes in one stream's outcome: n of want tokens, their latencies,
// its error. The caller serialises calls.
func (r *scaleResult) record(lat []time.Duration, n, want int, err error) {
	r.latencies = append(r.latencies, lat...)
	if err == nil && n != want {
		err = fmt.Errorf("%d tokens, want %d", n, want)
	}
	if err != nil {
		r.errors++
		r.errorKinds[fmt.Sprintf("%.60s", err.Error())]++
		if r.firstErr == "" {
			r.firstErr = err.Error()
		}
	}
}

// scaleStream runs one streaming completion and returns the emit-to-read
// latency of each of its tokens and how many it received. open counts it from
// its first token to its end; delivered counts its tokens.
func scaleStream(client *http.Client, url, id string, tokens int, open, delivered, unstamped *atomic.Int64) ([]time.Duration, int, error) {
	body, _ := json.Marshal(map[string]any{"model": "mock", "prompt": "scale " + id, "max_tokens": tokens, "stream": true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	resp, err := client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		return nil, 0, fmt.Errorf("status %d: %s", resp.StatusCode, msg)
	}
	lat := make([]time.Duration, 0, tokens)
	emits := make([]int64, 0, tokens)
	rd := bufio.NewReaderSize(resp.Body, 4096)
	got, started, done := 0, false, false
	defer func() {
		if started {
			open.Add(-1)
		}
	}()
	var readErr error
	var long []byte // a line longer than the reader's buffer, so far
	for {
		line, err := rd.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A line of many tokens or emit stamps (deltas that waited
			// together in a frontend short of CPU): a valid SSE line.
			long = append(long, line...)
			continue
		}
		if err != nil {
			readErr = err
			break
		}
		if long != nil {
			line, long = append(long, line...), nil
		}
		switch {
		case bytes.HasPrefix(line, []byte("id: ")):
			if off, err := strconv.Atoi(string(bytes.TrimSpace(line[4:]))); err == nil && off > got {
				delivered.Add(int64(off - got))
				got = off
				if !started {
					started = true
					open.Add(1)
				}
			}
		case bytes.HasPrefix(line, []byte("data: [DONE]")):
			done = true
		case bytes.HasPrefix(line, []byte(`data: {"error"`)):
			return lat, got, fmt.Errorf("error event: %s", bytes.TrimSpace(line))
		case bytes.HasPrefix(line, []byte("data: ")):
			// The tokens' texts are their emit times (--bench-emit-time).
			now := time.Now().UnixNano()
			n := len(emits)
			emits = engine.EmitTimes(emits, string(line))
			for _, v := range emits[n:] {
				lat = append(lat, time.Duration(now-v))
			}
		}
	}
	unstamped.Add(int64(max(got-len(emits), 0)))
	if !done {
		return lat, got, fmt.Errorf("stream ended without [DONE] after %d tokens (%v)", got, readErr)
	}
	return lat, got, nil
}

// sampleProcs reads every process's CPU time and RSS from /proc, and its Go
// heap and goroutines from its metrics.
func sampleProcs(b *testing.B, procs []scaleProc) []procSample {
	out := make([]procSample, len(procs))
	for i, p := range procs {
		out[i].cpu, out[i].rss = procCPU(b, p.pid)
		if p.gctrace != nil {
			p.gctrace.mu.Lock()
			out[i].logAt = p.gctrace.log.Len()
			p.gctrace.mu.Unlock()
		}
		if p.metrics != "" {
			m := scrape(p.metrics, "go_memstats_heap_inuse_bytes", "go_goroutines",
				"dynamo_component_requests_total", "dynamo_component_inflight_requests",
				"dynamo_frontend_model_migration_total", "baton_frontend_worker_inhibitions_total",
				"baton_frontend_dispatch_unanswered_total")
			out[i].heap, out[i].goroutines = m["go_memstats_heap_inuse_bytes"], m["go_goroutines"]
			out[i].requests, out[i].inflight = m["dynamo_component_requests_total"], m["dynamo_component_inflight_requests"]
			out[i].migrations = m["dynamo_frontend_model_migration_total"]
			out[i].inhibitions = m["baton_frontend_worker_inhibitions_total"]
			out[i].unanswered = m["baton_frontend_dispatch_unanswered_total"]
		}
	}
	return out
}

// clockTick is the unit of /proc/<pid>/stat times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// procCPU is a process's user + system CPU time and its resident set.
func procCPU(b *testing.B, pid int) (time.Duration, float64) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatalf("read stat of %d: %v", pid, err)
	}
	// The command name (field 2) may hold spaces: count fields after it.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, _ := strconv.ParseInt(f[12], 10, 64) // field 15
	rssPages, _ := strconv.ParseInt(f[21], 10, 64)
	return time.Duration(utime+stime) * clockTick, float64(rssPages * int64(os.Getpagesize()))
}

// gctraceEnv is the GODEBUG setting of the measured servers: this process's
// (a memprofilerate set for a finer heap profile, say) with gctrace=1.
func gctraceEnv() string {
	if v := os.Getenv("GODEBUG"); v != "" {
		return "GODEBUG=" + v + ",gctrace=1"
	}
	return "GODEBUG=gctrace=1"
}

// gcLive matches a gctrace line's heap sizes: at the start of the
// collection, at its end, and marked live ("gc 7 @2.1s 3%: ..., 30->31->15
// MB, 32 MB goal, ..."), in MB.
var gcLive = regexp.MustCompile(`(?m)^gc \d+ @[0-9.]+s .*?, (\d+)->(\d+)->(\d+) MB`)

// gcLiveAt is the live heap, in bytes, that the first collection past
// offset at in a Go process's output (with its gctrace) marked:
// what go_gc_heap_live_bytes on /metrics says after that collection (read
// at the sample, the metric would still be the collection before it). -1
// if none. gctrace gives whole MB, so at 1,000 streams a figure per stream
// is good to about 1 KB.
func gcLiveAt(out string, at int) float64 {
	m := gcLive.FindStringSubmatch(out[at:])
	if m == nil {
		return -1
	}
	mb, _ := strconv.ParseFloat(m[3], 64)
	return mb * (1 << 20)
}

// scrape returns the values of the named metrics at url, each the sum over
// its series (all its label values).
func scrape(url string, names ...string) map[string]float64 {
	resp, err := http.Get(url)
	if err != nil {
		return map[string]float64{}
	}
	defer resp.Body.Close()
	out, _ := promtext.Sums(resp.Body, names...) // what was read before an error counts
	return out
}

// cpuTimes are the machine's CPU counters from /proc/stat, in ticks.
type cpuTimes struct{ busy, total int64 }

func machineCPU(b *testing.B) cpuTimes {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	var t cpuTimes
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseInt(f, 10, 64)
		if i < 8 { // user nice system idle iowait irq softirq steal
			t.total += v
			if i != 3 && i != 4 {
				t.busy += v
			}
		}
	}
	return t
}

func (t cpuTimes) busySince(from cpuTimes) float64 {
	if t.total == from.total {
		return 0
	}
	return float64(t.busy-from.busy) / float64(t.total-from.total)
}

// saveProfiles saves a 5 s CPU profile and then a heap profile of each
// process in addrs to dir, then marks wg done.
func saveProfiles(b *testing.B, wg *sync.WaitGroup, dir, name string, addrs map[string]string) {
	defer wg.Done()
	var each sync.WaitGroup
	defer each.Wait()
	for proc, addr := range addrs {
		each.Go(func() {
			for _, p := range []struct{ path, kind string }{{"profile?seconds=5", "cpu"}, {"heap", "heap"}} {
				if err := saveProfile("http://"+addr+"/debug/pprof/"+p.path,
					filepath.Join(dir, fmt.Sprintf("%s-%s-%s.pprof", name, proc, p.kind))); err != nil {
					b.Logf("profile %s: %v", proc, err)
				}
			}
		})
	}
}

func saveProfile(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// logOffRatio records a -logoff baseline's rates, or reports a durable
// run's against its baseline's (and returns the text for the table). At
// saturation every workload delivers all its tokens, late: the average over
// the run is the throughput.
func (r *scaleResult) logOffRatio(b *testing.B, sc scaleCase) string {
	avg := float64(r.delivered) / r.elapsed.Seconds()
	if sc.logOff {
		logOffRate[sc.shape()] = [2]float64{avg, r.peakRate}
		return ""
	}
	base := logOffRate[sc.shape()]
	if base[0] == 0 {
		return ""
	}
	b.ReportMetric(avg/base[0], "durable/logoff")
	b.ReportMetric(r.peakRate/base[1], "durable/logoff_peak")
	return fmt.Sprintf("; durable/log-off %.2f on average, %.2f at the peak (log off: %.0f, %.0f)", avg/base[0], r.peakRate/base[1], base[0], base[1])
}

// routing reports how the frontend spread the run's streams over the
// workers: the streams each finished (max/min), the frontend's migrations,
// inhibitions and unanswered dispatches over the run, and returns them as
// text.
func (r *scaleResult) routing(b *testing.B, procs []scaleProc) string {
	var carried []float64
	fe := -1
	for i, p := range procs {
		switch {
		case strings.HasPrefix(p.name, "worker-"):
			carried = append(carried, r.end[i].requests-r.base[i].requests)
		case p.name == "frontend":
			fe = i
		}
	}
	if len(carried) == 0 || fe < 0 {
		return ""
	}
	hi, lo := slices.Max(carried), slices.Min(carried)
	delta := func(v func(procSample) float64) float64 { return v(r.end[fe]) - v(r.base[fe]) }
	mig := delta(func(s procSample) float64 { return s.migrations })
	inh := delta(func(s procSample) float64 { return s.inhibitions })
	una := delta(func(s procSample) float64 { return s.unanswered })
	b.ReportMetric(hi, "worker_streams_max")
	b.ReportMetric(lo, "worker_streams_min")
	b.ReportMetric(mig, "migrations")
	b.ReportMetric(inh, "inhibitions")
	b.ReportMetric(una, "dispatch_timeouts")
	return fmt.Sprintf("streams per worker max %.0f min %.0f; migrations %.0f, inhibitions %.0f, dispatches unanswered %.0f", hi, lo, mig, inh, una)
}

// report logs a table of the run and reports its headline figures.
func (r *scaleResult) report(b *testing.B, sc scaleCase, procs []scaleProc) {
	if r.delivered == 0 || r.open == nil {
		b.Fatalf("nothing delivered (%d tokens, %d streams open at most)", r.delivered, r.openStreams)
	}
	perTok := func(i int) float64 {
		return float64((r.end[i].cpu - r.base[i].cpu).Microseconds()) / float64(r.delivered)
	}
	perStream := func(v func(procSample) float64, i int) float64 {
		return (v(r.open[i]) - v(r.base[i])) / float64(r.openStreams)
	}
	rss := func(s procSample) float64 { return s.rss / 1024 }
	heap := func(s procSample) float64 { return s.heap / 1024 }
	gor := func(s procSample) float64 { return s.goroutines }
	// The live heap per stream: what the first collection after the sample
	// marked, minus what the idle collection after the base sample did (0
	// if unknown).
	live := func(i int) float64 {
		if procs[i].gctrace == nil {
			return 0
		}
		out := procs[i].gctrace.output()
		at, idle := gcLiveAt(out, r.open[i].logAt), gcLiveAt(out, r.base[i].logAt)
		if at < 0 || idle < 0 {
			return 0
		}
		return (at - idle) / 1024 / float64(r.openStreams)
	}
	var cpuServers float64
	var lines strings.Builder
	// At most 9 lines: the testing package cuts a benchmark's log at 10.
	fmt.Fprintf(&lines, "%d streams x %d tok/s x %d tokens, ramp %v: %d tokens delivered in %v, %d streams open at the sample, %d errors",
		sc.streams, sc.rate, sc.tokens, sc.ramp, r.delivered, r.elapsed.Round(time.Millisecond), r.openStreams, r.errors)
	if r.firstErr != "" {
		fmt.Fprintf(&lines, " (first: %.200s; by kind: %v)", strings.ReplaceAll(r.firstErr, "\n", " "), r.errorKinds)
	}
	lines.WriteString("; " + r.routing(b, procs) + "\n")
	fmt.Fprintf(&lines, "%-10s %12s %14s %14s %14s %16s %9s %9s\n", "process", "cpu_us/tok", "rss_KB/stream", "heap_KB/stream", "live_KB/stream", "goroutines/strm", "streams", "in_flight")
	workers := map[string]float64{}
	for i, p := range procs {
		fmt.Fprintf(&lines, "%-10s %12.1f %14.1f %14.1f %14.1f %16.2f", p.name, perTok(i), perStream(rss, i), perStream(heap, i), live(i), perStream(gor, i))
		if strings.HasPrefix(p.name, "worker-") {
			fmt.Fprintf(&lines, " %9.0f %9.0f", r.end[i].requests-r.base[i].requests, r.open[i].inflight)
		}
		lines.WriteString("\n")
		if p.name != "client" {
			cpuServers += perTok(i)
		}
		if strings.HasPrefix(p.name, "worker-") {
			workers["cpu"] += perTok(i)
			workers["rss"] += perStream(rss, i)
			workers["heap"] += perStream(heap, i)
			workers["live"] += live(i)
			workers["gor"] += perStream(gor, i)
		}
	}
	slices.Sort(r.latencies)
	ms := func(p float64) float64 {
		if len(r.latencies) == 0 {
			return 0
		}
		return float64(r.latencies[int(p*float64(len(r.latencies)-1))].Microseconds()) / 1000
	}
	offered := float64(sc.streams * sc.rate)
	fmt.Fprintf(&lines, "offered %.0f tok/s; delivered %.0f tok/s while 95%% were open (0: for less than 1 s), %.0f at the peak second, %.0f on average",
		offered, r.windowRate, r.peakRate, float64(r.delivered)/r.elapsed.Seconds())
	lines.WriteString(r.logOffRatio(b, sc) + "\n")
	fmt.Fprintf(&lines, "emit-to-client p50 %.1f ms p99 %.1f ms p999 %.1f ms over %d tokens (%d without an emit time); machine CPU busy %.0f%% (headroom %.0f%%)",
		ms(0.5), ms(0.99), ms(0.999), len(r.latencies), r.unstamped, 100*r.busy, 100*(1-r.busy))
	if r.settled > 0 {
		fmt.Fprintf(&lines, "; the log settled %.1f s after the last stream (compaction; the CPU per token includes it)", r.settled.Seconds())
	}
	b.Log(lines.String())
	b.ReportMetric(r.settled.Seconds(), "settled_s")

	b.ReportMetric(cpuServers, "cpu_us/tok")
	for i, p := range procs {
		switch p.name {
		case "nats":
			b.ReportMetric(perTok(i), "nats_cpu_us/tok")
			b.ReportMetric(perStream(rss, i), "nats_rss_KB/stream")
		case "frontend":
			b.ReportMetric(perTok(i), "fe_cpu_us/tok")
			b.ReportMetric(perStream(rss, i), "fe_rss_KB/stream")
			b.ReportMetric(perStream(heap, i), "fe_heap_KB/stream")
			b.ReportMetric(live(i), "fe_live_KB/stream")
			b.ReportMetric(perStream(gor, i), "fe_goroutines/stream")
		case "client":
			b.ReportMetric(perTok(i), "client_cpu_us/tok")
		}
	}
	b.ReportMetric(workers["cpu"], "workers_cpu_us/tok")
	b.ReportMetric(workers["rss"], "workers_rss_KB/stream")
	b.ReportMetric(workers["heap"], "workers_heap_KB/stream")
	b.ReportMetric(workers["live"], "workers_live_KB/stream")
	b.ReportMetric(workers["gor"], "workers_goroutines/stream")
	b.ReportMetric(r.windowRate, "open_tok/s")
	b.ReportMetric(r.peakRate, "peak_tok/s")
	b.ReportMetric(offered, "offered_tok/s")
	b.ReportMetric(r.peakRate/offered, "peak/offered")
	b.ReportMetric(ms(0.5), "p50_ms")
	b.ReportMetric(ms(0.99), "p99_ms")
	b.ReportMetric(ms(0.999), "p999_ms")
	b.ReportMetric(100*(1-r.busy), "cpu_headroom_%")
	b.ReportMetric(float64(r.errors), "errors")
}

// storedMessages is how many messages the request log and the workers'
// output streams have stored so far (their last sequences: purges and
// limits do not take back a sequence).
func storedMessages(b *testing.B, js jetstream.JetStream) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n uint64
	for si := range js.ListStreams(ctx).Info() {
		if strings.HasPrefix(si.Config.Name, streams.RequestsStream) || strings.HasPrefix(si.Config.Name, streams.WorkerOutputPrefix) {
			n += si.State.LastSeq
		}
	}
	return n
}
