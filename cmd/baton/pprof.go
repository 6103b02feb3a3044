package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/baton-dev/baton/internal/pprofmux"
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
	srv := &http.Server{Handler: pprofmux.New(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("pprof server", "err", err)
		}
	}()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	log.Info("serving profiles", "addr", l.Addr().String())
	return nil
}
