package quota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// fairPrefix starts the keys of the frontends' fair-admission counters.
const fairPrefix = "vtc."

// Timings of FairShare's writes: at most one every FairInterval, at least
// one every fairHeartbeat while requests are queued here (so that the
// others know the queue is live: they take it for gone after FairStale),
// and at least one every fairIdle otherwise (the bucket's keys expire after
// streams.BudgetsTTL without a write).
const (
	FairInterval  = 100 * time.Millisecond
	fairHeartbeat = time.Second
	FairStale     = 3 * fairHeartbeat
	fairIdle      = time.Minute
)

// FairShare carries a Fair's counters through the budgets bucket: it
// writes this frontend's key (vtc.<frontend>) at most every FairInterval
// when it changed, and applies the others' as they come.
type FairShare struct {
	kv      jetstream.KeyValue
	fair    *Fair
	self    string
	log     *slog.Logger
	timeout time.Duration
}

// NewFairShare returns the carrier of fair for frontend self on the budgets
// bucket kv.
func NewFairShare(kv jetstream.KeyValue, fair *Fair, self string, log *slog.Logger) *FairShare {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &FairShare{kv: kv, fair: fair, self: self, log: log, timeout: DefaultTimeout}
}

// Run watches the other frontends' keys and writes this one's until ctx is
// done, then returns nil (its key stays: the service it counts is part of
// its tenants' counters, and it expires with the bucket's TTL). A non-nil
// error means the watch could not start.
func (s *FairShare) Run(ctx context.Context) error {
	gctx, cancel := context.WithTimeout(ctx, s.timeout)
	if e, err := s.kv.Get(gctx, fairPrefix+s.self); err == nil {
		s.fair.Seed(e.Value())
	}
	cancel()
	w, err := s.kv.Watch(ctx, fairPrefix+"*")
	if err != nil {
		return fmt.Errorf("quota: watch the fair-admission counters: %w", err)
	}
	defer func() { _ = w.Stop() }()
	tick := time.NewTicker(FairInterval)
	defer tick.Stop()
	var wrote uint64
	var wroteAt time.Time
	initial := true // the keys that existed at start: their age is the server's word
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			data, version, queued := s.fair.Own()
			every := fairIdle
			if queued {
				every = fairHeartbeat
			}
			if version == wrote && time.Since(wroteAt) < every {
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, s.timeout)
			_, err := s.kv.Put(pctx, fairPrefix+s.self, data)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					s.log.Warn("publish the fair-admission counters", "err", err)
				}
				continue
			}
			wrote, wroteAt = version, time.Now()
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return nil // the watch ends with ctx too, and select may see it first
				}
				return errors.New("quota: the watch of the fair-admission counters ended")
			}
			if e == nil {
				initial = false // the end of what existed at start
				continue
			}
			id := strings.TrimPrefix(e.Key(), fairPrefix)
			if e.Operation() == jetstream.KeyValuePut {
				// A live update is as fresh as its arrival (no clock is
				// compared); a key found at start is as old as the server
				// says, so that a frontend gone with requests queued does
				// not hold the others back.
				at := time.Now()
				if initial && e.Created().Before(at) {
					at = e.Created()
				}
				s.fair.Apply(at, id, e.Value())
			} else {
				s.fair.Forget(id)
			}
		}
	}
}
