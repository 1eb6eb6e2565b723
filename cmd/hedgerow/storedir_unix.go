//go:build unix

package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// lockDir takes an exclusive, non-blocking lock on the file at path and
// writes this process's id in it; the lock ends with unlock or with the
// process. When another process holds it, the error wraps errStoreHeld and
// holder is the id that process wrote.
func lockDir(path string) (unlock func(), holder string, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, "", err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, string(bytes.TrimSpace(b)), errStoreHeld
		}
		return nil, "", fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { _ = f.Close() }, "", nil
}
