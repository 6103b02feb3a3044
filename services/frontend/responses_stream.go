package frontend

import (
	"encoding/json"
	"net/http"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/frontend/httpguard"
	"github.com/baton-dev/baton/services/frontend/openai"
	"github.com/baton-dev/baton/services/frontend/runner"
)

// streamResponse writes response t (known as public) as events after
// sequence number after (-1: all), live until it ends, and reports whether
// it completed. It renders from the projection as openai.Response does,
// feeding the renderer only the tokens it has not seen, so the events are
// those every other reader renders, with the same numbers. While it writes, t counts
// a client, and if t's owner goes away this frontend takes it over.
func (rs *responses) streamResponse(w http.ResponseWriter, r *http.Request, t *runner.Request, public string, after int, gone func()) bool {
	wake := make(chan struct{}, 1)
	t.Enter()
	defer t.Leave()
	defer t.Listen(wake)()
	w = httpguard.WithWriteDeadline(w, rs.cfg.WriteTimeout) // a client that stops reading is let go
	defer httpguard.EndWrites(w)
	flush := openai.StartSSE(w)
	sse := openai.NewResponseSSE(w, after)
	var acc events.RequestAccepted
	t.View(func(p *projections.Request) { acc = p.Accepted })
	b := openai.NewResponseRender(public, acc, sse.Emit)
	fed := 0
	for {
		pch := rs.fleet.FrontendsChanged()
		var tokens []string
		var details []json.RawMessage
		var o openai.ResponseOutcome
		t.View(func(p *projections.Request) {
			tokens, details, o = p.Tokens(fed), p.Details(fed), b.Outcome(p)
		})
		b.Feed(tokens, details)
		fed += len(tokens)
		if o.Terminal {
			b.Finish(o)
		}
		flush()
		if o.Terminal {
			return o.Status == "completed"
		}
		if sse.Err() != nil {
			gone()
			return false
		}
		if !rs.waitChange(r, t, wake, pch, gone) {
			return false
		}
	}
}

// awaitEnd waits until t has ended (true), claiming it if its owner goes
// away, or until the client left or the frontend cut open responses (false).
func (rs *responses) awaitEnd(r *http.Request, t *runner.Request, gone func()) bool {
	wake := make(chan struct{}, 1)
	t.Enter()
	defer t.Leave()
	defer t.Listen(wake)()
	for {
		pch := rs.fleet.FrontendsChanged()
		var terminal bool
		t.View(func(p *projections.Request) { terminal = p.Status.Terminal() })
		if terminal {
			return true
		}
		if !rs.waitChange(r, t, wake, pch, gone) {
			return false
		}
	}
}

// waitChange blocks until t changes (true), claiming it when the
// frontends' membership changes, or until the client left (calling gone)
// or the frontend cut open responses (false).
func (rs *responses) waitChange(r *http.Request, t *runner.Request, wake, pch <-chan struct{}, gone func()) bool {
	select {
	case <-wake:
	case <-pch:
		t.Claim()
	case <-rs.closing:
		return false // cut by shutdown: the response stays resumable
	case <-r.Context().Done():
		gone()
		return false
	}
	return true
}
