package events

import "errors"

// TypeRequestEnded is the type of a request's end as its owner stores it in
// the ends place (streams.EndsStream), beside the request log.
const TypeRequestEnded = "baton.request.ended.v1"

// RequestEnded is a request's end, written by the frontend that owns the
// request to the ends place, a stream of its own that token deltas cannot
// fill (docs/internals.md, "Terminal facts always fit"). It is written when
// the end is not the last word of the request's events subject in the log:
// the log refused the end (full), or the compact record that would carry
// it could not be stored. Exactly one of Failed, Completed and Cancelled is
// set: the end as the owner folded it, the same event the log holds (or
// would hold) for it.
//
// Through is the last sequence of the request log the owner had folded when
// the request ended: every reader applies the end after the request's events
// up to Through and before any stored after them, so all readers fold the
// same request whatever reached the log later; an end whose Through is below
// the request's accepted event belongs to an earlier request of the same id
// and is ignored.
type RequestEnded struct {
	RequestID string            `json:"request_id"`
	Frontend  string            `json:"frontend"`
	Through   uint64            `json:"through"`
	Failed    *RequestFailed    `json:"failed,omitempty"`
	Completed *RequestCompleted `json:"completed,omitempty"`
	Cancelled *RequestCancelled `json:"cancelled,omitempty"`
}

func (RequestEnded) EventType() string { return TypeRequestEnded }
func (e RequestEnded) Request() string { return e.RequestID }

// End is the end RequestEnded carries.
func (e RequestEnded) End() RequestEvent {
	switch {
	case e.Failed != nil:
		return *e.Failed
	case e.Completed != nil:
		return *e.Completed
	case e.Cancelled != nil:
		return *e.Cancelled
	}
	return nil
}

func (e *RequestEnded) validate() error {
	n := 0
	for _, set := range []bool{e.Failed != nil, e.Completed != nil, e.Cancelled != nil} {
		if set {
			n++
		}
	}
	if e.RequestID == "" || n != 1 {
		return errors.New("ended without request id or without exactly one end")
	}
	if end := e.End(); end.Request() != e.RequestID {
		return errors.New("ended: the end is another request's")
	}
	if e.Cancelled != nil && e.Cancelled.Mode != CancelKill {
		return errors.New("ended: a stop is not an end")
	}
	return nil
}

func init() { register[RequestEnded]() }
