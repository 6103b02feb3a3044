// Command baton is the one binary of baton: an embedded NATS server, the
// frontend, workers, and the whole stack on one machine, as subcommands.
//
// This package parses flags and environment variables (flag > environment >
// default), wires components together, and handles signals; nothing else.
// Exit codes: 0 after a graceful shutdown, 1 after a fatal error or an engine
// failure, 2 for bad flags or configuration (with a one-line reason).
package main
