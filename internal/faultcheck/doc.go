// Package faultcheck checks that an injected fault took effect, for the
// integration tests and the chaos soak: a process sent SIGSTOP is in state T
// in /proc, one sent SIGCONT has left it, one sent SIGKILL is gone. A fault
// that silently did nothing (Dynamo's TCP-reset injection was a no-op for two
// test runs) would let a fault test pass without testing anything, so every
// check returns an error that names the process and what /proc said.
//
// The functions read Linux's /proc and the exit statuses they are given, and
// do nothing else. Process is a child process as both harnesses run it: Start
// reaps it on a goroutine; Pause, Resume and Kill send their signal and make
// the check; the owner keeps the process's output and names it in errors.
package faultcheck
