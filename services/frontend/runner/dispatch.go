package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/migrations"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
)

// dispatcher sends dispatches to workers and waits for their answers, on
// the control connection (Runner.openControl). It is safe for concurrent
// use once Start returned.
type dispatcher struct {
	ctl             *nats.Conn    // nc until Start opens a connection of its own, before any runner starts
	timeout         time.Duration // Config.DispatchTimeout
	maxPromptTokens int           // Config.MaxPromptTokens, set on each dispatch
	commands        commands      // fences of held dispatches
	log             *slog.Logger
}

// heldDispatch is a dispatch on its way to a worker that holds the
// attempt's output until told its routed decision is stored
// (services/worker/hold.go), sent before that decision was appended.
type heldDispatch struct {
	w      projections.Worker
	done   func() // ends the router's reservation of w
	d      events.Dispatch
	answer chan dispatchAnswer // the worker's answer, once
	stored bool                // its routed decision is stored (in the accepted event)
}

type dispatchAnswer struct {
	reply streams.DispatchReply
	err   error
}

// sendHeld sends d to w, held, and returns at once.
func (ds *dispatcher) sendHeld(ctx context.Context, w projections.Worker, done func(), d events.Dispatch) *heldDispatch {
	d.Hold = uuid.NewString()
	h := &heldDispatch{w: w, done: done, d: d, answer: make(chan dispatchAnswer, 1)}
	go func() {
		reply, err := ds.send(ctx, w.ID, d)
		h.answer <- dispatchAnswer{reply, err}
	}()
	return h
}

// abandon gives up h (if any), which the request no longer needs: the
// worker is fenced once it answered, and the reservation ends.
func (ds *dispatcher) abandon(h *heldDispatch) {
	if h == nil {
		return
	}
	go func() {
		if ans := <-h.answer; ans.err != nil || ans.reply.Accepted {
			ds.fenceHeld(h.d.RequestID, h)
		}
		h.done()
		ds.log.Info("abandoned a held dispatch", "request_id", h.d.RequestID, "attempt", h.d.Attempt, "worker_id", h.w.ID, "hold", h.d.Hold)
	}()
}

// fenceHeld fences h's attempt of request id on its worker.
func (ds *dispatcher) fenceHeld(id string, h *heldDispatch) {
	ds.commands.send(h.w.ID, streams.Command{RequestID: id, Attempt: h.d.Attempt, Kind: streams.CommandFence,
		Reason: "its routed decision was not stored", Hold: h.d.Hold})
}

// dispatchEarly sends the first dispatch of a new request while its
// accepted event env is appended, when the policy would dispatch it and
// the worker it picks holds its output (nil otherwise): the engine starts
// one more acknowledgement sooner. The runner's first dispatch takes it
// (carryDispatch).
func (rn *Runner) dispatchEarly(ctx context.Context, env events.Envelope) *heldDispatch {
	p := projections.NewRequest()
	p.Apply(env)
	a := rn.policy.Step(migrations.State{Request: p}, migrations.Observation{}, time.Now())
	if a.Kind != migrations.DispatchNext {
		return nil
	}
	w, done, err := rn.fleet.Pick(a.Dispatch, a.Pinned, a.Exclude)
	if err != nil {
		return nil
	}
	if !w.HoldsUntilRouted {
		done()
		return nil
	}
	d := a.Dispatch
	rn.batches.ask(w, &d)
	return rn.dispatcher.sendHeld(ctx, w, done, d)
}

// send sends d to workerID and waits for its answer; it sets the
// frontend's prompt limit on it.
func (ds *dispatcher) send(ctx context.Context, workerID string, d events.Dispatch) (streams.DispatchReply, error) {
	d.MaxPromptTokens = ds.maxPromptTokens
	data, err := json.Marshal(d)
	if err != nil {
		return streams.DispatchReply{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, ds.timeout)
	defer cancel()
	msg, err := ds.ctl.RequestWithContext(ctx, streams.DispatchSubject(workerID), data)
	if err != nil {
		return streams.DispatchReply{}, fmt.Errorf("dispatch %s to %s: %w", d.RequestID, workerID, err)
	}
	var reply streams.DispatchReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return streams.DispatchReply{}, fmt.Errorf("dispatch %s to %s: bad reply: %w", d.RequestID, workerID, err)
	}
	return reply, nil
}
