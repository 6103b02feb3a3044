package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// DefaultInterval is how often at most a repeated warning is written.
const DefaultInterval = 10 * time.Second

// maxKeys bounds the messages tracked at once. Messages are mostly constants
// of the call sites; past this many (messages built from their values), the
// ones not seen for an interval are forgotten, and if none is, a new message
// is written without being tracked.
const maxKeys = 1024

// SuppressedKey is the attribute a written line carries when lines of the
// same message were dropped before it: how many.
const SuppressedKey = "suppressed"

// Handler passes records below its level on as they are. A record at or
// above it is passed on the first time its level and message are seen, then
// at most once every interval; the others are dropped and counted, and the
// next one passed on carries SuppressedKey with the count. (A count is
// written with the next line of its message: a flood that ends leaves its
// last count unwritten until the message comes again.) The handlers WithAttrs
// and WithGroup return share the counts, so a logger's With children are
// limited together. It is safe for concurrent use, as its next handler must be.
type Handler struct {
	next  slog.Handler
	level slog.Level
	every time.Duration
	st    *state
}

type state struct {
	mu   sync.Mutex
	keys map[key]*seen
}

type key struct {
	level slog.Level
	msg   string
}

type seen struct {
	written    time.Time // when a line of it was last written
	suppressed int       // dropped since
}

// New wraps next: records at level or above are limited to one line every
// interval per message (DefaultInterval if interval is not positive).
func New(next slog.Handler, level slog.Level, interval time.Duration) *Handler {
	if interval <= 0 {
		interval = DefaultInterval
	}
	return &Handler{next: next, level: level, every: interval, st: &state{keys: map[key]*seen{}}}
}

// Enabled reports whether next handles records of level l.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// Handle passes r on to next unless it is a repeat within the interval.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < h.level {
		return h.next.Handle(ctx, r)
	}
	now := r.Time
	if now.IsZero() {
		now = time.Now()
	}
	n, ok := h.st.admit(key{r.Level, r.Message}, now, h.every)
	if !ok {
		return nil
	}
	if n > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int(SuppressedKey, n))
	}
	return h.next.Handle(ctx, r)
}

// admit reports whether a record of k at now is written, and how many of k
// were dropped since the last one that was.
func (s *state) admit(k key, now time.Time, every time.Duration) (suppressed int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, known := s.keys[k]
	if !known {
		if len(s.keys) >= maxKeys {
			s.forget(now, every)
		}
		if len(s.keys) < maxKeys {
			s.keys[k] = &seen{written: now}
		}
		return 0, true
	}
	if now.Sub(e.written) < every {
		e.suppressed++
		return 0, false
	}
	n := e.suppressed
	e.written, e.suppressed = now, 0
	return n, true
}

// forget drops the messages not written for an interval (and their counts:
// this happens only past maxKeys messages).
func (s *state) forget(now time.Time, every time.Duration) {
	for k, e := range s.keys {
		if now.Sub(e.written) >= every {
			delete(s.keys, k)
		}
	}
}

// WithAttrs returns a Handler over next.WithAttrs(attrs) sharing h's counts.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &Handler{next: h.next.WithAttrs(attrs), level: h.level, every: h.every, st: h.st}
}

// WithGroup returns a Handler over next.WithGroup(name) sharing h's counts.
func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{next: h.next.WithGroup(name), level: h.level, every: h.every, st: h.st}
}
