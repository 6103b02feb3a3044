package runner

import (
	"context"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
)

// Delete appends the tombstone of response id (events.ResponseDeleted) on
// behalf of tenant; every frontend then answers for it as for an unknown id.
// It is idempotent. The caller cancels a response still running first.
func (rn *Runner) Delete(ctx context.Context, id, tenant string) error {
	ev := events.ResponseDeleted{RequestID: id, Tenant: tenant}
	env := rn.events.Envelope(events.ID(id, "deleted"), id, ev)
	_, err := rn.events.Append(ctx, streams.RequestEvents(id), env, -1)
	return err
}
