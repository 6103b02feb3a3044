package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/retention"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"
)

// disconnectSubject carries the server's client-disconnect advisories; only
// a system-account user may subscribe.
const disconnectSubject = "$SYS.ACCOUNT.*.DISCONNECT"

// disconnectAdvisory is the part of io.nats.server.advisory.v1.client_disconnect
// that baton reads.
type disconnectAdvisory struct {
	Server struct {
		ID string `json:"id"`
	} `json:"server"`
	Client struct {
		ID uint64 `json:"id"`
	} `json:"client"`
	Reason string `json:"reason"`
}

// watchDisconnects is the fast path for crashed workers and frontends: when
// the server reports that a worker's connection closed, the worker's lease is
// revoked at once, so every frontend sees it leave discovery within
// milliseconds instead of at the lease TTL; a crashed frontend's presence key
// is deleted likewise, so its requests can be taken over at once. It needs a system-account connection
// (Config.SystemURL); without one, detection falls back to the TTL.
func (f *Fleet) watchDisconnects(ctx context.Context, g *errgroup.Group) error {
	if f.cfg.SystemURL == "" {
		return nil
	}
	opts := []nats.Option{nats.Name("baton-frontend-" + f.id + "-sys"),
		nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond)}
	if f.cfg.SystemTLS != nil {
		opts = append(opts, nats.Secure(f.cfg.SystemTLS))
	}
	sys, err := nats.Connect(f.cfg.SystemURL, opts...)
	if err != nil {
		return fmt.Errorf("connect system account: %w", err)
	}
	_, err = sys.Subscribe(disconnectSubject, func(m *nats.Msg) {
		var a disconnectAdvisory
		if json.Unmarshal(m.Data, &a) != nil || a.Client.ID == 0 {
			return
		}
		var lost []projections.Worker
		f.disc.read(func(v *projections.Discovery) {
			for _, w := range v.Workers() {
				if w.ClientID == a.Client.ID && w.Server == a.Server.ID {
					lost = append(lost, w)
				}
			}
		})
		for _, w := range lost {
			g.Go(func() error {
				f.declareLost(ctx, w, "disconnected: "+a.Reason)
				return nil
			})
		}
		for _, p := range f.fronts.connectedAs(a.Client.ID, a.Server.ID) {
			if p.FrontendID == f.id {
				continue
			}
			g.Go(func() error {
				ctx, cancel := context.WithTimeout(ctx, streams.DefaultTimeout)
				defer cancel()
				if err := f.fronts.expire(ctx, p); err != nil {
					f.log.Warn("expire frontend", "frontend", p.FrontendID, "err", err)
				}
				return nil
			})
		}
	})
	if err != nil {
		sys.Close()
		return fmt.Errorf("subscribe %s: %w", disconnectSubject, err)
	}
	if err := sys.Flush(); err != nil {
		sys.Close()
		return fmt.Errorf("subscribe %s: %w", disconnectSubject, err)
	}
	g.Go(func() error {
		<-ctx.Done()
		sys.Close()
		return nil
	})
	return nil
}

// declareLost revokes worker w's lease and records that it was lost. Every
// frontend may do this for the same worker: the revocation expects the lease's
// revision and the event's id is deterministic, so only one of each lands.
func (f *Fleet) declareLost(ctx context.Context, w projections.Worker, reason string) {
	ctx, cancel := context.WithTimeout(ctx, streams.DefaultTimeout)
	defer cancel()
	revoked, err := f.disc.revoke(ctx, w)
	if err != nil {
		f.log.Warn("revoke lease", "worker_id", w.ID, "err", err)
		return
	}
	if !revoked {
		return // it deregistered in order, registered again, or another frontend declared it lost
	}
	ev := events.WorkerLost{WorkerID: w.ID, LeaseID: w.LeaseID, Reason: reason}
	env := f.events.Envelope(events.ID(w.ID, w.LeaseID, "lost"), w.ID, ev)
	if _, err := f.events.Append(ctx, streams.WorkerEvents(w.ID), env, -1); err != nil {
		f.log.Warn("record worker lost", "worker_id", w.ID, "err", err)
		return
	}
	f.log.Info("worker lost", "worker_id", w.ID, "lease_id", w.LeaseID, "reason", reason)
}

// quarantine takes worker id out of service for writing junk to the
// request log (retention.Fleet): a WorkerLost with QuarantineMS, which
// every frontend's discovery folds (the id stays out of routing whatever
// lease it registers next), then its lease revoked so that its attempts
// move at once. The event is stored twice: on the worker's events subject,
// where the previous release's readers fold it (and the worker's next
// registered event buries it for a view started afterwards), and on its
// quarantine subject (streams.WorkerQuarantine), which its credential
// cannot write, so that a frontend started at any time within the
// quarantine folds it. Every frontend that finds the junk may do this: the
// events' ids are deterministic, so one of each lands.
func (f *Fleet) quarantine(ctx context.Context, id, why string) {
	ctx, cancel := context.WithTimeout(ctx, streams.DefaultTimeout)
	defer cancel()
	w, known := f.disc.get(id)
	ev := events.WorkerLost{WorkerID: id, LeaseID: w.LeaseID, Reason: why, QuarantineMS: retention.QuarantineFor.Milliseconds()}
	env := f.events.Envelope(events.ID(id, w.LeaseID, "quarantined"), id, ev)
	if _, err := f.events.Append(ctx, streams.WorkerEvents(id), env, -1); err != nil {
		f.log.Warn("record worker quarantined", "worker_id", id, "err", err)
	}
	rec := f.events.Envelope(events.ID(id, w.LeaseID, "quarantine"), id, ev)
	if _, err := f.events.Append(ctx, streams.WorkerQuarantine(id), rec, -1); err != nil {
		f.log.Warn("record worker quarantine", "worker_id", id, "err", err)
	}
	if known {
		if _, err := f.disc.revoke(ctx, w); err != nil {
			f.log.Warn("revoke lease", "worker_id", id, "err", err)
		}
	}
	f.log.Warn("worker quarantined", "worker_id", id, "lease_id", w.LeaseID, "for", retention.QuarantineFor, "why", why)
}

// GuardView is the view as the request log's junk guard sees it
// (retention.Fleet): the workers whose writes it checks, those quarantined,
// and the quarantine of one found writing junk.
func (f *Fleet) GuardView() retention.Fleet { return guardView{f} }

type guardView struct{ f *Fleet }

func (g guardView) Workers() []string {
	var ids []string
	g.f.disc.read(func(v *projections.Discovery) {
		for _, w := range v.Workers() {
			if w.State != projections.WorkerQuarantined {
				ids = append(ids, w.ID)
			}
		}
	})
	return ids
}

func (g guardView) Quarantined() []string {
	var ids []string
	g.f.disc.read(func(v *projections.Discovery) { ids = v.Quarantined(time.Now()) })
	return ids
}

func (g guardView) Junk(ctx context.Context, id, why string) { g.f.quarantine(ctx, id, why) }
