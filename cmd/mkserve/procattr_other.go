//go:build !linux

package main

import "syscall"

// childProcAttr: no parent-death signal outside Linux (the children stop
// when their stdin closes or a world timeout passes).
func childProcAttr() *syscall.SysProcAttr { return nil }
