package frontend

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/frontend/runner"
)

// respSSE writes a response's events as server-sent events, those after
// sequence number after only: `id: <sequence_number>`, `event: <type>`,
// `data: <event>`. The stream has no [DONE]: its terminal event ends it.
type respSSE struct {
	w     http.ResponseWriter
	after int
	buf   []byte
	err   error
}

func (s *respSSE) write(e respEvent) {
	if e.seq <= s.after || s.err != nil {
		return
	}
	b := append(s.buf[:0], "id: "...)
	b = strconv.AppendInt(b, int64(e.seq), 10)
	b = append(b, "\nevent: "...)
	b = append(b, e.typ...)
	b = append(b, "\ndata: "...)
	b = e.appendData(b)
	b = append(b, "\n\n"...)
	s.buf = b
	_, s.err = s.w.Write(b)
}

// streamResponse writes response t (known as public) as events after
// sequence number after (-1: all), live until it ends, and reports whether
// it completed. It renders from the projection as renderResponse does,
// feeding the renderer only the tokens it has not seen, so the events are
// those of renderResponse, with the same numbers. While it writes, t counts
// a client, and if t's owner goes away this frontend takes it over.
func (fe *Frontend) streamResponse(w http.ResponseWriter, r *http.Request, t *runner.Request, public string, after int, gone func()) bool {
	wake := make(chan struct{}, 1)
	t.Enter()
	defer t.Leave()
	defer t.Listen(wake)()
	w = withWriteDeadline(w, fe.cfg.WriteTimeout) // a client that stops reading is let go
	defer endWrites(w)
	flush := startSSE(w)
	sse := &respSSE{w: w, after: after}
	var acc events.RequestAccepted
	t.View(func(p *projections.Request) { acc = p.Accepted })
	b := newRender(public, acc, sse.write)
	fed := 0
	for {
		pch := fe.fleet.FrontendsChanged()
		var tokens []string
		var details []json.RawMessage
		var o outcome
		t.View(func(p *projections.Request) {
			tokens, details, o = p.Tokens(fed), p.Details(fed), b.outcomeOf(p)
		})
		b.feed(tokens, details)
		fed += len(tokens)
		if o.terminal {
			b.finish(o)
		}
		flush()
		if o.terminal {
			return o.status == "completed"
		}
		if sse.err != nil {
			gone()
			return false
		}
		if !fe.waitChange(r, t, wake, pch, gone) {
			return false
		}
	}
}

// awaitEnd waits until t has ended (true), claiming it if its owner goes
// away, or until the client left or the frontend cut open responses (false).
func (fe *Frontend) awaitEnd(r *http.Request, t *runner.Request, gone func()) bool {
	wake := make(chan struct{}, 1)
	t.Enter()
	defer t.Leave()
	defer t.Listen(wake)()
	for {
		pch := fe.fleet.FrontendsChanged()
		var terminal bool
		t.View(func(p *projections.Request) { terminal = p.Status.Terminal() })
		if terminal {
			return true
		}
		if !fe.waitChange(r, t, wake, pch, gone) {
			return false
		}
	}
}

// waitChange blocks until t changes (true), claiming it when the
// frontends' membership changes, or until the client left (calling gone)
// or the frontend cut open responses (false).
func (fe *Frontend) waitChange(r *http.Request, t *runner.Request, wake, pch <-chan struct{}, gone func()) bool {
	select {
	case <-wake:
	case <-pch:
		t.Claim()
	case <-fe.closing:
		return false // cut by shutdown: the response stays resumable
	case <-r.Context().Done():
		gone()
		return false
	}
	return true
}
