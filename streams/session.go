package streams

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

// Errors of a Session.
var (
	// ErrKeyHeld means an exclusive session's key exists and its holder may
	// not be replaced (SessionConfig.TakeOver said no).
	ErrKeyHeld = errors.New("streams: key held by another session")
	// ErrSessionLost means an exclusive session's key was deleted, expired or
	// written by someone else: its liveness is lost and never comes back.
	ErrSessionLost = errors.New("streams: session lost")
	// ErrSessionClosed means the owner closed or revoked the session.
	ErrSessionClosed = errors.New("streams: session closed")
)

// SessionConfig says how a Session holds its key.
type SessionConfig[T any] struct {
	// TTL is how long the key outlives its last write. The server keeps
	// per-message TTLs in whole seconds, so it is at least a second.
	TTL time.Duration
	// Exclusive sessions create the key (a live key is ErrKeyHeld unless
	// TakeOver allows it), renew it only at the revision they wrote last,
	// and end with ErrSessionLost when that fails or when no renewal has
	// succeeded for a TTL. Other sessions own their key by fiat: they put
	// it unconditionally, a write repairs a key deleted under them, and
	// only Close or Revoke ends them.
	Exclusive bool
	// TakeOver decides, for an exclusive session whose key exists, whether
	// the value held there may be replaced (e.g. the owner's own earlier
	// session). Nil replaces nothing.
	TakeOver func(held T) bool
	// Refresh, if set, edits the value before every write (e.g. the
	// connection's client id, which changes on a reconnect).
	Refresh func(*T)
	// Log receives failed renewals, which are retried. Nil discards them.
	Log *slog.Logger
}

// Session is a KV key that lives while its owner does, in the manner of
// etcd's concurrency.Session: NewSession writes it with a TTL, a goroutine
// renews it at a third of the TTL (less up to a tenth, at random, so that
// many sessions do not renew in step), Update changes its value, Done is
// closed once liveness is lost or the owner ends it, and Revoke deletes it.
// A lost session is never revived: the owner starts a new one.
//
// The value is stored as JSON. Renewals publish to the key's subject with a
// per-message TTL (kv.Put and kv.Update take none) and, for an exclusive
// session, the expected last revision, which is what kv.Update does.
type Session[T any] struct {
	st  sessionStore
	cfg SessionConfig[T]

	mu      sync.Mutex // serialises writes of the key
	value   T
	rev     uint64
	renewed time.Time
	err     error // why the session ended

	done     chan struct{}
	doneOnce sync.Once
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// NewSession writes key in kv with value v and starts renewing it. js
// publishes the renewals; kv must be a bucket of js.
func NewSession[T any](ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string, v T, cfg SessionConfig[T]) (*Session[T], error) {
	st := &kvStore{js: js, kv: kv, key: key, subject: KVSubject(kv.Bucket(), key), ttl: cfg.TTL}
	return newSession(ctx, st, v, cfg)
}

func newSession[T any](ctx context.Context, st sessionStore, v T, cfg SessionConfig[T]) (*Session[T], error) {
	if cfg.TTL < time.Second {
		return nil, fmt.Errorf("streams: session TTL %v, want at least 1s", cfg.TTL)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Session[T]{st: st, cfg: cfg, value: v, done: make(chan struct{}), stop: make(chan struct{})}
	if cfg.Refresh != nil {
		cfg.Refresh(&s.value)
	}
	data, err := json.Marshal(s.value)
	if err != nil {
		return nil, fmt.Errorf("streams: encode %s: %w", st.name(), err)
	}
	var rev uint64
	if cfg.Exclusive {
		rev, err = s.create(ctx, data)
	} else {
		rev, err = st.put(ctx, data, 0)
	}
	if err != nil {
		return nil, err
	}
	s.rev, s.renewed = rev, time.Now()
	s.wg.Go(s.keepAlive)
	return s, nil
}

// create creates the key, or replaces it if TakeOver allows the value held.
func (s *Session[T]) create(ctx context.Context, data []byte) (uint64, error) {
	rev, err := s.st.create(ctx, data)
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return rev, err
	}
	held, heldRev, err := s.st.get(ctx)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return s.st.create(ctx, data) // expired meanwhile
	}
	if err != nil {
		return 0, fmt.Errorf("streams: read %s: %w", s.st.name(), err)
	}
	var v T
	if json.Unmarshal(held, &v) != nil || s.cfg.TakeOver == nil || !s.cfg.TakeOver(v) {
		return 0, fmt.Errorf("%w: %s", ErrKeyHeld, s.st.name())
	}
	rev, err = s.st.put(ctx, data, heldRev)
	if err != nil {
		return 0, fmt.Errorf("streams: replace %s: %w", s.st.name(), err)
	}
	return rev, nil
}

// Done is closed when the session is lost, closed or revoked.
func (s *Session[T]) Done() <-chan struct{} { return s.done }

// Err says why the session ended (wrapping ErrSessionLost or
// ErrSessionClosed); nil while it is live.
func (s *Session[T]) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Value is the value last written.
func (s *Session[T]) Value() T {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.value
}

// Update writes the value changed by edit at once; the value is unchanged if
// the write fails. An ended session returns its Err.
func (s *Session[T]) Update(edit func(*T)) error { return s.write(edit) }

// end records why the session ended and closes Done; s.mu is held.
func (s *Session[T]) end(err error) {
	s.doneOnce.Do(func() {
		s.err = err
		close(s.done)
	})
}

// interval is the wait before the next renewal: a third of the TTL less up
// to a tenth of that.
func (s *Session[T]) interval() time.Duration {
	third := s.cfg.TTL / 3
	return third - rand.N(third/10+1)
}

func (s *Session[T]) keepAlive() {
	t := time.NewTimer(s.interval())
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		t.Reset(s.interval())
		err := s.write(nil)
		switch {
		case err == nil:
		case errors.Is(err, ErrSessionLost):
			return
		case s.cfg.Exclusive && time.Since(s.lastRenewed()) >= s.cfg.TTL:
			s.mu.Lock()
			s.end(fmt.Errorf("%w: %s not renewed for %v: %w", ErrSessionLost, s.st.name(), s.cfg.TTL, err))
			s.mu.Unlock()
			return
		default:
			s.cfg.Log.Warn("session renewal failed; retrying", "key", s.st.name(), "err", err)
		}
	}
}

func (s *Session[T]) lastRenewed() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.renewed
}

// write publishes the value, changed by edit if not nil. A revision mismatch
// ends an exclusive session.
func (s *Session[T]) write(edit func(*T)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	v := s.value
	if edit != nil {
		edit(&v)
	}
	if s.cfg.Refresh != nil {
		s.cfg.Refresh(&v)
	}
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("streams: encode %s: %w", s.st.name(), err)
	}
	var last uint64
	if s.cfg.Exclusive {
		last = s.rev
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.TTL/3)
	defer cancel()
	rev, err := s.st.put(ctx, data, last)
	if err != nil {
		if s.cfg.Exclusive && errors.Is(translate(err), ErrRevisionMismatch) {
			err = fmt.Errorf("%w: %s changed under revision %d: %w", ErrSessionLost, s.st.name(), s.rev, err)
			s.end(err)
		}
		return err
	}
	s.value, s.rev, s.renewed = v, rev, time.Now()
	return nil
}

// Revoke stops the renewals and deletes the key if the session still holds
// it (an exclusive session's key only at the revision it wrote last). A
// session lost already has no key to delete and returns nil.
func (s *Session[T]) Revoke(ctx context.Context) error {
	s.halt()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil
	}
	s.end(fmt.Errorf("%w: revoked", ErrSessionClosed))
	var last uint64
	if s.cfg.Exclusive {
		last = s.rev
	}
	if err := s.st.delete(ctx, last); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("streams: delete %s: %w", s.st.name(), err)
	}
	return nil
}

// Close stops the renewals without deleting the key, which then expires
// after the TTL (as if the process had stopped).
func (s *Session[T]) Close() {
	s.halt()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.end(ErrSessionClosed)
}

func (s *Session[T]) halt() {
	s.stopOnce.Do(func() { close(s.stop) })
	s.wg.Wait()
}

// sessionStore is where a Session keeps its key: a KV bucket, or a fake in
// the timer tests.
type sessionStore interface {
	name() string
	// create writes the key if it does not exist (jetstream.ErrKeyExists).
	create(ctx context.Context, data []byte) (uint64, error)
	// get reads the key (jetstream.ErrKeyNotFound).
	get(ctx context.Context) ([]byte, uint64, error)
	// put writes the key, if last > 0 only at revision last.
	put(ctx context.Context, data []byte, last uint64) (uint64, error)
	// delete deletes the key, if last > 0 only at revision last.
	delete(ctx context.Context, last uint64) error
}

type kvStore struct {
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	key     string
	subject string
	ttl     time.Duration
}

func (k *kvStore) name() string { return k.kv.Bucket() + "/" + k.key }

func (k *kvStore) create(ctx context.Context, data []byte) (uint64, error) {
	return k.kv.Create(ctx, k.key, data, jetstream.KeyTTL(k.ttl))
}

func (k *kvStore) get(ctx context.Context) ([]byte, uint64, error) {
	e, err := k.kv.Get(ctx, k.key)
	if err != nil {
		return nil, 0, err
	}
	return e.Value(), e.Revision(), nil
}

func (k *kvStore) put(ctx context.Context, data []byte, last uint64) (uint64, error) {
	opts := []jetstream.PublishOpt{jetstream.WithMsgTTL(k.ttl)}
	if last > 0 {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(last))
	}
	ack, err := k.js.Publish(ctx, k.subject, data, opts...)
	if err != nil {
		return 0, translate(err)
	}
	return ack.Sequence, nil
}

func (k *kvStore) delete(ctx context.Context, last uint64) error {
	var opts []jetstream.KVDeleteOpt
	if last > 0 {
		opts = append(opts, jetstream.LastRevision(last))
	}
	return k.kv.Delete(ctx, k.key, opts...)
}
