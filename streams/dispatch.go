package streams

import "errors"

// DispatchReply is a worker's answer to an events.Dispatch.
type DispatchReply struct {
	Accepted bool   `json:"accepted"`
	Reason   string `json:"reason,omitempty"` // why it refused: RefusedBusy, RefusedDraining, ...
}

// Reasons a worker refuses a dispatch.
const (
	RefusedBusy       = "busy"        // at --max-concurrent-requests
	RefusedDraining   = "draining"    // shutting down
	RefusedWrongModel = "wrong_model" // does not serve the model
	RefusedBadRequest = "bad_request" // malformed dispatch
	RefusedNotReady   = "not_ready"   // its upstream not probed yet, or refusing it
	RefusedOutputFull = "output_full" // a batched dispatch: its output stream is full (BATON_OUT_<worker> at its MaxBytes)
)

// ErrRefused marks a dispatch the worker declined.
var ErrRefused = errors.New("streams: dispatch refused")
