package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/frontend/runner"
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
	if err := fe.runtime.AcceptParent(r.Context(), parent); err != nil {
		if errors.Is(err, runner.ErrExists) {
			writeAPIError(w, badRequest("request_exists", "request %s exists; resume its choices as %s … %s",
				parent.RequestID, childID(parent.RequestID, 0), childID(parent.RequestID, n-1)))
			return
		}
		writeRecordError(w, "the request", err)
		return
	}
	ts := make([]*runner.Request, 0, n)
	defer func() {
		for _, t := range ts {
			t.Release()
		}
	}()
	for i := range n {
		child := parent
		child.RequestID, child.ParentID, child.Choices = childID(parent.RequestID, i), parent.RequestID, 0
		child.Body = choiceBody(parent.Body, i)
		fe.runtime.Link(r.Context(), parent.RequestID, child.RequestID)
		t, err := fe.runtime.Accept(r.Context(), child)
		if err != nil {
			_ = fe.runtime.Cancel(r.Context(), parent.RequestID, events.CancelKill, "a choice could not start", "")
			writeRecordError(w, fmt.Sprintf("choice %d", i), err)
			return
		}
		fe.ledger.add(child)
		ts = append(ts, t)
	}
	fe.tenants.admit(parent.Tenant, parent.Endpoint, n*parent.PromptTokens)
	defer fe.createEnded(parent.Tenant, ts...) // before the deferred releases
	fe.metrics.active.WithLabelValues(parent.Model).Inc()
	defer fe.metrics.active.WithLabelValues(parent.Model).Dec()
	for _, t := range ts {
		select {
		case <-t.Dispatched():
		case <-r.Context().Done():
		}
	}
	ok := fe.respond(w, r, parent, ts, 0, parent.Stream, start, func() { fe.onGroupGone(parent) })
	fe.countRequest(parent.Model, parent.Endpoint, parent.Stream, ok)
}

// onGroupGone cancels a non-resumable group whose client left.
func (fe *Frontend) onGroupGone(parent events.RequestAccepted) {
	fe.metrics.disconnected.Inc()
	if parent.Resumable || fe.isClosing() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), streams.DefaultTimeout)
	defer cancel()
	if err := fe.runtime.Cancel(ctx, parent.RequestID, events.CancelKill, "client disconnected", ""); err != nil {
		fe.log.Warn("cancel after client disconnect", "request_id", parent.RequestID, "err", err)
	}
}

// choiceBody is the body choice i of a request with n > 1 runs with: the
// client's body, with a seed s made s+i, so that seeded choices differ (as
// the n choices of one request do on the model server) while each stays
// reproducible. Choice 0 and bodies without an integer seed are unchanged.
func choiceBody(body json.RawMessage, i int) json.RawMessage {
	if i == 0 || len(body) == 0 {
		return body
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return body
	}
	var seed *int64
	if json.Unmarshal(fields["seed"], &seed) != nil || seed == nil {
		return body
	}
	fields["seed"], _ = json.Marshal(*seed + int64(i))
	out, err := json.Marshal(fields)
	if err != nil {
		return body
	}
	return out
}
