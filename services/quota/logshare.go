package quota

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// logPrefix starts the keys of the frontends' per-tenant log bytes.
const logPrefix = "log."

// DefaultShareInterval is how often a LogShares writes its totals when
// they changed.
const DefaultShareInterval = 500 * time.Millisecond

// LogShares adds up the bytes each tenant stores in the request log, as
// every frontend accounts them for the requests it accepted, in the
// budgets bucket: one key per frontend (log.<frontend>, a JSON object of
// tenant to bytes), written every Interval when it changed (and every 30 s
// anyway, within the bucket's TTL), watched by every frontend. A frontend
// that stops deletes its key; one killed leaves it until the bucket's TTL
// (streams.BudgetsTTL) ends it. It is safe for concurrent use.
type LogShares struct {
	kv       jetstream.KeyValue
	frontend string
	interval time.Duration
	log      *slog.Logger

	mu     sync.Mutex
	mine   map[string]int64            // this frontend's totals, by tenant
	dirty  bool                        // mine changed since it was written
	others map[string]map[string]int64 // the other frontends' totals, by frontend
}

// NewLogShares returns the LogShares of frontend on the budgets bucket kv;
// interval 0 means DefaultShareInterval.
func NewLogShares(kv jetstream.KeyValue, log *slog.Logger, frontend string, interval time.Duration) (*LogShares, error) {
	if frontend == "" {
		return nil, errors.New("quota: log shares: a frontend id is required")
	}
	if interval <= 0 {
		interval = DefaultShareInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &LogShares{kv: kv, frontend: frontend, interval: interval, log: log,
		mine: map[string]int64{}, others: map[string]map[string]int64{}}, nil
}

// Set replaces this frontend's totals (tenants with no bytes may be left out).
func (s *LogShares) Set(totals map[string]int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !maps.Equal(s.mine, totals) {
		s.mine, s.dirty = maps.Clone(totals), true
	}
}

// Bytes is tenant's bytes in the log: this frontend's count and the last
// ones the others wrote.
func (s *LogShares) Bytes(tenant string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.mine[tenant]
	for _, o := range s.others {
		n += o[tenant]
	}
	return n
}

// Run writes this frontend's totals and watches the others' until ctx is
// done; then it deletes its key and returns nil. An error means the watch
// could not start, or ended before ctx did.
func (s *LogShares) Run(ctx context.Context) error {
	w, err := s.kv.Watch(ctx, logPrefix+"*")
	if err != nil {
		return errors.Join(errors.New("quota: watch the tenants' log bytes"), err)
	}
	defer func() { _ = w.Stop() }()
	tick := time.NewTicker(s.interval)
	defer tick.Stop()
	var wrote time.Time
	for {
		select {
		case <-ctx.Done():
			s.leave(ctx)
			return nil
		case <-tick.C:
			s.mu.Lock()
			dirty, data := s.dirty, s.mine
			s.dirty = false
			s.mu.Unlock()
			if !dirty && time.Since(wrote) < republish {
				continue
			}
			b, _ := json.Marshal(data)
			pctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
			_, err := s.kv.Put(pctx, logPrefix+s.frontend, b)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					s.log.Warn("write this frontend's log bytes", "err", err)
				}
				s.mu.Lock()
				s.dirty = true
				s.mu.Unlock()
				continue
			}
			wrote = time.Now()
		case e, ok := <-w.Updates():
			if !ok {
				// The watch ends with ctx too, and select may see it first.
				if ctx.Err() != nil {
					s.leave(ctx)
					return nil
				}
				return errors.New("quota: the watch of the tenants' log bytes ended")
			}
			if e == nil {
				continue
			}
			id := strings.TrimPrefix(e.Key(), logPrefix)
			if id == s.frontend {
				continue
			}
			var m map[string]int64
			if e.Operation() == jetstream.KeyValuePut {
				if err := json.Unmarshal(e.Value(), &m); err != nil {
					s.log.Warn("a frontend's log bytes do not parse: left out", "frontend", id, "err", err)
				}
			}
			s.mu.Lock()
			if m == nil {
				delete(s.others, id)
			} else {
				s.others[id] = m
			}
			s.mu.Unlock()
		}
	}
}

// leave deletes this frontend's key as Run ends with ctx.
func (s *LogShares) leave(ctx context.Context) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultTimeout)
	defer cancel()
	if err := s.kv.Delete(dctx, logPrefix+s.frontend); err != nil {
		s.log.Warn("delete this frontend's log bytes: the bucket's TTL ends them", "err", err)
	}
}
