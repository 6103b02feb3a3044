package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/engine"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// loadReporter publishes the worker's load in the load bucket (run). Its
// notify is safe for concurrent use; run runs once, after kv is bound
// (Worker.open).
type loadReporter struct {
	id       string
	ttl      time.Duration // the lease's: the key's TTL; the load is read again every third of it
	interval time.Duration // Config.LoadInterval
	stats    func() engine.Stats
	busy     func() (bool, time.Time) // the upstream's (upstream.busy)
	js       jetstream.JetStream
	kv       jetstream.KeyValue
	log      *slog.Logger
	ch       chan struct{} // capacity 1: load changed, coalesced
}

func newLoadReporter(js jetstream.JetStream, eng engine.Engine, busy func() (bool, time.Time), log *slog.Logger, cfg Config) *loadReporter {
	return &loadReporter{id: cfg.ID, ttl: cfg.LeaseTTL, interval: cfg.LoadInterval, stats: eng.Stats,
		busy: busy, js: js, log: log, ch: make(chan struct{}, 1)}
}

// run publishes the engine's load when it changes, in a
// streams.Session with the lease's TTL that renews it, so a crashed worker's
// load disappears with its lease. A change in the number of active requests
// (one started or ended) is published at once, so that a finished request
// never shows as running for longer than a publish takes; the other figures
// (KV blocks, queued prefill tokens), which move with every token, at most
// once per LoadInterval. The load is read again every LeaseTTL/3 too, in case
// a change came without a notification. On return the session stops without
// deleting the key (shutdown deletes it).
func (r *loadReporter) run(ctx context.Context) {
	refresh := time.NewTicker(r.ttl / 3)
	defer refresh.Stop()
	hold := time.NewTimer(time.Hour)
	hold.Stop()
	defer hold.Stop()
	var holdC <-chan time.Time // set while a report waits for LoadInterval
	var s *streams.Session[events.Load]
	defer func() {
		if s != nil {
			s.Close()
		}
	}()
	var lastAt time.Time
	for {
		force := false
		select {
		case <-ctx.Done():
			return
		case <-r.ch:
		case <-holdC:
			holdC = nil
		case <-refresh.C:
			force = true
		}
		st := r.stats()
		l := events.Load{WorkerID: r.id, ActiveRequests: st.ActiveRequests, KVBlocksUsed: st.KVBlocksUsed,
			KVBlocksTotal: st.KVBlocksTotal, QueuedPrefillTokens: st.QueuedPrefillTokens}
		l.Busy, _ = r.busy()
		var last events.Load
		if s != nil {
			last = s.Value()
		}
		switch {
		case s == nil || l.ActiveRequests != last.ActiveRequests || l.Busy != last.Busy:
		case l == last:
			continue // the session renews it
		case !force && time.Since(lastAt) < r.interval:
			if holdC == nil {
				hold.Reset(r.interval - time.Since(lastAt))
				holdC = hold.C
			}
			continue
		}
		var err error
		if s == nil {
			s, err = r.start(ctx, l)
		} else {
			err = s.Update(func(v *events.Load) { *v = l })
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.log.Warn("report load", "err", err)
			if holdC == nil { // try again, even if nothing changes
				hold.Reset(r.interval)
				holdC = hold.C
			}
			continue
		}
		lastAt = time.Now()
	}
}

// start puts the first load report and starts renewing it.
func (r *loadReporter) start(ctx context.Context, l events.Load) (*streams.Session[events.Load], error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	return streams.NewSession(ctx, r.js, r.kv, r.id, l,
		streams.SessionConfig[events.Load]{TTL: r.ttl, Log: r.log})
}

// notify tells the load reporter that the load may have changed; it
// never blocks, notifications coalesce.
func (r *loadReporter) notify() {
	select {
	case r.ch <- struct{}{}:
	default:
	}
}
