package runner

import (
	"errors"

	"github.com/baton-dev/baton/projections"
)

// Why Admit refuses a request.
var (
	// ErrUnknownModel: no worker serves the model, nor has one since start.
	ErrUnknownModel = errors.New("runner: unknown model")
	// ErrWorkerNotFound: the pinned worker is not in discovery for the model.
	ErrWorkerNotFound = errors.New("runner: pinned worker not found")
	// ErrNoWorkers: no worker of the model is routable.
	ErrNoWorkers = errors.New("runner: no worker is ready")
)

// Admit checks that model is served and that some worker can take a
// request of endpoint (pinned to worker pinned, if set), before anything is
// written to the log. It returns ErrUnknownModel, ErrWorkerNotFound,
// ErrNoWorkers, or ErrAllBusy, which it counts as a rejection.
func (rn *Runner) Admit(model, endpoint, pinned string) error {
	var known, routable bool
	var pinnedWorker projections.Worker
	var pinnedOK bool
	var cands []projections.Worker
	rn.disc.read(func(v *projections.Discovery) {
		for _, w := range v.Workers() {
			if w.Model == model {
				known = true
			}
		}
		cands = v.Routable(model)
		routable = len(cands) > 0
		if pinned != "" {
			pinnedWorker, pinnedOK = v.Get(pinned)
		}
	})
	if !known && !rn.disc.hasServed(model) {
		return ErrUnknownModel
	}
	if pinned != "" {
		if !pinnedOK || pinnedWorker.Model != model {
			return ErrWorkerNotFound
		}
		return nil
	}
	if !routable {
		return ErrNoWorkers
	}
	if _, err := rn.router.pick(cands, nil); errors.Is(err, ErrAllBusy) {
		rn.metrics.rejections.WithLabelValues(model, endpoint).Inc()
		return ErrAllBusy
	}
	return nil
}
