package migrations

import (
	"fmt"
	"net/http"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
)

// CodeUpstreamError is the RequestFailed code of a request that failed with
// an upstream server's own error answer, when the server gave no code.
const CodeUpstreamError = "upstream_error"

// answeredError reports whether attempt a was closed by its worker with an
// upstream server's error answer (an HTTP status of 500 or more, class
// unset) before it produced a token, or with an empty answer
// (events.CodeEmptyAnswer: a stream that ended before its first token). Such an answer may be caused by the
// request itself (Ollama answers 500 to an invalid JSON schema), so it is no
// evidence against the worker by itself: its worker is not inhibited (the
// worker re-probes its server, and a server that fails its probe takes the
// worker out of routing), and the request moves on.
func answeredError(a projections.Attempt) bool {
	return a.Closed && a.CloseClass == "" && a.Cut == a.StartOffset &&
		(a.CloseStatus >= http.StatusInternalServerError || a.CloseCode == events.CodeEmptyAnswer)
}

// sameAnswerElsewhere reports whether an earlier attempt of r than cur, on
// another worker, failed with the same answer before any token: then the
// request, not the workers, is at fault.
func sameAnswerElsewhere(r *projections.Request, cur projections.Attempt) bool {
	for _, a := range r.Attempts[:cur.Attempt] {
		if answeredError(a) && a.WorkerID != cur.WorkerID &&
			a.CloseStatus == cur.CloseStatus && a.CloseCode == cur.CloseCode && a.CloseMessage == cur.CloseMessage {
			return true
		}
	}
	return false
}

// lastAnswered is the last closed attempt of worker id, if it closed with an
// upstream's error answer before any token.
func lastAnswered(r *projections.Request, id string) (projections.Attempt, bool) {
	for i := len(r.Attempts) - 1; i >= 0; i-- {
		if a := r.Attempts[i]; a.WorkerID == id && a.Closed {
			return a, answeredError(a)
		}
	}
	return projections.Attempt{}, false
}

// failAnswered fails r with the upstream's answer that closed attempt a: its
// status, code and message, as a client calling the server directly would
// have seen them.
func (p Policy) failAnswered(r *projections.Request, m Memory, a projections.Attempt, rep Report) Action {
	code, msg := a.CloseCode, a.CloseMessage
	if code == "" {
		code = CodeUpstreamError
	}
	status := a.CloseStatus
	if status < http.StatusInternalServerError {
		status = http.StatusBadGateway // an empty answer: the server said nothing usable
	}
	if msg == "" {
		msg = fmt.Sprintf("the model server answered %d (%s)", status, http.StatusText(status))
	}
	return p.fail(r, m, code, msg, status, rep)
}
