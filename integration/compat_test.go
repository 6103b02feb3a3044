package integration

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
)

// TestFutureEventsInALiveRequest holds the compatibility rule
// (docs/compatibility.md) against real processes: while a request streams,
// events of a newer build are appended to its log (an unknown fact and a
// newer version of a known type on its events subject), as a newer
// frontend beside this one would. The owning frontend streams on; then it
// and the serving worker are killed, and the other frontend, which learns
// the request from the log alone, resumes it and migrates it, deciding with
// expected-sequence appends past the unreadable events: the client gets the
// fault-free text, and `baton replay` shows each unreadable event as
// skipped, with its reason.
func TestFutureEventsInALiveRequest(t *testing.T) {
	t.Parallel()
	s, f1, f2 := twoFrontends(t)
	js := s.jetStream(t)
	const id, prompt, maxTokens = "future-live", "a newer build writes here too", 200
	appendFuture := func(typ string, ev events.Event) {
		m, err := streams.NewMsg(streams.RequestEvents(id), events.Envelope{ID: id + "." + typ, Source: "baton/frontend/fe-next",
			Subject: id, Time: time.Now(), Event: ev})
		if err != nil {
			t.Fatal(err)
		}
		m.Header.Set(events.HeaderType, typ)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatalf("append %s: %v", typ, err)
		}
	}
	var once, twice sync.Once
	first := postStream(t, f1.url, "/v1/completions", completion(prompt, maxTokens),
		map[string]string{"X-Request-Id": id, "X-Resumable": "true"}, func(e sseEvent) {
			n, _ := strconv.Atoi(e.id)
			if n >= 20 {
				once.Do(func() {
					appendFuture("baton.request.paused.v1", events.RequestAttached{RequestID: id, Frontend: "fe-next"})
					appendFuture("baton.request.migrated.v2", events.RequestMigrated{RequestID: id, FromAttempt: 0, Cut: n, Frontend: "fe-next"})
				})
			}
			if n >= 60 {
				twice.Do(func() {
					w := f1.servingWorker(t, id)
					f1.signal(syscall.SIGKILL)
					s.workers[w].signal(syscall.SIGKILL)
				})
			}
		})
	if first.done {
		t.Fatal("the first stream completed: the kill came too late")
	}
	if n, _ := strconv.Atoi(lastID(first)); n < 60 {
		t.Fatalf("the owner streamed only to %d past the future events, want 60", n)
	}
	rest := resume(t, f2, id, lastID(first))
	joined(t, first, rest, prompt, maxTokens)
	st := f2.fullState(t, id)
	if st.Status != "completed" || len(st.Migrations) != 1 || st.Migrations[0].Offset < 60 {
		t.Errorf("state %+v: want completed after one migration past token 60 (the v2 migrated event is not read)", st)
	}

	out, errOut, code := runTool(t, batonBin, "replay", id, "--nats", s.natsURL)
	if code != 0 {
		t.Fatalf("baton replay: exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"skipped (unknown event type",
		"skipped (newer version v2 of baton.request.migrated (this build reads up to v1))",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("baton replay does not say %q:\n%s", want, out)
		}
	}
}
