package streams

import "time"

// ReadBehind exposes readBehind to the external tests: it stands for the
// leader's answer after a lagging replica's.
var ReadBehind = readBehind

// MoveLeader makes the server named to lead stream.
var MoveLeader = moveLeader

// SetAppendWindow sets l's window of asynchronous appends (AppendWindow)
// before its first.
func SetAppendWindow(l *Log, n int) { l.async.max = n }

// SetAppendAckTimeout sets how long l's asynchronous appends wait for their
// acknowledgement (AppendAckTimeout), before its first.
func SetAppendAckTimeout(l *Log, d time.Duration) { l.async.timeout = d }
