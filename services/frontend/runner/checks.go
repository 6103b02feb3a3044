package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"
)

// checkers is how many checks a frontend answers at once.
const checkers = 4

// checks answers the workers' checks (streams.Check) from the log, on the
// frontend's main connection.
type checks struct {
	nc       *nats.Conn
	log      *slog.Logger
	fleet    Fleet // is the owner alive
	requests loadCanceller
}

// loadCanceller is what a check needs of the runtime (Runner): a
// request's state, and its cancellation when its owner is gone.
type loadCanceller interface {
	Load(ctx context.Context, id string) (*projections.Request, error)
	Cancel(ctx context.Context, id, mode, reason, tenant string) error
}

// answer answers the workers' checks (one frontend of the queue group
// answers each) on g until ctx is done.
func (cs *checks) answer(ctx context.Context, g *errgroup.Group) error {
	ch := make(chan *nats.Msg, 256)
	limit := newCheckLimiter(checkShare, checkBurst, time.Now)
	sub, err := cs.nc.QueueSubscribe(streams.CheckSubjects, streams.CheckQueue, func(m *nats.Msg) { admitCheck(limit, ch, m) })
	if err != nil {
		return fmt.Errorf("subscribe to checks: %w", err)
	}
	g.Go(func() error {
		<-ctx.Done()
		_ = sub.Unsubscribe()
		return nil
	})
	for range checkers {
		g.Go(func() error {
			for {
				select {
				case <-ctx.Done():
					return nil
				case m := <-ch:
					start := time.Now()
					cctx, cancel := context.WithTimeout(ctx, streams.DefaultTimeout)
					data, _ := json.Marshal(cs.check(cctx, m.Subject, m.Data))
					cancel()
					_ = m.Respond(data)
					if w, err := streams.CheckWorker(m.Subject); err == nil {
						limit.done(w, time.Since(start))
					}
				}
			}
		})
	}
	return nil
}

// check answers a worker's check. The worker is the one its subject names
// (NATS permissions let a worker publish only its own): it learns nothing
// of an attempt not routed to it, and a detach cancels only a request whose
// current attempt it runs and whose owner is gone.
func (cs *checks) check(ctx context.Context, subject string, data []byte) streams.CheckReply {
	worker, err := streams.CheckWorker(subject)
	var c streams.Check
	if err == nil {
		err = json.Unmarshal(data, &c)
	}
	if err != nil || !streams.ValidRequestID(c.RequestID) {
		return streams.CheckReply{Error: "malformed check"}
	}
	p, err := cs.requests.Load(ctx, c.RequestID)
	if errors.Is(err, streams.ErrNotFound) {
		return streams.CheckReply{}
	}
	if err != nil {
		return streams.CheckReply{Error: "read the request: " + err.Error()}
	}
	if c.Attempt < 0 || c.Attempt >= len(p.Attempts) || p.Attempts[c.Attempt].WorkerID != worker {
		return streams.CheckReply{}
	}
	cmd := attemptCommand(p, c.Attempt)
	if cmd != nil || !c.Detach || p.Owner == "" || cs.fleet.FrontendAlive(p.Owner) {
		return streams.CheckReply{Command: cmd, Owner: p.Owner}
	}
	reason := "detached: frontend " + p.Owner + " is gone and no client re-attached"
	if err := cs.requests.Cancel(ctx, c.RequestID, events.CancelKill, reason, ""); err != nil {
		return streams.CheckReply{Error: "cancel the detached request: " + err.Error()}
	}
	cs.log.Info("cancelled detached request", "request_id", c.RequestID, "owner", p.Owner, "worker_id", worker)
	return streams.CheckReply{Owner: p.Owner, Command: &streams.Command{RequestID: c.RequestID, Attempt: c.Attempt,
		Kind: streams.CommandCancel, Mode: events.CancelKill, Reason: reason}}
}
