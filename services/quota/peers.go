package quota

import (
	"context"
	"errors"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// hashPrefix starts the keys of the frontends' budgets hashes.
const hashPrefix = "fe."

// republish is how often a frontend writes its budgets hash again, and
// peerAge how old another's may be before it is taken for a frontend
// that is gone.
const (
	republish = 30 * time.Second
	peerAge   = 3 * republish
)

// Run publishes this frontend's budgets hash (at start, on SetBudgets and
// every 30 s) and watches the other frontends', until ctx is done; then it
// returns its leases and deletes its hash. It returns nil then, or the
// error that stopped the watch from starting.
func (l *Limiter) Run(ctx context.Context) error {
	w, err := l.kv.Watch(ctx, hashPrefix+"*")
	if err != nil {
		return errors.Join(errors.New("quota: watch the budgets hashes"), err)
	}
	defer func() { _ = w.Stop() }()
	l.publish(ctx)
	tick := time.NewTicker(republish)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			l.close()
			return nil
		case <-tick.C:
			l.publish(ctx)
			l.compare()
		case <-l.kick:
			l.publish(ctx)
			l.compare()
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil { // the watch ends with ctx too, and select may see it first
					l.close()
					return nil
				}
				return errors.New("quota: the watch of the frontends' budgets hashes ended")
			}
			if e == nil {
				continue // the end of what existed at start
			}
			id := strings.TrimPrefix(e.Key(), hashPrefix)
			l.mu.Lock()
			if e.Operation() == jetstream.KeyValuePut {
				l.peers[id] = peer{hash: string(e.Value()), at: e.Created()}
			} else {
				delete(l.peers, id)
			}
			l.mu.Unlock()
			l.compare()
		}
	}
}

func (l *Limiter) publish(ctx context.Context) {
	l.mu.Lock()
	h := l.budgets.Hash()
	l.mu.Unlock()
	pctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	if _, err := l.kv.Put(pctx, hashPrefix+l.cfg.Frontend, []byte(h)); err != nil && ctx.Err() == nil {
		l.log.Warn("publish the budgets hash", "err", err)
	}
}

// Hash is the hash of the budgets in use (Budgets.Hash).
func (l *Limiter) Hash() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.budgets.Hash()
}

// Differ lists the live frontends whose budgets differ from this one's
// (their hash is not its hash), sorted; empty when all agree.
func (l *Limiter) Differ() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.differ)
}

// compare recomputes Differ and logs when it changed.
func (l *Limiter) compare() {
	now := l.cfg.Now()
	l.mu.Lock()
	mine := l.budgets.Hash()
	var differ []string
	for id, p := range l.peers {
		if id != l.cfg.Frontend && p.hash != mine && now.Sub(p.at) < peerAge {
			differ = append(differ, id)
		}
	}
	sort.Strings(differ)
	changed := !slices.Equal(differ, l.differ)
	l.differ = differ
	l.mu.Unlock()
	switch {
	case changed && len(differ) > 0:
		l.log.Warn("tenant budgets differ from other frontends': give every frontend the same budgets file and flags",
			"budgets_hash", mine, "frontends", differ)
	case changed:
		l.log.Info("tenant budgets agree with every other frontend's", "budgets_hash", mine)
	}
}

// close returns every lease held and deletes this frontend's hash, within
// the timeout.
func (l *Limiter) close() {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.Timeout)
	defer cancel()
	l.mu.Lock()
	l.closed = true
	tenants := make([]string, 0, len(l.tenants))
	for t, h := range l.tenants {
		tenants = append(tenants, t)
		if h.timer != nil {
			h.timer.Stop()
		}
	}
	l.mu.Unlock()
	for _, t := range tenants {
		if err := l.giveBack(ctx, t); err != nil {
			l.log.Warn("return a lease of budget at shutdown: it ends by itself", "tenant", t, "err", err)
		}
	}
	if err := l.kv.Delete(ctx, hashPrefix+l.cfg.Frontend); err != nil {
		l.log.Warn("delete the budgets hash", "err", err)
	}
}
