package streams_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/baton-dev/baton/internal/natstest"
	"github.com/baton-dev/baton/streams"
)

// BenchmarkWorkerLookup: the two ways to ask the request log what one
// worker wrote (the junk guard's question, every reading), on a file-stored
// partition holding 100,000 subjects (50,000 requests' events and their
// tokens subjects of another worker), the worker's own messages among the
// last ones: its last message (last_by_subj of its tokens subjects, which
// the server answers by matching every subject), and its first message at
// or after a sequence 4,096 messages back (NextOfWorker: the server reads
// the stream from there), and the same for a worker that wrote nothing
// there (the server reads all 4,096); and what a quarantined worker's
// sweep asks (the list of its subjects, the purge of all it wrote: both
// match every subject). Besides the time of one lookup, each reports the
// p99 of the publishes another connection makes meanwhile, one at a time:
// the file store holds its writes while a lookup reads.
//
//	go test -run '^$' -bench BenchmarkWorkerLookup ./streams/
func BenchmarkWorkerLookup(b *testing.B) {
	srv := natstest.Start(b)
	js := srv.JetStream(b)
	ctx := context.Background()
	if _, err := streams.Provision(ctx, js, streams.Config{}); err != nil {
		b.Fatal(err)
	}
	const requests = 50_000
	for i := range requests {
		id := fmt.Sprintf("r%06d", i)
		for _, subj := range []string{streams.RequestEvents(id), streams.RequestTokens(id, 0, "w2")} {
			if _, err := js.PublishAsync(subj, []byte("x")); err != nil {
				b.Fatal(err)
			}
		}
		if i%1000 == 999 { // the worker's own, now and then, as it serves requests too
			if _, err := js.PublishAsync(streams.RequestTokens(id, 0, "w1"), []byte("x")); err != nil {
				b.Fatal(err)
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("publishing the partition took over a minute")
	}
	u, err := streams.ReadUsage(ctx, js, streams.RequestsStream)
	if err != nil {
		b.Fatal(err)
	}
	writer := srv.JetStream(b)
	lookups := []struct {
		name string
		get  func() error
	}{
		{"last_by_subj", func() error {
			_, err := streams.LastOnSubject(ctx, js, streams.RequestsStream, streams.WorkerTokens("w1"))
			return err
		}},
		{"next_by_subj_4096_back", func() error {
			_, ok, err := streams.NextOfWorker(ctx, js, streams.RequestsStream, "w1", u.LastSeq-4096+1)
			if err == nil && !ok {
				err = fmt.Errorf("w1's message in the last 4,096 not found")
			}
			return err
		}},
		{"next_by_subj_4096_back_idle_worker", func() error {
			_, ok, err := streams.NextOfWorker(ctx, js, streams.RequestsStream, "w3", u.LastSeq-4096+1)
			if err == nil && ok {
				err = fmt.Errorf("a message of w3, which wrote none")
			}
			return err
		}},
		// What a quarantined worker's sweep asks at each reading: the
		// list of its subjects, or the purge of all it wrote.
		{"worker_subjects", func() error {
			_, err := streams.WorkerSubjects(ctx, js, streams.RequestsStream, "w3")
			return err
		}},
		{"purge_worker", func() error {
			_, err := streams.PurgeWorker(ctx, js, streams.RequestsStream, "w3")
			return err
		}},
	}
	for _, l := range lookups {
		b.Run(l.name, func(b *testing.B) {
			var lat []time.Duration
			var wg sync.WaitGroup
			stop := make(chan struct{})
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					start := time.Now()
					if _, err := writer.Publish(ctx, streams.RequestEvents("r-writer"), []byte("x")); err != nil {
						b.Error(err)
						return
					}
					lat = append(lat, time.Since(start))
				}
			})
			for b.Loop() {
				if err := l.get(); err != nil {
					b.Fatal(err)
				}
			}
			close(stop)
			wg.Wait()
			if len(lat) > 0 {
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "publish_p99_µs")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "publish_p50_µs")
			}
		})
	}
}
