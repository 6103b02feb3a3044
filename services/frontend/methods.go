package frontend

import (
	"net/http"
	"strings"
)

// allowedMethods are the methods with which mux routes r's path to a
// handler of its own (not the catch-all "/"): a request with another method
// on a known path is 405 with an Allow header (formerly 404, as for a path
// that does not exist: GET /v1/completions).
func allowedMethods(mux *http.ServeMux, r *http.Request) []string {
	var out []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
		if m == r.Method {
			continue
		}
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := mux.Handler(probe); pattern != "" && pattern != "/" {
			out = append(out, m)
		}
	}
	return out
}

// notFoundOrMethod answers a request that no route took: 405 when its path
// is a route for other methods, else 404.
func notFoundOrMethod(mux *http.ServeMux, w http.ResponseWriter, r *http.Request) bool {
	allowed := allowedMethods(mux, r)
	if len(allowed) == 0 {
		return false
	}
	w.Header().Set("Allow", strings.Join(allowed, ", "))
	writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
		r.Method+" is not allowed on "+r.URL.Path+"; allowed: "+strings.Join(allowed, ", "))
	return true
}
