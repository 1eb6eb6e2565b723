package main

import (
	"fmt"
	"os"
	"runtime/debug"
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

// `hedgerow --version` prints what `hedgerow version` prints.
func TestVersionFlagPrintsTheBuildVersion(t *testing.T) {
	flag, err := runRoot(t, "--version")
	if err != nil {
		t.Fatalf("--version: %v", err)
	}
	sub, err := runRoot(t, "version")
	if err != nil {
		t.Fatalf("version: %v", err)
	}
	if want := "hedgerow " + version + "\n"; flag != want || sub != want {
		t.Errorf("--version printed %q and version %q, want %q", flag, sub, want)
	}
}

// The version -X sets wins; without one, what Go recorded of the build.
func TestResolveVersionPrefersLdflagsThenWhatGoRecorded(t *testing.T) {
	info := func(main string, settings ...debug.BuildSetting) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			return &debug.BuildInfo{Main: debug.Module{Version: main}, Settings: settings}, true
		}
	}
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "0123456789abcdef0123"}
	for _, tc := range []struct {
		v    string
		read func() (*debug.BuildInfo, bool)
		want string
	}{
		{"v1.4.0-3-gabc", info("v9.9.9"), "v1.4.0-3-gabc"},
		{"dev", info("v1.2.3"), "v1.2.3"},
		{"dev", info("(devel)", rev), "dev-0123456789ab"},
		{"dev", info("(devel)", rev, debug.BuildSetting{Key: "vcs.modified", Value: "true"}), "dev-0123456789ab-dirty"},
		{"dev", info("(devel)"), "dev"},
		{"dev", func() (*debug.BuildInfo, bool) { return nil, false }, "dev"},
	} {
		if got := resolveVersion(tc.v, tc.read); got != tc.want {
			t.Errorf("resolveVersion(%q, ...) = %q, want %q", tc.v, got, tc.want)
		}
	}
}
