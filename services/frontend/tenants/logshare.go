package tenants

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/internal/every"
	"github.com/baton-dev/baton/migrations"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/services/quota"
)

// A tenant's share of the request log (log=F in the budgets file). Each
// frontend accounts, per tenant with a share, the bytes of the requests it
// accepted, estimated from their projections (no read of the log), and
// shares its totals through the budgets bucket (quota.LogShares); a
// tenant's bytes are the sum of every frontend's. A tenant at F × the
// high-water mark of the log's bytes gets 503 log_full for its new
// requests; above F × the eviction mark its oldest finished requests are
// evicted, as the whole log's are above its own mark. docs/security.md
// gives the estimate's error.

// The estimate of a request's bytes, from BENCHMARKS.md's log footprint:
// a finished request is its compact record (about 1.5 KB, plus its body)
// and 17 B a token; one in flight holds every delta, up to 345 B a token at
// decode rates (35 B at full speed, where deltas coalesce).
const (
	shareRequestBytes       = 1536
	shareTokenBytes         = 17
	shareTokenBytesInFlight = 345
	// shareChecks bounds the finished requests whose presence in the log
	// one tick verifies (one get each), least lately verified first;
	// requests of a tenant below half its share are not verified.
	shareChecks = 64
	// shareRecheck is how long a finished request's presence goes
	// unverified at most (it may have aged out), when its tenant is below
	// half its share.
	shareRecheck = time.Minute
)

// logLedger is this frontend's account of the requests it accepted for
// tenants with a share of the log. It is safe for concurrent use.
type logLedger struct {
	g      *Gate
	shares *quota.LogShares

	mu      sync.Mutex
	entries map[string]*logEntry // by request id
	totals  map[string]int64     // by tenant: the sum of its entries' bytes
	over    []string             // tenants above their share's eviction mark, as of the last tick
}

type logEntry struct {
	tenant  string
	base    int64 // its compact record without tokens, about
	tokens  int   // as of the last time it was followed here
	bytes   int64
	done    bool      // no longer followed here: its estimate is final
	checked time.Time // when its presence in the log was last verified
}

// startLogShares starts the ledger when a budgets file is given (a reload
// may give a tenant a share); Start runs the returned function until the end
// of the shutdown.
func (g *Gate) startLogShares(ctx context.Context) (run func(context.Context) error, err error) {
	if g.cfg.BudgetsFile == "" {
		return nil, nil
	}
	kv, err := g.bucket(ctx)
	if err != nil {
		return nil, err
	}
	s, err := quota.NewLogShares(kv, g.Log, g.ID, 0)
	if err != nil {
		return nil, err
	}
	l := &logLedger{g: g, shares: s, entries: map[string]*logEntry{}, totals: map[string]int64{}}
	g.Runtime.SetOverShare(l.overShare)
	g.ledger = l
	return func(ctx context.Context) error {
		go every.Tick(ctx, quota.DefaultShareInterval, func() { l.tick(ctx) })
		return s.Run(ctx)
	}, nil
}

// allowance is tenant's share of the log in bytes at mark (a fraction of
// the log's capacity), or 0 when it has no share or the log no limit.
func (g *Gate) allowance(b quota.Budget, mark float64) int64 {
	if b.Log <= 0 {
		return 0
	}
	capacity, _ := g.Runtime.LogCapacity()
	return int64(b.Log * mark * float64(capacity))
}

// add accounts request acc, just accepted, if its tenant has a share.
func (l *logLedger) add(acc events.RequestAccepted) {
	if l == nil || acc.Tenant == "" {
		return
	}
	if l.g.budget(acc.Tenant).Log <= 0 {
		return
	}
	base := int64(shareRequestBytes + len(acc.Body))
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.entries[acc.RequestID]; ok {
		return
	}
	l.entries[acc.RequestID] = &logEntry{tenant: acc.Tenant, base: base, bytes: base, checked: time.Now()}
	l.totals[acc.Tenant] += base
	l.shares.Set(l.totals)
}

// observe takes the token counts of requests ts, which the caller still
// holds, for their entries: a request that ends between two ticks is
// counted with its tokens.
func (l *logLedger) observe(ts ...*runner.Request) {
	if l == nil {
		return
	}
	for _, t := range ts {
		var tokens int
		var terminal bool
		t.View(func(p *projections.Request) { tokens, terminal = p.Len(), p.Status.Terminal() })
		l.mu.Lock()
		if e, ok := l.entries[t.ID()]; ok && !e.done {
			e.tokens = tokens
			per := int64(shareTokenBytesInFlight)
			if terminal {
				per = shareTokenBytes
			}
			e.bytes = e.base + int64(tokens)*per
		}
		l.mu.Unlock()
	}
}

// tick brings the entries' estimates up to date, drops those the log no
// longer holds, and publishes the totals.
func (l *logLedger) tick(ctx context.Context) {
	l.mu.Lock()
	ids := make([]string, 0, len(l.entries))
	for id, e := range l.entries {
		if !e.done {
			ids = append(ids, id)
		}
	}
	l.mu.Unlock()
	for _, id := range ids { // no lock held while the projection is read
		var tokens int
		var terminal bool
		followed := l.g.Runtime.Peek(id, func(p *projections.Request) {
			tokens, terminal = p.Len(), p.Status.Terminal()
		})
		l.mu.Lock()
		if e, ok := l.entries[id]; ok {
			if followed {
				e.tokens = tokens
			}
			per := int64(shareTokenBytesInFlight)
			if terminal || !followed {
				per = shareTokenBytes // compacted, or as good as: it is no longer followed here
			}
			e.bytes = e.base + int64(e.tokens)*per
			e.done = !followed
		}
		l.mu.Unlock()
	}
	l.verify(ctx)
	l.mu.Lock()
	totals := map[string]int64{}
	for _, e := range l.entries {
		totals[e.tenant] += e.bytes
	}
	l.totals = totals
	l.shares.Set(totals)
	l.mu.Unlock()
	var over []string
	for t := range totals {
		if a := l.g.allowance(l.g.budget(t), l.g.Runtime.EvictAt()); a > 0 && l.shares.Bytes(t) >= a {
			over = append(over, t)
		}
	}
	slices.Sort(over)
	l.mu.Lock()
	l.over = over
	l.mu.Unlock()
}

// verify drops the finished entries the log no longer holds (evicted by
// any frontend, or aged out): up to shareChecks of them, least lately
// verified first, of tenants at half their share or more, or verified
// over shareRecheck ago. It drops the entries of tenants without a share.
func (l *logLedger) verify(ctx context.Context) {
	type cand struct {
		id string
		at time.Time
	}
	var cands []cand
	l.mu.Lock()
	for id, e := range l.entries {
		a := l.g.allowance(l.g.budget(e.tenant), 1)
		switch {
		case a <= 0: // its share was reloaded away: no longer accounted
			l.totals[e.tenant] -= e.bytes
			delete(l.entries, id)
		case e.done && (2*l.shares.Bytes(e.tenant) >= a || time.Since(e.checked) > shareRecheck):
			cands = append(cands, cand{id, e.checked})
		}
	}
	l.mu.Unlock()
	slices.SortFunc(cands, func(a, b cand) int { return a.at.Compare(b.at) })
	for _, c := range cands[:min(len(cands), shareChecks)] {
		stored, err := l.g.Runtime.Stored(ctx, c.id)
		if err != nil {
			return // the next tick tries again
		}
		l.mu.Lock()
		if e, ok := l.entries[c.id]; ok {
			if stored {
				e.checked = time.Now()
			} else {
				delete(l.entries, c.id)
			}
		}
		l.mu.Unlock()
	}
}

// overShare lists the tenants above their share's eviction mark
// (retention.Monitor.SetOverShare).
func (l *logLedger) overShare() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.over)
}

// AdmitLogShare refuses a new request of tenant while it stores its
// share of the log at the high-water mark or more: 503 log_full, with
// Retry-After, as for a full log.
func (g *Gate) AdmitLogShare(tenant string) *Refusal {
	if g.ledger == nil || tenant == "" {
		return nil
	}
	b := g.budget(tenant)
	_, hw := g.Runtime.LogCapacity()
	a := g.allowance(b, hw)
	if a <= 0 {
		return nil
	}
	if n := g.ledger.shares.Bytes(tenant); n >= a {
		g.series.throttle(tenant, throttleLogShare)
		return &Refusal{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: migrations.CodeLogFull,
			Message: fmt.Sprintf("tenant %s stores about %d bytes of the request log, its share (log=%g of the log below its high-water mark) is %d: its new requests are refused until its finished requests are evicted",
				tenant, n, b.Log, a)}
	}
	return nil
}

// logBytes is tenant's bytes in the log as every frontend accounts them,
// and its share's high-water mark in bytes; 0, 0 without a share.
func (g *Gate) logBytes(tenant string) (bytes, allowance int64) {
	if g.ledger == nil {
		return 0, 0
	}
	_, hw := g.Runtime.LogCapacity()
	a := g.allowance(g.budget(tenant), hw)
	if a <= 0 {
		return 0, 0
	}
	return g.ledger.shares.Bytes(tenant), a
}
