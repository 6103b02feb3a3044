package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// addPprofFlag adds --pprof-addr: a listen address for Go's profiling
// endpoints (/debug/pprof/), off unless set. It is for measurements
// (scripts/bench profiles the processes with it); never expose it.
func addPprofFlag(f *flagSet) *string {
	addr := new(string)
	f.StringVar(addr, "pprof-addr", "", "serve Go profiles (/debug/pprof/) on this `address`, such as 127.0.0.1:6060, for measurements; off unless set")
	f.showDefault("pprof-addr", "off")
	return addr
}

// servePprof serves /debug/pprof/ on addr until ctx is done; with an empty
// addr it does nothing. A listen failure is a configuration error.
func servePprof(ctx context.Context, addr string, log *slog.Logger) error {
	if addr == "" {
		return nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return badConfig(fmt.Errorf("--pprof-addr %s: %w", addr, err))
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("pprof server", "err", err)
		}
	}()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	log.Info("serving profiles", "addr", l.Addr().String())
	return nil
}
