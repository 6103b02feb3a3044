package frontend

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestMethodNotAllowed(t *testing.T) {
	mux := http.NewServeMux()
	ok := func(w http.ResponseWriter, r *http.Request) {}
	mux.HandleFunc("POST /v1/completions", ok)
	mux.HandleFunc("GET /v1/requests/{id}", ok)
	mux.HandleFunc("POST /v1/requests/{id}/cancel", ok)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if !notFoundOrMethod(mux, w, r) {
			w.WriteHeader(http.StatusNotFound)
		}
	})
	for _, tc := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{"GET", "/v1/completions", 405, "POST"},
		{"DELETE", "/v1/requests/r1", 405, "GET"},
		{"GET", "/v1/requests/r1/cancel", 405, "POST"},
		{"GET", "/v1/nothing", 404, ""},
		{"POST", "/v1/completions", 200, ""},
	} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
		if rec.Code != tc.status || rec.Header().Get("Allow") != tc.allow {
			t.Errorf("%s %s: got %d Allow %q, want %d %q", tc.method, tc.path, rec.Code, rec.Header().Get("Allow"), tc.status, tc.allow)
		}
	}
}
