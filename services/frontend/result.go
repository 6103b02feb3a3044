package frontend

import (
	"errors"
	"net/http"
)

// result is what a JSON handler answers, written by writeResult: a body
// with its status, or an error that writeResult maps to OpenAI's error shape.
type result struct {
	status int
	body   any
	err    error
}

// okResult is a 200 with body.
func okResult(body any) result { return result{status: http.StatusOK, body: body} }

// errResult answers err: an *apiError as it says, a lookupError as a
// failed lookup, anything else as a 500.
func errResult(err error) result { return result{err: err} }

// lookupError is a failed lookup of request id (the id the client named).
type lookupError struct {
	id  string
	err error
}

func (e *lookupError) Error() string { return "request " + e.id + ": " + e.err.Error() }
func (e *lookupError) Unwrap() error { return e.err }

// serverError is a 500 with code and err's message.
func serverError(code string, err error) *apiError {
	return &apiError{status: http.StatusInternalServerError, typ: "server_error", code: code, message: err.Error()}
}

// writeResult writes res: its body as JSON with its status, or its error
// mapped to OpenAI's error shape (writeAPIError, writeLookupError; any other
// error is a 500 internal_error).
func writeResult(w http.ResponseWriter, res result) {
	var apiErr *apiError
	var lookup *lookupError
	switch {
	case res.err == nil:
		writeJSON(w, res.status, res.body)
	case errors.As(res.err, &apiErr):
		writeAPIError(w, apiErr)
	case errors.As(res.err, &lookup):
		writeLookupError(w, lookup.id, lookup.err)
	default:
		writeError(w, http.StatusInternalServerError, "server_error", "internal_error", res.err.Error())
	}
}
