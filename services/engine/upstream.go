package engine

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/baton-dev/baton/events"
)

// UpstreamError is a failure of the server behind an engine, classified for
// the frontend's decision (events.AttemptFailed.Class).
type UpstreamError struct {
	// Class is events.FailureClient, FailureUnavailable, FailureNotReady, or
	// "" for a failure of the engine itself (5xx, a cut connection, a
	// malformed or truncated stream, a first-token timeout).
	Class string
	// Status, Code and Message are the server's HTTP status, error code and
	// message, when it answered with an error.
	Status  int
	Code    string
	Message string
	// RetryAfter is the server's Retry-After, when it sent one.
	RetryAfter time.Duration
}

func (e *UpstreamError) Error() string {
	var b strings.Builder
	b.WriteString("engine: upstream")
	if e.Status != 0 {
		fmt.Fprintf(&b, " %d", e.Status)
	}
	if e.Code != "" {
		fmt.Fprintf(&b, " (%s)", e.Code)
	}
	b.WriteString(": ")
	b.WriteString(e.Message)
	return b.String()
}

// ClassOf is the failure class of an upstream's HTTP status.
func ClassOf(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		return events.FailureClient
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound:
		return events.FailureNotReady
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return events.FailureUnavailable
	}
	return ""
}

// upstreamStatusError reads an error response: vLLM's and OpenAI's
// {"error":{"message","type","code"}}, older vLLM's {"object":"error",...},
// FastAPI's {"detail":...} and {"error":"..."}; anything else as text.
func upstreamStatusError(status int, header http.Header, body []byte) *UpstreamError {
	e := &UpstreamError{Class: ClassOf(status), Status: status}
	e.Code, e.Message = parseErrorBody(body)
	if e.Message == "" {
		e.Message = http.StatusText(status)
	}
	e.RetryAfter = parseRetryAfter(header.Get("Retry-After"), time.Now())
	return e
}

func parseErrorBody(body []byte) (code, message string) {
	var env struct {
		Error   json.RawMessage `json:"error"`
		Detail  json.RawMessage `json:"detail"`
		Message string          `json:"message"`
		Code    json.RawMessage `json:"code"`
		Type    string          `json:"type"`
	}
	if json.Unmarshal(body, &env) != nil {
		return "", strings.TrimSpace(string(body))
	}
	var inner struct {
		Message string          `json:"message"`
		Code    json.RawMessage `json:"code"`
		Type    string          `json:"type"`
	}
	var text string
	switch {
	case json.Unmarshal(env.Error, &inner) == nil && inner.Message != "":
		return codeString(inner.Code, inner.Type), inner.Message
	case json.Unmarshal(env.Error, &text) == nil && text != "":
		return "", text
	case env.Message != "":
		return codeString(env.Code, env.Type), env.Message
	case len(env.Detail) > 0:
		if json.Unmarshal(env.Detail, &text) == nil {
			return "", text
		}
		return "", string(env.Detail)
	}
	return "", strings.TrimSpace(string(body))
}

// codeString is an error's code: a string code, else its type (a numeric
// code repeats the status).
func codeString(code json.RawMessage, typ string) string {
	var s string
	if json.Unmarshal(code, &s) == nil && s != "" {
		return s
	}
	return typ
}

// parseRetryAfter reads Retry-After: delay seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s > 0 {
		return time.Duration(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
