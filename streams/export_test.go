package streams

// ReadBehind exposes readBehind to the external tests: it stands for the
// leader's answer after a lagging replica's.
var ReadBehind = readBehind

// MoveLeader makes the server named to lead stream.
var MoveLeader = moveLeader
