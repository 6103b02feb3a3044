// Package migrations holds the request-migration policy: whether a failed
// request may be re-dispatched (--migration-limit, --migration-max-seq-len)
// and how its continuation is built from the replay state. It is pure: no I/O,
// no logging.
package migrations
