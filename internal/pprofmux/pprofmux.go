// Package pprofmux is the mux of Go's profiling endpoints (/debug/pprof/)
// that baton's processes and the vLLM simulator serve with --pprof-addr,
// for measurements.
package pprofmux

import (
	"net/http"
	"net/http/pprof"
)

// New returns a mux serving net/http/pprof's handlers under /debug/pprof/.
func New() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
