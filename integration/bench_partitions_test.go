package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

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
		out[n.name], _ = procCPU(b, n.cmd.Process.Pid)
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
