//go:build !linux

package integration

import "syscall"

// childProcAttr is the default elsewhere: only Linux can tie a child's life
// to its parent's, so a test binary killed by its -timeout may leave
// processes behind there.
func childProcAttr() *syscall.SysProcAttr { return nil }
