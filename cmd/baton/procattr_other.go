//go:build !linux

package main

import "syscall"

// childProcAttr: without Pdeathsig, children of a killed `baton up` notice
// the lost parent only through their own shutdown paths.
func childProcAttr() *syscall.SysProcAttr { return nil }
