package frontend

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
)

// MaxChoices is the largest n accepted.
const MaxChoices = 16

// childID names choice i of request id.
func childID(id string, i int) string { return id + "-" + strconv.Itoa(i) }

// serveChoices runs a request with n > 1 choices as one child request per
// choice (each dispatched, migrated and resumable on its own, as
// <id>-<index>), under a parent that records them, so cancelling the parent
// cancels every choice.
func (fe *Frontend) serveChoices(w http.ResponseWriter, r *http.Request, parent events.RequestAccepted, n int, start time.Time) {
	parent.Choices = n
	env := fe.events.Envelope(events.ID(parent.RequestID, "accepted"), parent.RequestID, parent)
	if _, err := fe.events.Append(r.Context(), streams.RequestEvents(parent.RequestID), env, 0); err != nil {
		if errors.Is(err, streams.ErrConflict) {
			writeAPIError(w, badRequest("request_exists", "request %s exists; resume its choices as %s … %s",
				parent.RequestID, childID(parent.RequestID, 0), childID(parent.RequestID, n-1)))
			return
		}
		writeError(w, http.StatusInternalServerError, "server_error", "log_unavailable", fmt.Sprintf("could not record the request: %v", err))
		return
	}
	ts := make([]*tracked, 0, n)
	defer func() {
		for _, t := range ts {
			fe.release(t)
		}
	}()
	for i := range n {
		child := parent
		child.RequestID, child.ParentID, child.Choices = childID(parent.RequestID, i), parent.RequestID, 0
		fe.linkChild(r.Context(), parent.RequestID, child.RequestID)
		t, err := fe.start(r.Context(), child)
		if err != nil {
			_ = fe.cancelTree(r.Context(), parent.RequestID, events.CancelKill, "a choice could not start")
			writeError(w, http.StatusInternalServerError, "server_error", "log_unavailable", fmt.Sprintf("could not record choice %d: %v", i, err))
			return
		}
		ts = append(ts, t)
	}
	fe.metrics.active.WithLabelValues(parent.Model).Inc()
	defer fe.metrics.active.WithLabelValues(parent.Model).Dec()
	for _, t := range ts {
		select {
		case <-t.dispatched:
		case <-r.Context().Done():
		}
	}
	for _, t := range ts {
		fe.clientEnter(t)
		defer fe.clientLeave(t)
	}
	var ok bool
	if parent.Stream {
		ok = fe.streamChoices(w, r, parent, ts, start)
	} else {
		ok = fe.unaryChoices(w, r, parent, ts)
	}
	fe.countRequest(parent.Model, parent.Endpoint, parent.Stream, ok)
}

// waitAny blocks until one of ts changes, the client leaves (false), or the
// frontend cuts open streams (false).
func (fe *Frontend) waitAny(r *http.Request, chans []<-chan struct{}) bool {
	cases := make([]reflect.SelectCase, 0, len(chans)+2)
	for _, ch := range chans {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)})
	}
	cases = append(cases,
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(r.Context().Done())},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(fe.closing)})
	i, _, _ := reflect.Select(cases)
	return i < len(chans)
}

func (fe *Frontend) unaryChoices(w http.ResponseWriter, r *http.Request, parent events.RequestAccepted, ts []*tracked) bool {
	for {
		chans := make([]<-chan struct{}, len(ts))
		snaps := make([]snapshot, len(ts))
		done := true
		for i, t := range ts {
			chans[i] = t.f.changed.C()
			snaps[i] = t.snapshot(0)
			done = done && snaps[i].status.Terminal()
		}
		if done {
			for _, s := range snaps {
				if s.status != projections.StatusCompleted {
					return fe.writeUnary(w, s)
				}
			}
			writeJSON(w, http.StatusOK, completionBody(parent, snaps))
			return true
		}
		if !fe.waitAny(r, chans) {
			if r.Context().Err() != nil {
				fe.onGroupGone(parent)
			}
			return false
		}
	}
}

// streamChoices streams every choice, each chunk carrying its choice index.
// Event ids count the tokens sent over all choices (a group is resumed per
// choice, through the child ids).
func (fe *Frontend) streamChoices(w http.ResponseWriter, r *http.Request, parent events.RequestAccepted, ts []*tracked, start time.Time) bool {
	flusher, _ := w.(http.Flusher)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	sse := &sseWriter{w: w, acc: parent}
	sent := make([]int, len(ts))
	finished := make([]bool, len(ts))
	total, first := 0, true
	for {
		chans := make([]<-chan struct{}, len(ts))
		allDone := true
		var failed *snapshot
		for i, t := range ts {
			chans[i] = t.f.changed.C()
			s := t.snapshot(sent[i])
			if len(s.tokens) > 0 {
				sent[i] += len(s.tokens)
				total += len(s.tokens)
				sse.chunk(total, merge(s.tokens, s.details).chunkChoice(parent.Endpoint, i, sent[i] == len(s.tokens)), nil)
				fe.metrics.outputTokens.WithLabelValues(parent.Model).Add(float64(len(s.tokens)))
				if first {
					fe.metrics.ttft.WithLabelValues(parent.Model).Observe(time.Since(start).Seconds())
					first = false
				}
			}
			switch {
			case s.status == projections.StatusCompleted && !finished[i]:
				finished[i] = true
				sse.finish(total, i, s.finishReason)
			case s.status == projections.StatusFailed || s.status == projections.StatusCancelled:
				failed = &s
			}
			allDone = allDone && s.status.Terminal()
		}
		if failed != nil {
			if failed.status == projections.StatusFailed {
				sse.error(total, errorBody("server_error", failed.failure.Code, failed.failure.Message))
			} else {
				sse.error(total, errorBody("cancelled", "request_cancelled", "the request was cancelled ("+failed.cancel.Reason+")"))
			}
			_ = fe.cancelTree(r.Context(), parent.RequestID, events.CancelKill, "another choice failed")
			return false
		}
		if allDone {
			if parent.IncludeUsage {
				sse.usage(total, map[string]any{
					"prompt_tokens": parent.PromptTokens, "completion_tokens": total, "total_tokens": parent.PromptTokens + total,
				})
			}
			sse.done(total)
			if flusher != nil {
				flusher.Flush()
			}
			fe.metrics.duration.WithLabelValues(parent.Model).Observe(time.Since(start).Seconds())
			return true
		}
		if flusher != nil {
			flusher.Flush()
		}
		if sse.err != nil || !fe.waitAny(r, chans) {
			if r.Context().Err() != nil || sse.err != nil {
				fe.onGroupGone(parent)
			}
			return false
		}
	}
}

// onGroupGone cancels a non-resumable group whose client left.
func (fe *Frontend) onGroupGone(parent events.RequestAccepted) {
	fe.metrics.disconnected.Inc()
	if parent.Resumable || fe.isClosing() {
		return
	}
	if err := fe.cancelTree(fe.ctx, parent.RequestID, events.CancelKill, "client disconnected"); err != nil {
		fe.log.Warn("cancel after client disconnect", "request_id", parent.RequestID, "err", err)
	}
}
