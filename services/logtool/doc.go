// Package logtool is baton's log tooling, what `baton events` and `baton
// replay` do once cmd/baton has parsed their flags and connected: Tail
// prints the stored messages of baton's streams merged in time order (and
// follows new ones), ReadReplay rebuilds one request's timeline, state and
// answer from its events alone, folded exactly as a frontend folds them,
// and WriteReplay prints it. It reads the log and never writes it.
package logtool
