package integration

import "syscall"

// childProcAttr has the kernel kill a child process when the test process
// dies, so a test binary killed by its -timeout leaves no process behind.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
