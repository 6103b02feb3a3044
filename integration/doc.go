// Package integration holds baton's end-to-end tests: they build the baton
// binary, start real processes (NATS, frontends, workers), drive them with
// real clients, break them (kill -9, SIGSTOP, SIGTERM) and check the
// invariants of DESIGN.md: output identical to a fault-free run, no token lost
// or repeated, a clear error where recovery is impossible.
package integration
