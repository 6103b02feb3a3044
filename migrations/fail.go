package migrations

import (
	"fmt"
	"net/http"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

// How a step ends a request that cannot go on: no worker can take it, the
// log had no room for its tokens, or the log cannot be read back.

// unroutable fails a request no worker can take (out says why): 503 while
// nothing was produced (a retry is safe), 500 once the answer would be
// truncated.
func (p Policy) unroutable(r *projections.Request, m Memory, out DispatchOutcome) Action {
	why, busy := out.Err, out.Busy
	produced := r.Len()
	status := http.StatusServiceUnavailable
	if produced > 0 {
		status = http.StatusInternalServerError
	}
	rep := Report{MigrationFailed: m.Migration}
	m.Exclude, m.Migration = nil, nil
	model := r.Accepted.Model
	if busy && produced == 0 && m.LastFailed == "" {
		// Admitted, but every worker turned busy before the first dispatch
		// (a load report arrived in between): to the client and the metrics
		// this is the same rejection as at admission.
		rep.Rejected = true
		return p.fail(r, m, "all_workers_busy", BusyMessage, status, rep)
	}
	if a, ok := lastAnswered(r, m.LastFailed); ok && produced == 0 {
		// No other worker to try: the server's own answer says more than
		// "no worker".
		return p.failAnswered(r, m, a, rep)
	}
	msg := "no worker available for model " + model + ": " + why
	switch {
	case m.LastFailed != "" && out.NotCapable:
		// Other workers are there, routable: none of them can continue it.
		msg = fmt.Sprintf("worker %s failed and no routable worker of model %s can continue the request: %s", m.LastFailed, model, why)
	case m.LastFailed != "":
		msg = fmt.Sprintf("worker %s failed and no other worker is available for model %s: %s", m.LastFailed, model, why)
	}
	return p.fail(r, m, "no_worker", msg, status, rep)
}

func (p Policy) fail(r *projections.Request, m Memory, code, msg string, status int, rep Report) Action {
	return Action{Kind: Fail, Next: m, Report: rep, Failed: events.RequestFailed{
		RequestID: r.Accepted.RequestID, Code: code, Message: msg, Status: status, Offset: r.Len(),
	}}
}

// failLogFull ends a request whose tokens the log had no room for.
func (p Policy) failLogFull(r *projections.Request, m Memory, rep Report) Action {
	return p.fail(r, m, CodeLogFull, "the request log is full: this request's tokens could not be stored", http.StatusServiceUnavailable, rep)
}

// unread holds a request whose log this frontend cannot read. Whatever
// it would decide could rest on events it has not seen, and every decision
// it stored would be refused (the events subject's sequence is past the
// one it knows) and send it to read again: it reads again, rather than
// decide, until it reads or the stall timeout has passed, and then fails
// the request (the runner stores that end where it needs no sequence).
func (p Policy) unread(r *projections.Request, m Memory, o Observation, now time.Time) Action {
	if d := now.Sub(o.Unread); d >= p.StallTimeout {
		msg := fmt.Sprintf("the request log could not be read for %v", d.Round(time.Second))
		return p.fail(r, m, CodeLogUnreadable, msg, http.StatusServiceUnavailable, Report{MigrationFailed: m.Migration})
	}
	return Action{Kind: CatchUp, Next: m}
}
