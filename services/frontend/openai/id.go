package openai

import (
	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
)

// openaiID is the id of a request in OpenAI's response objects ("cmpl-…",
// "chatcmpl-…"): the client's own id, without the tenant that the internal
// id carries (formerly "cmpl-alice:a-done").
func openaiID(acc events.RequestAccepted) string {
	_, id := streams.SplitRequestID(acc.RequestID)
	return id
}
