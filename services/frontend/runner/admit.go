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

// Rejected counts a request of model refused because every worker is busy
// after it waited in the edge's fair queue (dynamo_frontend_model_rejection_total).
func (rn *Runner) Rejected(model, endpoint string) {
	rn.metrics.rejections.WithLabelValues(model, endpoint).Inc()
}
