package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

// Workers' output streams (docs/internals.md, "Where a worker's output
// lives"), with --batched-output only (Config.BatchedOutput):
//
//   - A worker asks streams.OutputsSubject(worker) before it listens for
//     dispatches; one frontend of the queue group answers, creates
//     BATON_OUT_<worker> with this frontend's limits if it does not exist,
//     or updates it to them (a restarted worker of the same id reuses its
//     stream), stamps the ask's time in its metadata, and replies.
//   - Every sweepEvery, each frontend lists the streams and notes when it
//     first saw each without a live lease of its worker (at start: the
//     stream's last write, ask or creation, the best it knows). The live
//     frontend that manages outputs and ranks first by rendezvous hashing
//     of the stream name deletes a stream once that time and its last ask
//     are both at least its MaxAge ago, so every attempt in it is closed.
//     At start a frontend deletes, whatever its rank, what has been idle
//     that long.
//
// The cost: one ask and one create (or update) per worker registration;
// one stream list per sweep per frontend; one delete per departed worker.

// outputs answers workers' asks for their output streams and deletes those
// of departed workers. Its methods run on the goroutines Runner.Start
// starts.
type outputs struct {
	id       string
	nc       *nats.Conn
	js       jetstream.JetStream
	log      *slog.Logger
	fleet    Fleet
	streams  streams.Config
	maxBytes int64
	maxAge   time.Duration
	now      func() time.Time

	mu      sync.Mutex
	noLease map[string]time.Time // worker → since when this frontend sees its stream without a lease
}

func newOutputs(rn *Runner) *outputs {
	return &outputs{id: rn.id, nc: rn.nc, js: rn.js, log: rn.log, fleet: rn.fleet, streams: rn.cfg.Streams,
		maxBytes: rn.cfg.WorkerOutputMaxBytes, maxAge: rn.cfg.WorkerOutputMaxAge, now: time.Now,
		noLease: map[string]time.Time{}}
}

// sweepEvery is how often a frontend looks for streams to delete: a
// quarter of their MaxAge, between 50 ms and 30 s, so a stream outlives its
// MaxAge by at most that.
func (o *outputs) sweepEvery() time.Duration {
	return min(max(o.maxAge/4, 50*time.Millisecond), 30*time.Second)
}

// start subscribes to the asks and starts the sweeps on g, until ctx is
// done.
func (o *outputs) start(ctx context.Context, g *errgroup.Group) error {
	sub, err := o.nc.QueueSubscribe(streams.OutputsSubjects, streams.CheckQueue, func(m *nats.Msg) {
		actx, cancel := context.WithTimeout(ctx, streams.DefaultTimeout)
		defer cancel()
		data, _ := json.Marshal(o.answer(actx, m.Subject))
		_ = m.Respond(data)
	})
	if err != nil {
		return fmt.Errorf("subscribe to output asks: %w", err)
	}
	g.Go(func() error {
		<-ctx.Done()
		_ = sub.Unsubscribe()
		return nil
	})
	g.Go(func() error {
		o.sweepLoop(ctx)
		return nil
	})
	return nil
}

// answer creates (or updates) the output stream of the worker subject
// names, with this frontend's limits.
func (o *outputs) answer(ctx context.Context, subject string) streams.OutputsReply {
	worker, err := streams.OutputsWorker(subject)
	if err != nil {
		return streams.OutputsReply{Error: err.Error()}
	}
	sc := o.streams.WorkerOutputConfig(worker, o.maxBytes, o.maxAge, o.now())
	used, err := streams.EnsureWorkerOutputUsed(ctx, o.js, sc)
	if err != nil {
		o.log.Warn("create a worker's output stream", "worker_id", worker, "err", err)
		return streams.OutputsReply{Error: err.Error()}
	}
	o.log.Debug("worker output stream ready", "worker_id", worker, "stream", sc.Name, "max_bytes", sc.MaxBytes, "used", used)
	return streams.OutputsReply{Stream: sc.Name, MaxBytes: sc.MaxBytes, Used: used}
}

// sweepLoop sweeps at start and every sweepEvery until ctx is done.
func (o *outputs) sweepLoop(ctx context.Context) {
	atStart := true
	for {
		sctx, cancel := context.WithTimeout(ctx, streams.DefaultTimeout)
		err := o.sweep(sctx, atStart)
		cancel()
		if err != nil && ctx.Err() == nil {
			o.log.Warn("sweep workers' output streams", "err", err)
		} else if err == nil {
			atStart = false
		}
		if !streams.Sleep(ctx, o.sweepEvery()) {
			return
		}
	}
}

// sweep deletes the output streams whose workers' leases have been gone for
// their MaxAge, where this frontend's turn has come (see outputs).
func (o *outputs) sweep(ctx context.Context, atStart bool) error {
	list, err := streams.WorkerOutputs(ctx, o.js)
	if err != nil {
		return err
	}
	now := o.now()
	live := o.managers()
	seen := map[string]bool{}
	var del []string
	o.mu.Lock()
	for _, s := range list {
		seen[s.Worker] = true
		if _, ok := o.fleet.Worker(s.Worker); ok {
			delete(o.noLease, s.Worker)
			continue
		}
		since, ok := o.noLease[s.Worker]
		if !ok {
			since = now
			if atStart {
				since = s.Idle()
			}
			o.noLease[s.Worker] = since
		}
		maxAge := s.MaxAge
		if maxAge <= 0 {
			maxAge = o.maxAge
		}
		gone := now.Sub(since) >= maxAge && now.Sub(s.Asked) >= maxAge
		first := rendezvousRank(streams.WorkerOutputStream(s.Worker), o.id, live) == 0
		if gone && (first || (atStart && now.Sub(s.Idle()) >= maxAge)) {
			del = append(del, s.Worker)
		}
	}
	for w := range o.noLease {
		if !seen[w] {
			delete(o.noLease, w) // deleted (by whoever)
		}
	}
	o.mu.Unlock()
	for _, w := range del {
		if err := o.delete(ctx, w); err != nil {
			return err
		}
	}
	return nil
}

// delete deletes worker's output stream unless, read again, its worker
// asked for it within its MaxAge or holds a lease again.
func (o *outputs) delete(ctx context.Context, worker string) error {
	info, ok, err := streams.LookupWorkerOutput(ctx, o.js, worker)
	if err != nil || !ok {
		return err
	}
	maxAge := info.MaxAge
	if maxAge <= 0 {
		maxAge = o.maxAge
	}
	if o.now().Sub(info.Asked) < maxAge {
		return nil
	}
	if _, live := o.fleet.Worker(worker); live {
		return nil
	}
	if err := streams.DeleteWorkerOutput(ctx, o.js, worker); err != nil {
		return err
	}
	o.mu.Lock()
	delete(o.noLease, worker)
	o.mu.Unlock()
	o.log.Info("deleted a departed worker's output stream", "worker_id", worker, "stream", streams.WorkerOutputStream(worker),
		"idle_since", info.Idle())
	return nil
}

// managers are the live frontends that manage outputs, this one included.
func (o *outputs) managers() []string {
	ids := []string{o.id}
	for _, f := range o.fleet.Frontends() {
		if f.ManagesOutputs && f.FrontendID != o.id {
			ids = append(ids, f.FrontendID)
		}
	}
	return ids
}
