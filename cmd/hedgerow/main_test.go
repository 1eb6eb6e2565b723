package main

import (
	"fmt"
	"os"
	"testing"
)

// runMainEnv, set to 1 in a test binary's environment, makes the binary
// run the hedgerow command its arguments name instead of the tests, so a
// test runs a real hedgerow process without building one (startProcess).
const runMainEnv = "HEDGEROW_TEST_RUN_MAIN"

// TestMain points $XDG_STATE_HOME at a directory of this test run, so that
// serve's default JetStream store (defaultStoreDir) never lands in the
// user's own state directory.
func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
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
