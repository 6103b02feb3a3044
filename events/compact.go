package events

import (
	"encoding/json"
	"errors"
)

// TypeRequestCompacted is the type of a finished request's compact record.
const TypeRequestCompacted = "baton.request.compacted.v1"

// RequestCompacted is a finished request's compact record: the state its
// history folds to, written once the request is terminal, after which the
// token deltas of its attempts (and what else its tokens subjects hold) are
// purged from the log. It is appended by a frontend on the request's events
// subject, which only frontends may write, so a reader trusts it from there
// alone (the fold ignores it on any other subject).
//
// State is the projection's own encoding of everything the deltas carried
// (text, token ids, per-token details, finish reason, usage, every
// attempt's worker, range and cut): the projections package defines and
// reads it, so the record is exactly what every rendering (SSE resume,
// unary, re-POST attach, replay, console) would have folded from the
// deltas. Through is the last stream sequence the state covers.
type RequestCompacted struct {
	RequestID string          `json:"request_id"`
	Through   uint64          `json:"through"`
	Tokens    int             `json:"tokens"` // tokens the state holds, for people and `baton events`
	State     json.RawMessage `json:"state"`
}

func (RequestCompacted) EventType() string { return TypeRequestCompacted }
func (e RequestCompacted) Request() string { return e.RequestID }

func (e *RequestCompacted) validate() error {
	if e.RequestID == "" || len(e.State) == 0 {
		return errors.New("compacted record without request id or state")
	}
	return nil
}

func init() { register[RequestCompacted]() }
