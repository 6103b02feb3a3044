package frontend

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/baton-dev/baton/services/frontend/openai"
)

// apiError is an error answered with OpenAI's error shape.
type apiError struct {
	status  int
	typ     string
	code    string
	message string
	param   string // the request field at fault, if one is: the body's "param"
}

func (e *apiError) Error() string { return e.message }

func badRequest(code, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: code, message: fmt.Sprintf(format, args...)}
}

// writeError answers with {"error":{"message","type","code"}}.
func writeError(w http.ResponseWriter, status int, typ, code, message string) {
	if status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", "1")
	}
	openai.WriteError(w, status, typ, code, message)
}

// paramError is e as an apiError: the same status, type, code, message and
// param (none when e names none, as chat's errors always had).
func paramError(e *openai.ParamError) *apiError {
	return &apiError{status: e.Status, typ: e.Type, code: e.Code, message: e.Message, param: e.Param}
}

func writeAPIError(w http.ResponseWriter, e *apiError) {
	if e.param == "" {
		writeError(w, e.status, e.typ, e.code, e.message)
		return
	}
	body := openai.ErrorBody(e.typ, e.code, e.message)
	body["param"] = e.param
	writeJSON(w, e.status, map[string]any{"error": body})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
