package runner

import (
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
)

// A worker never reads a request's log: the decisions it must obey (a
// cancel, a migration away from its attempt, the request's failure) reach it
// as commands on streams.CommandSubject(worker), published by the frontends
// for the attempts routed to that worker:
//   - the frontend that appends a cancel sends it to the worker of the
//     request's current attempt, as its log read shows it;
//   - the owner's runner relays the command the current attempt must obey
//     whenever its fold changes (relay), which closes the race of a
//     cancel stored while a dispatch was in flight: the runner relays only
//     once the worker accepted the dispatch, and folds every cancel;
//   - a worker asks (streams.Check) about its jobs after a reconnect, and
//     about a request whose owner vanished (detach): any live frontend
//     answers from the log.

// attemptCommand is the command attempt k of p must obey now, nil for none:
// a cancel for the current attempt of a cancelled request, a fence for an
// attempt the request moved past or that was closed, or whose request ended
// otherwise than by its own completion.
func attemptCommand(p *projections.Request, k int) *streams.Command {
	if k < 0 || k >= len(p.Attempts) {
		return nil // not (yet) in this fold
	}
	c := &streams.Command{RequestID: p.Accepted.RequestID, Attempt: k}
	last := k == len(p.Attempts)-1
	switch {
	case last && p.Status == projections.StatusCompleted:
		return nil // it completed: the worker ends it
	case last && p.Status == projections.StatusCancelled:
		c.Kind, c.Mode, c.Reason = streams.CommandCancel, events.CancelKill, p.Cancel.Reason
	case last && p.Status == projections.StatusRunning && !p.Attempts[k].Closed && p.Cancel != nil:
		c.Kind, c.Mode, c.Reason = streams.CommandCancel, p.Cancel.Mode, p.Cancel.Reason
	case p.Status.Terminal() || !last || p.Attempts[k].Closed:
		c.Kind, c.Reason = streams.CommandFence, "the request moved on"
	default:
		return nil
	}
	return c
}

// commands publishes to workers the commands they must obey, on the
// frontend's main connection. It is safe for concurrent use.
type commands struct {
	nc  *nats.Conn
	log *slog.Logger
}

// send publishes c to worker. Core NATS: a command lost on the way is
// asked for again by the worker after its reconnect.
func (cs commands) send(worker string, c streams.Command) {
	data, err := json.Marshal(c)
	if err == nil {
		err = cs.nc.Publish(streams.CommandSubject(worker), data)
	}
	if err != nil {
		cs.log.Warn("send command", "request_id", c.RequestID, "worker_id", worker, "kind", c.Kind, "err", err)
	}
}

// cancel sends a cancel in mode to the worker of p's current attempt, if
// it runs. An attempt routed meanwhile gets it from the owner's runner.
func (cs commands) cancel(p *projections.Request, mode, reason string) {
	if worker, c, ok := toCurrent(p, streams.Command{Kind: streams.CommandCancel, Mode: mode, Reason: reason}); ok {
		cs.send(worker, c)
	}
}

// toCurrent addresses c to p's current attempt and returns it with that
// attempt's worker; ok is false when no attempt runs.
func toCurrent(p *projections.Request, c streams.Command) (worker string, _ streams.Command, ok bool) {
	cur, ok := p.Current()
	if !ok || cur.Closed {
		return "", c, false
	}
	c.RequestID, c.Attempt = p.Accepted.RequestID, cur.Attempt
	return cur.WorkerID, c, true
}

// fenceCurrent sends a fence to the worker of t's current attempt, if it
// runs: t ends without a decision the log could store, so nothing relays
// one for it.
func (cs commands) fenceCurrent(t *Request) {
	var worker string
	var c streams.Command
	var ok bool
	t.f.view(func(p *projections.Request) {
		worker, c, ok = toCurrent(p, streams.Command{Kind: streams.CommandFence, Reason: "the request ended"})
	})
	if ok {
		cs.send(worker, c)
	}
}

// relay is what a runner last relayed to the current attempt's worker: the
// command is sent once per change of it.
type relay struct {
	last    string
	pending *streams.Command // to send, to worker
	worker  string
}

// note records the command the current attempt of p must obey, unless it
// was relayed already; commands.relay sends it. note runs under the
// projection's lock, relay outside it.
func (r *relay) note(p *projections.Request) {
	r.pending = nil
	cur, ok := p.Current()
	if !ok {
		return
	}
	c := attemptCommand(p, cur.Attempt)
	if c == nil {
		return
	}
	if key := fmt.Sprint(c.Attempt, c.Kind, c.Mode); key != r.last {
		r.last, r.pending, r.worker = key, c, cur.WorkerID
	}
}

// relay sends what r noted, if anything.
func (cs commands) relay(r *relay) {
	if r.pending != nil {
		cs.send(r.worker, *r.pending)
		r.pending = nil
	}
}
