package main

import "syscall"

// childProcAttr makes a child process of a world die with its parent (the
// kernel sends it SIGKILL), so that no rank outlives a rank 0 that crashed.
func childProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
