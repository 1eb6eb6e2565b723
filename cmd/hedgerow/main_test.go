package main

import (
	"fmt"
	"os"
	"testing"
)

// TestMain points $XDG_STATE_HOME at a directory of this test run, so that
// serve's default JetStream store (defaultStoreDir) never lands in the
// user's own state directory.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hedgerow-cmd-state-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "state directory:", err)
		os.Exit(1)
	}
	os.Setenv("XDG_STATE_HOME", dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
