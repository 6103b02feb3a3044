// Package freeport finds free TCP ports on the loopback interface, for the
// scripts and tests that start baton processes on ports they choose. A port
// is free only when it is found: another process may take it before the
// caller listens on it.
package freeport
