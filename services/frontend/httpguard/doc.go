// Package httpguard bounds what one HTTP client can hold of the frontend:
// its connections (Listener: at most Config.MaxConnections open, a headroom
// of ProbeHeadroom kept for /live and /health, a cap per remote address,
// and a first byte within FirstByteTimeout; Overflow answers 503 on the
// headroom's connections to anything but a probe), its request body
// (ReadBody: read whole within a timeout and a size, then held once, Body),
// and its reading of the answer (WithWriteDeadline: a client that stops
// reading is let go). Its answers are in OpenAI's error shape.
package httpguard
