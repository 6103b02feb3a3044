package main

import "syscall"

// childProcAttr makes the kernel SIGKILL a child when `baton up` dies, even by
// SIGKILL, so no worker outlives its supervisor. (Pdeathsig fires when the
// creating OS thread exits; Go only retires threads that a goroutine locked
// and never unlocked, which baton does not do.) The child stays in the
// parent's process group: signals are forwarded to it explicitly.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
