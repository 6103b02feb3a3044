package ratelog

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// lines is what a text handler wrote, one entry a line, without the time.
func lines(buf *bytes.Buffer) []string {
	var out []string
	for l := range strings.Lines(buf.String()) {
		out = append(out, strings.TrimSpace(l))
	}
	return out
}

func newLogger(buf *bytes.Buffer, every time.Duration) *slog.Logger {
	h := slog.NewTextHandler(buf, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})
	return slog.New(New(h, slog.LevelWarn, every))
}

// TestHandlerFlood: 5,000 warnings of one message in 0.28 s (the forged
// worker events of issue 32, formerly 1,007 lines) write one line; the next
// one after the interval says how many were dropped; other messages,
// levels below the limit and a logger's With children are counted apart or
// not at all as documented.
func TestHandlerFlood(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		log := newLogger(&buf, 10*time.Second)
		for i := range 5000 {
			log.Warn("worker event ignored", "n", i)
			if i%100 == 99 {
				time.Sleep(5600 * time.Microsecond) // 0.28 s in all
			}
		}
		if got, want := lines(&buf), []string{`level=WARN msg="worker event ignored" n=0`}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("after the flood: got %q, want %q", got, want)
		}
		time.Sleep(10 * time.Second)
		log.With("component", "frontend").Warn("worker event ignored", "n", 5000)
		if got, want := lines(&buf)[1], `level=WARN msg="worker event ignored" component=frontend n=5000 suppressed=4999`; got != want {
			t.Errorf("after the interval: got %q, want %q", got, want)
		}
		log.Warn("worker event ignored") // within the interval again
		log.Warn("another warning")
		log.Error("worker event ignored") // another level: its own count
		log.Info("info is not limited")
		log.Info("info is not limited")
		got := lines(&buf)[2:]
		want := []string{`level=WARN msg="another warning"`, `level=ERROR msg="worker event ignored"`,
			`level=INFO msg="info is not limited"`, `level=INFO msg="info is not limited"`}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("got %q, want %q", got, want)
		}
		time.Sleep(10 * time.Second)
		log.Warn("worker event ignored")
		if got, want := lines(&buf)[6], `level=WARN msg="worker event ignored" suppressed=1`; got != want {
			t.Errorf("the next interval: got %q, want %q", got, want)
		}
		time.Sleep(10 * time.Second)
		log.Warn("worker event ignored")
		if got, want := lines(&buf)[7], `level=WARN msg="worker event ignored"`; got != want {
			t.Errorf("nothing dropped: got %q, want %q", got, want)
		}
	})
}

// TestHandlerBounded: messages built from values are tracked up to maxKeys;
// past it, those not seen for an interval are forgotten, and a new message
// is written (untracked) rather than dropped.
func TestHandlerBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		h := New(slog.NewTextHandler(&buf, nil), slog.LevelWarn, time.Second)
		log := slog.New(h)
		for i := range maxKeys + 10 {
			log.Warn(fmt.Sprint("message ", i))
		}
		if n := len(lines(&buf)); n != maxKeys+10 {
			t.Errorf("got %d lines, want every distinct message once: %d", n, maxKeys+10)
		}
		if n := len(h.st.keys); n != maxKeys {
			t.Errorf("tracking %d messages, want at most %d", n, maxKeys)
		}
		time.Sleep(time.Second)
		log.Warn("a new one")
		if n := len(h.st.keys); n != 1 {
			t.Errorf("after an interval tracking %d messages, want the new one alone", n)
		}
		if err := h.Handle(context.Background(), slog.NewRecord(time.Time{}, slog.LevelWarn, "a new one", 0)); err != nil {
			t.Fatal(err)
		}
		if n := len(lines(&buf)); n != maxKeys+11 {
			t.Errorf("got %d lines, want the repeat (a record without a time) dropped", n)
		}
	})
}
