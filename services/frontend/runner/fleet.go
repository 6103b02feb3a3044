package runner

import (
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/retention"
)

// Fleet is what the runtime needs of the fleet view (*fleet.Fleet, which
// the frontend runs): the workers to route a dispatch to and to watch while
// an attempt runs, a worker to inhibit after a failure, and the frontends
// that own requests. Its reads are safe for concurrent use.
type Fleet interface {
	// Ready is closed once the view is loaded.
	Ready() <-chan struct{}
	// Admit checks, before anything is written, that some worker can take
	// a request for model (or the pinned worker serves it).
	Admit(model, pinned string) error
	// Pick chooses and reserves the worker of dispatch d, never one of
	// exclude; done ends the reservation.
	Pick(d events.Dispatch, pinned string, exclude []string) (w projections.Worker, done func(), err error)
	// Worker is worker id as the view holds it.
	Worker(id string) (projections.Worker, bool)
	// Inhibit drops w from this frontend's routing for d (0: the default
	// window) and reports whether it did.
	Inhibit(w projections.Worker, d time.Duration) bool
	// Free reports whether a routable worker of model could take a new
	// request now, its last load report counting every request this
	// frontend runs on it.
	Free(model string) bool
	// WorkersChanged and MembersChanged are closed at the next change of
	// the workers: any, and any but a load report.
	WorkersChanged() <-chan struct{}
	MembersChanged() <-chan struct{}
	// FrontendAlive reports whether frontend id holds a live key;
	// Frontends are those that do. KnownFrontends adds the departed ones
	// (with their last presence), and FrontendsChanged is closed at the
	// next change of who is live.
	FrontendAlive(id string) bool
	Frontends() []projections.Frontend
	KnownFrontends() []projections.Frontend
	FrontendsChanged() <-chan struct{}
	// GuardView is the view as the request log's junk guard sees it.
	GuardView() retention.Fleet
}
