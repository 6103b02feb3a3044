package quota

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Config configures a Limiter. Zero values mean the documented defaults.
type Config struct {
	// Frontend names this frontend in the leases it holds and the budgets
	// hash it publishes; required.
	Frontend string
	// Lease is how long a frontend holds a slice of a tenant's budget
	// before it returns what is left; default 2s. A frontend that dies
	// holding one loses it for at most this long.
	Lease time.Duration
	// Timeout bounds each call to the bucket; default 2s. A bucket that
	// does not answer within it fails the check (the edge answers 503).
	Timeout time.Duration
	// Now is the clock; default time.Now (tests set their own).
	Now func() time.Time
}

// Defaults of Config.
const (
	DefaultLease   = 2 * time.Second
	DefaultTimeout = 2 * time.Second
)

func (c Config) withDefaults() Config {
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// OverError is a check refused because the tenant is over its budget.
type OverError struct {
	Resource   string        // "requests" or "tokens"
	Limit      int64         // the budget per minute
	RetryAfter time.Duration // until the budget holds what the request needs
	TooLarge   bool          // the request alone needs more than the budget's burst
	Need       int64
}

func (e *OverError) Error() string {
	if e.TooLarge {
		return fmt.Sprintf("Request too large: it reserves %d tokens (prompt plus max tokens), more than the %d a tenant with %d tokens per minute may reserve at once; lower max_tokens",
			e.Need, int64(shapeOf(e.Limit).burst), e.Limit)
	}
	return fmt.Sprintf("Rate limit reached: %d %s per minute for this API key, please retry after %v",
		e.Limit, e.Resource, e.RetryAfter.Round(time.Millisecond))
}

// Window is one budget's state for OpenAI's x-ratelimit-* headers.
type Window struct {
	Limit     int64         // per minute; 0: no such budget
	Remaining int64         // what could be admitted now (this frontend's view)
	Reset     time.Duration // until the budget is full again
}

// Status is a tenant's budgets as headers show them.
type Status struct{ Requests, Tokens Window }

// Grant is what an admitted request took; Release gives back the tokens it
// did not use. The zero Grant (a tenant without budgets) releases nothing.
type Grant struct {
	l      *Limiter
	tenant string
	tokens int64
}

// Release gives back what the request reserved beyond used tokens (its
// prompt and completion). It is safe to call once.
func (g Grant) Release(used int64) {
	if g.l == nil || used >= g.tokens {
		return
	}
	g.l.refund(g.tenant, float64(g.tokens-used))
}

// Limiter checks requests against tenants' shared budgets. Create it with
// New, run it with Run (the budgets hash and the watch of the others');
// Close returns its leases.
type Limiter struct {
	kv  jetstream.KeyValue
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	budgets Budgets
	tenants map[string]*held // bounded by the tenants with budgets that sent requests
	peers   map[string]peer  // other frontends' budgets hashes, by frontend id
	differ  []string         // frontends whose hash is not ours, as last logged
	closed  bool             // Run ended: no lease timer is set again
	kick    chan struct{}    // capacity 1: publish the hash now
}

// held is what this frontend holds of one tenant's budget.
type held struct {
	cas   sync.Mutex // one compare-and-set of the tenant's key at a time
	req   float64    // left of the lease (guarded by Limiter.mu, as the rest)
	tok   float64
	exp   time.Time
	timer *time.Timer
	seen  state // the key as of the last compare-and-set

	failed   error     // the last take's failure to reach the bucket (guarded by cas)
	failedAt time.Time // when
}

type peer struct {
	hash string
	at   time.Time
}

// New returns a Limiter on the budgets bucket kv (streams.BudgetsBucket).
func New(kv jetstream.KeyValue, log *slog.Logger, budgets Budgets, cfg Config) (*Limiter, error) {
	if cfg.Frontend == "" {
		return nil, errors.New("quota: config: a frontend id is required")
	}
	if cfg.Lease < 0 || cfg.Timeout < 0 {
		return nil, errors.New("quota: config: lease and timeout must not be negative")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Limiter{kv: kv, cfg: cfg.withDefaults(), log: log, budgets: budgets,
		tenants: map[string]*held{}, peers: map[string]peer{}, kick: make(chan struct{}, 1)}, nil
}

// SetBudgets replaces the budgets (a reload); leases held stay until they end.
func (l *Limiter) SetBudgets(b Budgets) {
	l.mu.Lock()
	l.budgets = b
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Budget is tenant's budget as this frontend's file says.
func (l *Limiter) Budget(tenant string) Budget {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.budgets.For(tenant)
}

func tenantKey(tenant string) string {
	if tenant == "" {
		return "open" // the open API's one tenant; no tenant key lacks the "t." prefix
	}
	return "t." + tenant
}

// Acquire admits one request of tenant reserving tokens (its prompt plus
// its max tokens), or refuses it with an *OverError. Any other error means
// the bucket could not be reached. A tenant without per-minute budgets is
// admitted with no call at all.
func (l *Limiter) Acquire(ctx context.Context, tenant string, tokens int64) (Grant, Status, error) {
	l.mu.Lock()
	b := l.budgets.For(tenant)
	l.mu.Unlock()
	rs, ts := shapeOf(b.RPM), shapeOf(b.TPM)
	if !rs.on() && !ts.on() {
		return Grant{}, Status{}, nil
	}
	var needReq, needTok float64
	if rs.on() {
		needReq = 1
	}
	if ts.on() {
		needTok = float64(max(tokens, 0))
		if needTok > ts.burst {
			return Grant{}, l.status(tenant, rs, ts), &OverError{Resource: "tokens", Limit: b.TPM, TooLarge: true, Need: tokens}
		}
	}
	g := Grant{l: l, tenant: tenant, tokens: int64(needTok)}
	h := l.holder(tenant)
	if l.spend(h, needReq, needTok) {
		return g, l.status(tenant, rs, ts), nil
	}
	h.cas.Lock()
	defer h.cas.Unlock()
	if l.spend(h, needReq, needTok) { // another request's take covered this one too
		return g, l.status(tenant, rs, ts), nil
	}
	// Requests that queued behind a take that could not reach the bucket
	// fail at once rather than each after its own timeout.
	if h.failed != nil && l.cfg.Now().Sub(h.failedAt) < l.cfg.Timeout/2 {
		return Grant{}, l.status(tenant, rs, ts), h.failed
	}
	if err := l.take(ctx, tenant, h, rs, ts, needReq, needTok, b); err != nil {
		var over *OverError
		if !errors.As(err, &over) {
			h.failed, h.failedAt = err, l.cfg.Now()
		}
		return Grant{}, l.status(tenant, rs, ts), err
	}
	h.failed = nil
	return g, l.status(tenant, rs, ts), nil
}

func (l *Limiter) holder(tenant string) *held {
	l.mu.Lock()
	defer l.mu.Unlock()
	return entry(l.tenants, tenant)
}

// margin is how long before its end a lease stops being spent, for clocks
// that disagree a little and the time a return takes.
func (l *Limiter) margin() time.Duration { return l.cfg.Lease / 10 }

// spend takes what a request needs from the lease held, if it is live and
// covers it.
func (l *Limiter) spend(h *held, req, tok float64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.cfg.Now().Before(h.exp.Add(-l.margin())) || h.req < req || h.tok < tok {
		return false
	}
	h.req -= req
	h.tok -= tok
	return true
}

// take returns what is left of this frontend's lease of tenant's budget and
// takes a new one covering need (plus a chunk), with one compare-and-set
// of the tenant's key (retried on a conflict). The caller holds h.cas.
func (l *Limiter) take(ctx context.Context, tenant string, h *held, rs, ts shape, needReq, needTok float64, b Budget) error {
	key := tenantKey(tenant)
	// What is left of the lease is taken out of it first, so that no
	// request spends it while it goes back to the key; a take that fails
	// loses it (counted as spent until the lease ends: the safe side).
	l.mu.Lock()
	leftReq, leftTok, oldExp := h.req, h.tok, h.exp
	h.req, h.tok, h.exp = 0, 0, time.Time{}
	l.mu.Unlock()
	for try := range casTries {
		now := l.cfg.Now()
		s, rev, err := l.get(ctx, key, now, rs, ts)
		if err != nil {
			return err
		}
		s.refill(now, rs, ts, l.cfg.Frontend)
		others := s.othersHeld(now, l.cfg.Frontend)
		s.Req = math.Min(rs.burst-others.Req, s.Req+leftReq)
		s.Tok = math.Min(ts.burst-others.Tok, s.Tok+leftTok)
		if s.Req < needReq || s.Tok < needTok {
			over := &OverError{Resource: "requests", Limit: b.RPM, RetryAfter: rs.wait(needReq - s.Req)}
			if tw := ts.wait(needTok - s.Tok); tw > over.RetryAfter || s.Req >= needReq {
				over = &OverError{Resource: "tokens", Limit: b.TPM, RetryAfter: tw}
			}
			l.mu.Lock()
			s.Req, s.Tok = math.Max(0, s.Req-leftReq), math.Max(0, s.Tok-leftTok) // the key without what stays held here
			h.seen = s
			h.req, h.tok, h.exp = h.req+leftReq, h.tok+leftTok, oldExp // nothing was written: the lease stays
			l.mu.Unlock()
			return over
		}
		var gotReq, gotTok float64
		if rs.on() {
			gotReq = math.Min(s.Req, math.Max(needReq, rs.chunk()))
		}
		if ts.on() {
			gotTok = math.Min(s.Tok, math.Max(needTok, ts.chunk()))
		}
		s.Req -= gotReq
		s.Tok -= gotTok
		exp := now.Add(l.cfg.Lease)
		if s.Leases == nil {
			s.Leases = map[string]lease{}
		}
		s.Leases[l.cfg.Frontend] = lease{Req: gotReq, Tok: gotTok, Exp: exp.UnixNano()}
		switch err := l.put(ctx, key, s, rev); {
		case errors.Is(err, jetstream.ErrKeyExists), isWrongSequence(err):
			backOff(try)
			continue // another frontend wrote first: read again
		case err != nil:
			return err
		}
		l.mu.Lock()
		// Refunds that came meanwhile (h.tok grew) are kept.
		h.req += gotReq - needReq
		h.tok += gotTok - needTok
		h.exp = exp
		h.seen = s
		if h.timer != nil {
			h.timer.Stop()
		}
		if !l.closed {
			h.timer = time.AfterFunc(max(0, l.cfg.Lease-l.margin()), func() { l.returnLease(tenant) })
		}
		l.mu.Unlock()
		return nil
	}
	return fmt.Errorf("quota: take from %s: too many concurrent writers", key)
}

func (s state) othersHeld(now time.Time, self string) (sum lease) {
	for id, ls := range s.Leases {
		if id != self && ls.Exp > now.UnixNano() {
			sum.Req += ls.Req
			sum.Tok += ls.Tok
		}
	}
	return sum
}

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// get reads tenant's key; a key that does not exist is full (rev 0).
func (l *Limiter) get(ctx context.Context, key string, now time.Time, rs, ts shape) (state, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	e, err := l.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return fullState(now, rs, ts), 0, nil
	}
	if err != nil {
		return state{}, 0, fmt.Errorf("quota: read %s: %w", key, err)
	}
	var s state
	if err := json.Unmarshal(e.Value(), &s); err != nil {
		l.log.Warn("a budget key that does not parse is taken as full", "key", key, "err", err)
		return fullState(now, rs, ts), e.Revision(), nil
	}
	return s, e.Revision(), nil
}

// put writes s as revision rev+1 of key (created when rev is 0).
func (l *Limiter) put(ctx context.Context, key string, s state, rev uint64) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if rev == 0 {
		_, err = l.kv.Create(ctx, key, data)
	} else {
		_, err = l.kv.Update(ctx, key, data, rev)
	}
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSequence(err) {
		return fmt.Errorf("quota: write %s: %w", key, err)
	}
	return err
}

// refund gives tokens back to this frontend's slice of tenant's budget: a
// live lease spends them again, and the next take or return hands them
// back to the key.
func (l *Limiter) refund(tenant string, tokens float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h, ok := l.tenants[tenant]; ok {
		h.tok += tokens
	}
}

// returnLease hands what is left of this frontend's lease of tenant's
// budget back to the key, when the lease is about to end.
func (l *Limiter) returnLease(tenant string) {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.Timeout)
	defer cancel()
	if err := l.giveBack(ctx, tenant); err != nil {
		l.log.Warn("return a lease of budget: it ends by itself", "tenant", tenant, "err", err)
	}
}

func (l *Limiter) giveBack(ctx context.Context, tenant string) error {
	h := l.holder(tenant)
	h.cas.Lock()
	defer h.cas.Unlock()
	l.mu.Lock()
	b := l.budgets.For(tenant)
	leftReq, leftTok := h.req, h.tok
	h.req, h.tok, h.exp = 0, 0, time.Time{} // out of the lease first, as in take
	if h.timer != nil {
		h.timer.Stop()
	}
	l.mu.Unlock()
	rs, ts := shapeOf(b.RPM), shapeOf(b.TPM)
	key := tenantKey(tenant)
	for try := range casTries {
		now := l.cfg.Now()
		s, rev, err := l.get(ctx, key, now, rs, ts)
		if err != nil {
			return err
		}
		if _, ok := s.Leases[l.cfg.Frontend]; !ok && leftReq == 0 && leftTok == 0 {
			return nil
		}
		s.refill(now, rs, ts, l.cfg.Frontend)
		others := s.othersHeld(now, l.cfg.Frontend)
		s.Req = math.Min(rs.burst-others.Req, s.Req+leftReq)
		s.Tok = math.Min(ts.burst-others.Tok, s.Tok+leftTok)
		delete(s.Leases, l.cfg.Frontend)
		switch err := l.put(ctx, key, s, rev); {
		case errors.Is(err, jetstream.ErrKeyExists), isWrongSequence(err):
			backOff(try)
			continue
		case err != nil:
			return err
		}
		l.mu.Lock()
		h.seen = s
		l.mu.Unlock()
		return nil
	}
	return fmt.Errorf("quota: return to %s: too many concurrent writers", key)
}

// status is tenant's budgets as this frontend sees them: the key as of its
// last compare-and-set, refilled to now, plus the lease it holds.
func (l *Limiter) status(tenant string, rs, ts shape) Status {
	now := l.cfg.Now()
	l.mu.Lock()
	h, ok := l.tenants[tenant]
	var s state
	var hr, ht float64
	if ok {
		s = h.seen
		s.Leases = nil // others' leases are not copied: the cap below is the burst
		if now.Before(h.exp) {
			hr, ht = h.req, h.tok
		}
	}
	l.mu.Unlock()
	if !ok || s.At == 0 {
		s = fullState(now, rs, ts)
	}
	s.refill(now, rs, ts, l.cfg.Frontend)
	return Status{Requests: window(rs, s.Req+hr), Tokens: window(ts, s.Tok+ht)}
}

// Status is tenant's budgets for the headers of an answer, with no call to
// the bucket; the zero Status for a tenant without per-minute budgets.
func (l *Limiter) Status(tenant string) Status {
	b := l.Budget(tenant)
	return l.status(tenant, shapeOf(b.RPM), shapeOf(b.TPM))
}

func window(s shape, left float64) Window {
	if !s.on() {
		return Window{}
	}
	left = math.Max(0, math.Min(s.burst, left))
	return Window{Limit: int64(s.limit), Remaining: int64(left), Reset: s.wait(s.burst - left)}
}

// Usage is tenant's budgets as the bucket holds them now (one read of the
// tenant's key): what every frontend could still admit, less the slices
// other frontends hold, plus this frontend's own. A tenant without
// per-minute budgets reads nothing.
func (l *Limiter) Usage(ctx context.Context, tenant string) (Status, error) {
	b := l.Budget(tenant)
	rs, ts := shapeOf(b.RPM), shapeOf(b.TPM)
	if !rs.on() && !ts.on() {
		return Status{}, nil
	}
	now := l.cfg.Now()
	s, _, err := l.get(ctx, tenantKey(tenant), now, rs, ts)
	if err != nil {
		return Status{}, err
	}
	s.refill(now, rs, ts, l.cfg.Frontend)
	var hr, ht float64
	l.mu.Lock()
	if h, ok := l.tenants[tenant]; ok && now.Before(h.exp) {
		hr, ht = h.req, h.tok
	}
	l.mu.Unlock()
	return Status{Requests: window(rs, s.Req+hr), Tokens: window(ts, s.Tok+ht)}, nil
}
