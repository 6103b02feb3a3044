package runner

import (
	"errors"

	"github.com/baton-dev/baton/services/fleet"
)

// Admit checks that model is served and that some worker can take a
// request of endpoint (pinned to worker pinned, if set), before anything is
// written to the log: Fleet.Admit, whose fleet.ErrAllBusy it counts as a
// rejection.
func (rn *Runner) Admit(model, endpoint, pinned string) error {
	err := rn.fleet.Admit(model, pinned)
	if errors.Is(err, fleet.ErrAllBusy) {
		rn.metrics.rejections.WithLabelValues(model, endpoint).Inc()
	}
	return err
}
