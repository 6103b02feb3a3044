package quota

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// slotsPrefix starts the keys of the tenants' concurrent slots.
const slotsPrefix = "c."

// Slots keeps each tenant's concurrent=N as one cap across every
// frontend, in the budgets bucket: one key per tenant (c.<tenant>) holds
// how many slots each frontend holds and until when (its lease). A
// frontend takes a slot with one compare-and-set of the key, refused when
// the live holdings of every frontend with its own add up to the cap, and
// gives it back with another when the request ends; it renews its
// holdings every Lease/3, so that those of a frontend that dies lapse
// within one Lease. It is safe for concurrent use.
type Slots struct {
	kv      jetstream.KeyValue
	self    string
	lease   time.Duration
	timeout time.Duration
	log     *slog.Logger
	now     func() time.Time

	mu      sync.Mutex
	tenants map[string]*slotsHeld // bounded by the tenants with a cap that sent requests
}

// slotsHeld is this frontend's slots of one tenant.
type slotsHeld struct {
	cas  sync.Mutex // one compare-and-set of the tenant's key at a time
	n    int        // slots held here; guarded by Slots.mu
	seen slotsState // the key as of this frontend's last read or write, for the next compare-and-set
	rev  uint64     // seen's revision; 0 with fresh false: read the key first
	// fresh reports whether seen is worth a try without a read: a
	// conflict or an error clears it.
	fresh bool
	// dirty and flushing (guarded by Slots.mu): a release is not written
	// yet, and a flush is under way, which writes every release that came
	// meanwhile in one write.
	dirty, flushing bool
}

// slotsState is the value of a tenant's slots key.
type slotsState struct {
	Held map[string]slotsLease `json:"held,omitempty"` // by frontend
}

// slotsLease is what one frontend holds of a tenant's slots until Exp
// (unix nanoseconds, the holder's clock).
type slotsLease struct {
	N   int   `json:"n"`
	Exp int64 `json:"exp"`
}

// SlotsFullError is a slot refused: the tenant holds Limit across every
// frontend.
type SlotsFullError struct{ Limit int }

func (e *SlotsFullError) Error() string {
	return fmt.Sprintf("Too many concurrent requests: at most %d open at once for this API key across every frontend, please retry later", e.Limit)
}

// NewSlots returns the Slots of frontend on the budgets bucket kv, with
// cfg's Lease and Timeout (their defaults when zero).
func NewSlots(kv jetstream.KeyValue, log *slog.Logger, cfg Config) (*Slots, error) {
	if cfg.Frontend == "" {
		return nil, errors.New("quota: slots: a frontend id is required")
	}
	cfg = cfg.withDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Slots{kv: kv, self: cfg.Frontend, lease: cfg.Lease, timeout: cfg.Timeout, log: log, now: cfg.Now,
		tenants: map[string]*slotsHeld{}}, nil
}

func (s *Slots) holder(tenant string) *slotsHeld {
	s.mu.Lock()
	defer s.mu.Unlock()
	return entry(s.tenants, tenant)
}

// Held is how many of tenant's slots this frontend holds.
func (s *Slots) Held(tenant string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok := s.tenants[tenant]; ok {
		return h.n
	}
	return 0
}

// Open is how many of tenant's slots every frontend holds now, with one
// read of the key.
func (s *Slots) Open(ctx context.Context, tenant string) (int, error) {
	h := &slotsHeld{}
	if err := s.read(ctx, tenant, h); err != nil {
		return 0, err
	}
	return h.seen.others(s.now(), s.self) + s.Held(tenant), nil
}

// Acquire takes one of tenant's slots under limit, across every frontend,
// or refuses it with a *SlotsFullError. Any other error means the bucket
// could not be reached (the caller fails closed). The cost is one
// compare-and-set when this frontend's view of the key is current, and a
// read more when it is not.
func (s *Slots) Acquire(ctx context.Context, tenant string, limit int) error {
	h := s.holder(tenant)
	h.cas.Lock()
	defer h.cas.Unlock()
	for try := range casTries {
		if try > 0 && !h.fresh {
			backOff(try)
		}
		cached := h.fresh
		if !cached {
			if err := s.read(ctx, tenant, h); err != nil {
				return err
			}
		}
		now := s.now()
		s.mu.Lock()
		mine := h.n
		s.mu.Unlock()
		if h.seen.others(now, s.self)+mine+1 > limit {
			if cached { // the view may be late: another frontend may have given slots back
				h.fresh = false
				continue
			}
			return &SlotsFullError{Limit: limit}
		}
		switch err := s.write(ctx, tenant, h, mine+1, now); {
		case err == nil:
			s.mu.Lock()
			h.n++
			s.mu.Unlock()
			return nil
		case !errors.Is(err, errConflict):
			return err
		}
	}
	return fmt.Errorf("quota: take a slot of %s: too many concurrent writers", tenant)
}

// Release gives back a slot Acquire took: at once here, and to the key in
// the background (until it is written, the other frontends count it as
// held, the safe side).
func (s *Slots) Release(tenant string) {
	s.mu.Lock()
	h, ok := s.tenants[tenant]
	if !ok {
		s.mu.Unlock()
		return
	}
	h.n = max(0, h.n-1)
	h.dirty = true
	start := !h.flushing
	h.flushing = true
	s.mu.Unlock()
	if start {
		go s.flush(tenant, h)
	}
}

// flush writes tenant's releases until none is left unwritten.
func (s *Slots) flush(tenant string, h *slotsHeld) {
	for {
		s.mu.Lock()
		if !h.dirty {
			h.flushing = false
			s.mu.Unlock()
			return
		}
		h.dirty = false
		s.mu.Unlock()
		s.sync(tenant, h, s.timeout)
	}
}

// sync writes this frontend's count of tenant's slots, renewing its lease
// (or deleting its entry at 0).
func (s *Slots) sync(tenant string, h *slotsHeld, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	h.cas.Lock()
	defer h.cas.Unlock()
	for try := range casTries {
		if try > 0 {
			backOff(try)
		}
		if !h.fresh {
			if err := s.read(ctx, tenant, h); err != nil {
				s.log.Warn("write a tenant's concurrent slots: they lapse by themselves", "tenant", tenant, "err", err)
				return
			}
		}
		s.mu.Lock()
		mine := h.n
		s.mu.Unlock()
		if _, ok := h.seen.Held[s.self]; !ok && mine == 0 {
			return
		}
		err := s.write(ctx, tenant, h, mine, s.now())
		if err == nil {
			return
		}
		if !errors.Is(err, errConflict) {
			s.log.Warn("write a tenant's concurrent slots: they lapse by themselves", "tenant", tenant, "err", err)
			return
		}
	}
}

// Run renews this frontend's slots every Lease/3 until ctx is done, then
// gives back every slot it holds (the frontend stopped: its requests are
// no longer served here).
func (s *Slots) Run(ctx context.Context) error {
	t := time.NewTicker(s.lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.mu.Lock()
			held := make(map[string]*slotsHeld, len(s.tenants))
			for tenant, h := range s.tenants {
				h.n = 0
				held[tenant] = h
			}
			s.mu.Unlock()
			for tenant, h := range held {
				s.sync(tenant, h, s.timeout)
			}
			return nil
		case <-t.C:
			s.mu.Lock()
			var renew []string
			for tenant, h := range s.tenants {
				if h.n > 0 {
					renew = append(renew, tenant)
				}
			}
			s.mu.Unlock()
			for _, tenant := range renew {
				s.sync(tenant, s.holder(tenant), s.lease/3)
			}
		}
	}
}

// others is the live slots every frontend but self holds.
func (st slotsState) others(now time.Time, self string) int {
	n := 0
	for id, l := range st.Held {
		if id != self && l.Exp > now.UnixNano() {
			n += l.N
		}
	}
	return n
}

var errConflict = errors.New("quota: another frontend wrote first")

// casTries bounds the compare-and-set tries of one change to a tenant's
// key, slots or budget lease. Every conflict means another frontend's
// write went in, but a frontend whose writes need no read (its view fresh)
// can win many rounds in a row against one that must read first: 20 tries
// once ran out in a unit test of two frontends taking and giving back
// slots in a tight loop (TestSlotsNeverOverCap, "too many concurrent
// writers"). A budget lease (Limiter's take and return) reads before every
// try, and follows the same rule.
const casTries = 64

// backOff waits a random while after the try-th conflict (counted from
// 0), longer with each up to 1.6 ms: a frontend whose next write needs
// no read would otherwise win every race against one that must read
// first, and writers that all read again at once conflict again.
func backOff(try int) {
	time.Sleep(rand.N(time.Duration(min(try+1, 8)) * 200 * time.Microsecond))
}

// read reads tenant's key into h; a key that does not exist holds nothing.
func (s *Slots) read(ctx context.Context, tenant string, h *slotsHeld) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	e, err := s.kv.Get(ctx, slotsPrefix+tenant)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		h.seen, h.rev, h.fresh = slotsState{}, 0, true
		return nil
	case err != nil:
		return fmt.Errorf("quota: read %s%s: %w", slotsPrefix, tenant, err)
	}
	var st slotsState
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		s.log.Warn("a slots key that does not parse is taken as empty", "key", slotsPrefix+tenant, "err", err)
	}
	h.seen, h.rev, h.fresh = st, e.Revision(), true
	return nil
}

// write stores this frontend's n slots of tenant until now + Lease over
// h's view, with a compare-and-set: errConflict when another frontend
// wrote first (h is no longer fresh). Lapsed entries are dropped.
func (s *Slots) write(ctx context.Context, tenant string, h *slotsHeld, n int, now time.Time) error {
	st := slotsState{Held: map[string]slotsLease{}}
	for id, l := range h.seen.Held {
		if id != s.self && l.Exp > now.UnixNano() {
			st.Held[id] = l
		}
	}
	if n > 0 {
		st.Held[s.self] = slotsLease{N: n, Exp: now.Add(s.lease).UnixNano()}
	}
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var rev uint64
	if h.rev == 0 {
		rev, err = s.kv.Create(ctx, slotsPrefix+tenant, data)
	} else {
		rev, err = s.kv.Update(ctx, slotsPrefix+tenant, data, h.rev)
	}
	switch {
	case err == nil:
		h.seen, h.rev, h.fresh = st, rev, true
		return nil
	case errors.Is(err, jetstream.ErrKeyExists), isWrongSequence(err):
		h.fresh = false
		return errConflict
	default:
		h.fresh = false
		return fmt.Errorf("quota: write %s%s: %w", slotsPrefix, tenant, err)
	}
}
