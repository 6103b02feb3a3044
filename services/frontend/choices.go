package frontend

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/frontend/openai"
	"github.com/baton-dev/baton/services/frontend/runner"
)

// childID names choice i of request id.
func childID(id string, i int) string { return id + "-" + strconv.Itoa(i) }

// choiceIDs are the requests a create of n choices starts as id.
func choiceIDs(id string, n int) []string {
	if n <= 1 {
		return []string{id}
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = childID(id, i)
	}
	return ids
}

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
		child.Body = openai.ChoiceBody(parent.Body, i)
		fe.runtime.Link(r.Context(), parent.RequestID, child.RequestID)
		t, err := fe.runtime.Accept(r.Context(), child)
		if err != nil {
			_ = fe.runtime.Cancel(r.Context(), parent.RequestID, events.CancelKill, "a choice could not start", "")
			writeRecordError(w, fmt.Sprintf("choice %d", i), err)
			return
		}
		fe.tenants.Stored(child)
		ts = append(ts, t)
	}
	fe.tenants.AdmittedChoices(parent, n)
	defer fe.tenants.Ended(parent.Tenant, ts...) // before the deferred releases
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
