package events

import "errors"

// EndpointResponses is the endpoint of a request made through OpenAI's
// Responses API (POST /v1/responses): its Body is the client's response
// request, and engines get its rendering on chat (RequestAccepted.EngineBody).
const EndpointResponses = "responses"

// TypeResponseDeleted is the type of a response's tombstone.
const TypeResponseDeleted = "baton.request.deleted.v1"

// ResponseDeleted records that the client deleted a response
// (DELETE /v1/responses/{id}): from then on every frontend answers 404 for
// it, as for an id that does not exist. Its events stay in the log until
// retention removes them. Tenant is who asked.
type ResponseDeleted struct {
	RequestID string `json:"request_id"`
	Tenant    string `json:"tenant,omitempty"`
}

func (ResponseDeleted) EventType() string { return TypeResponseDeleted }
func (e ResponseDeleted) Request() string { return e.RequestID }

func (e *ResponseDeleted) validate() error {
	if e.RequestID == "" {
		return errors.New("deleted record without request id")
	}
	return nil
}

func init() { register[ResponseDeleted]() }
