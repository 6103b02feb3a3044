package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Benchmarks of the request log: the write rate of its partitions
// (BenchmarkPartitions), what a token costs it (BenchmarkLogFootprint), and
// what an idle stack's questions to it cost the appends beside them
// (BenchmarkGuardBesideAppends).

// partitionBenchMsgs is how many deltas one run of BenchmarkPartitions
// stores, over partitionBenchRequests requests (every slot) from
// partitionBenchPublishers connections.
const (
	partitionBenchMsgs       = 60_000
	partitionBenchRequests   = 3000
	partitionBenchPublishers = 6
)

// BenchmarkPartitions is the request log's write capacity on a 3-node
// cluster on loopback with R3 file streams, as baton provisions them: async
// publishes per second of delta-sized messages (300 bytes, on the tokens
// subjects of 3000 requests) into a log of one partition, then of three
// whose leaders Provision spread over the nodes, and the CPU each node spent
// per stored message. One stream leader orders and stores every write of its
// stream; partitions spread that work over the nodes.
func BenchmarkPartitions(b *testing.B) {
	c := newCluster(b)
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("partitions=%d", n), func(b *testing.B) {
			js := c.jetStream()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			parts, err := streams.Provision(ctx, js, streams.Config{Replicas: 3, RequestPartitions: n})
			if err != nil {
				b.Fatalf("provision %d partitions: %v", n, err)
			}
			defer func() {
				for _, name := range parts.Streams() {
					_ = js.DeleteStream(context.Background(), name)
				}
			}()
			leaders, err := streams.Leaders(ctx, js, parts)
			if err != nil {
				b.Fatal(err)
			}
			b.Logf("%d partition(s), leaders %v", n, leaders)
			var rate float64
			cpu := map[string]time.Duration{}
			for range b.N {
				before := c.cpu(b)
				rate = publishDeltas(b, c.urls())
				for name, t := range c.cpu(b) {
					cpu[name] += t - before[name]
				}
			}
			b.ReportMetric(rate, "msgs/s")
			var per []string
			var total time.Duration
			for _, node := range c.nodes {
				total += cpu[node.name]
				per = append(per, fmt.Sprintf("%s %.1f", node.name, float64(cpu[node.name].Microseconds())/float64(b.N*partitionBenchMsgs)))
			}
			b.ReportMetric(float64(total.Microseconds())/float64(b.N*partitionBenchMsgs), "cluster_cpu_µs/msg")
			b.Logf("%d partition(s): %.0f msgs/s; CPU µs per message by node: %s (leaders %v)", n, rate, strings.Join(per, ", "), leaders)
		})
	}
}

// asyncPublisher connects to url for async publishes, 4096 unacknowledged
// at most; the connection closes when the benchmark ends.
func asyncPublisher(b *testing.B, url string) jetstream.JetStream {
	b.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	return js
}

// cpu is each node's CPU time so far.
func (c *cluster) cpu(b *testing.B) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, n := range c.nodes {
		out[n.name], _ = procCPU(b, n.Pid())
	}
	return out
}

// publishDeltas stores partitionBenchMsgs delta-sized messages on the tokens
// subjects of partitionBenchRequests requests from partitionBenchPublishers
// connections, 4096 unacknowledged each at most, and returns the messages
// stored per second.
func publishDeltas(b *testing.B, urls string) float64 {
	payload := make([]byte, 300)
	var wg sync.WaitGroup
	errs := make(chan error, partitionBenchPublishers)
	start := time.Now()
	for p := range partitionBenchPublishers {
		js := asyncPublisher(b, urls)
		wg.Go(func() {
			for i := p; i < partitionBenchMsgs; i += partitionBenchPublishers {
				id := fmt.Sprintf("bench-%d", i%partitionBenchRequests)
				if _, err := js.PublishAsync(streams.RequestTokens(id, 0, "w1"), payload, jetstream.WithStallWait(30*time.Second)); err != nil {
					errs <- err
					return
				}
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				errs <- fmt.Errorf("publisher %d: acknowledgements not in after a minute", p)
			}
		})
	}
	wg.Wait()
	rate := partitionBenchMsgs / time.Since(start).Seconds()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return rate
}

// BenchmarkLogFootprint measures what a token costs the request log: in
// flight (every delta stored, as while a request runs) and finished (after
// compaction), for 4 requests of 500 tokens, at decode rates (200 tokens/s,
// a delta per token) and at full speed (deltas of up to 16 tokens). The
// baseline is the same run's uncompacted log. Targets (issue 19): in
// flight at most about 240 bytes a token; finished at most 16 bytes a token
// plus 1.5 KB a request.
func BenchmarkLogFootprint(b *testing.B) {
	for _, rate := range []int{200, 0} {
		name := fmt.Sprintf("tokens_per_sec=%d", rate)
		if rate == 0 {
			name = "full_speed"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				footprint(b, rate)
			}
		})
	}
}

func footprint(b *testing.B, rate int) {
	const requests, tokens = 4, 500
	s := newStack(b)
	f := s.frontend(nil, "--log-compaction=false")
	args := []string{"--mock-ttft", "5ms"}
	if rate > 0 {
		args = append(args, "--mock-tokens-per-sec", fmt.Sprint(rate))
	} else {
		args = append(args, "--mock-speedup-ratio", "1000")
	}
	s.worker("w1", args...)
	s.worker("w2", args...)
	f.waitRoutable(b, "w1", "w2")
	nc, err := nats.Connect(s.natsURL)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	usage := func() streams.Usage {
		u, err := streams.ReadUsage(context.Background(), js, streams.RequestsStream)
		if err != nil {
			b.Fatal(err)
		}
		return u
	}
	base := usage()
	var wg sync.WaitGroup
	ids := make([]string, requests)
	for i := range requests {
		ids[i] = fmt.Sprintf("fp-%d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := postStream(b, f.url, "/v1/completions", map[string]any{"model": "mock", "prompt": fmt.Sprintf("footprint %d", i), "max_tokens": tokens},
				map[string]string{"X-Request-Id": ids[i]}, nil)
			if !r.done || len(strings.Fields(r.text)) != tokens {
				b.Errorf("request %d: done %v, %d tokens", i, r.done, len(strings.Fields(r.text)))
			}
		}()
	}
	wg.Wait()
	hot := usage()
	if _, errOut, code := runTool(b, batonBin, append([]string{"compact", "--nats", s.natsURL}, ids...)...); code != 0 {
		b.Fatalf("baton compact: %s", errOut)
	}
	cold := usage()
	n := float64(requests * tokens)
	hotBytes, coldBytes := float64(hot.Bytes-base.Bytes), float64(cold.Bytes-base.Bytes)
	b.ReportMetric(hotBytes/n, "B/token_in_flight")
	b.ReportMetric(float64(hot.Msgs-base.Msgs)/n, "msgs/token_in_flight")
	b.ReportMetric(coldBytes/requests, "B/request_finished")
	b.ReportMetric((coldBytes/requests-1536)/tokens, "B/token_finished_over_1.5KB")
	b.ReportMetric(hotBytes/coldBytes, "x_compaction")
}

// BenchmarkGuardBesideAppends: what an idle stack's periodic questions to
// the request log cost the appends beside them, on a log that holds
// 100,000 subjects (50,000 finished requests' events and tokens subjects).
// One frontend and one mock worker run and serve nothing; this process
// appends to the partition one message at a time for appendFor, with them
// running and then with the frontend stopped (SIGSTOP: its junk guard and
// usage readings pause), and reports the latency of each append at p50,
// p99, p999 and the worst, and the worst with the frontend running over the
// worst without (one append in thousands meets a hold, the one waiting
// when it comes; under load every append in flight does). A frontend that asked for a worker's last message (last_by_subj
// of its tokens subjects, which the server answers by matching every
// subject) held the partition's writes for tens of milliseconds four times
// a second (BATON_BENCH_BIN names another build). Last, with a second
// worker, w9, quarantined for junk and idle: a sweep of its subjects lists
// or purges them by matching every subject too, and a sweep that finds
// nothing new written since the last one is skipped.
//
//	go test -run '^$' -bench BenchmarkGuardBesideAppends -benchtime 1x ./integration/
func BenchmarkGuardBesideAppends(b *testing.B) {
	const requests, appendFor = 50_000, 3 * time.Second
	s := newStack(b)
	f := s.frontend(nil)
	s.worker("w1")
	s.worker("w9")
	f.waitRoutable(b, "w1", "w9")
	nc, err := nats.Connect(s.natsURL)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	for i := range requests {
		id := fmt.Sprintf("guard-%06d", i)
		for _, subj := range []string{streams.RequestEvents(id), streams.RequestTokens(id, 0, "w2")} {
			if _, err := js.PublishAsync(subj, []byte("x")); err != nil {
				b.Fatal(err)
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("filling the log took over a minute")
	}
	appends := func() []time.Duration {
		var lat []time.Duration
		subj := streams.RequestEvents("guard-probe")
		for end := time.Now().Add(appendFor); time.Now().Before(end); {
			start := time.Now()
			if _, err := js.Publish(context.Background(), subj, []byte("x")); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		return lat
	}
	quarantined := false
	for b.Loop() {
		running := appends()
		f.signal(syscall.SIGSTOP)
		stopped := appends()
		f.signal(syscall.SIGCONT)
		// Then w9 is quarantined (one 100 KiB message on a request that
		// does not exist) and stops writing: the guard sweeps its subjects
		// at every reading from then on.
		if !quarantined {
			if _, err := js.Publish(context.Background(), streams.RequestTokens("no-such-request", 0, "w9"), make([]byte, 100<<10)); err != nil {
				b.Fatal(err)
			}
			waitFor(b, 30*time.Second, "w9 quarantined", func() bool {
				ws, err := f.workers()
				return err == nil && slices.ContainsFunc(ws, func(w workerInfo) bool { return w.ID == "w9" && w.State == "quarantined" })
			})
			quarantined = true
		}
		swept := appends()
		for _, r := range []struct {
			name string
			lat  []time.Duration
		}{{"running", running}, {"stopped", stopped}, {"running_w9_quarantined", swept}} {
			b.ReportMetric(float64(r.lat[len(r.lat)/2].Microseconds()), "append_p50_µs_frontend_"+r.name)
			b.ReportMetric(float64(r.lat[len(r.lat)*99/100].Microseconds()), "append_p99_µs_frontend_"+r.name)
			b.ReportMetric(float64(r.lat[len(r.lat)*999/1000].Microseconds()), "append_p999_µs_frontend_"+r.name)
			b.ReportMetric(float64(r.lat[len(r.lat)-1].Microseconds()), "append_max_µs_frontend_"+r.name)
		}
		b.ReportMetric(float64(running[len(running)-1])/float64(stopped[len(stopped)-1]), "append_max_ratio")
	}
}
