package integration

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

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
