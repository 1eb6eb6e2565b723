// Command hedgerow is the one binary of the hedgerow project: gateway,
// workers, the embedded all-in-one server, the simulator and its tools.
// This package only wires subcommands; the logic lives in the packages it calls.
package main

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=..." (make
// build, the Dockerfile: git describe); a build without it reports what Go
// recorded of it instead (buildVersion).
var version = "dev"

func init() { version = resolveVersion(version, debug.ReadBuildInfo) }

// resolveVersion is the version -X set (v), or, when none was set ("dev"),
// the one Go recorded in the binary: the module's version for `go install
// ...@v1.2.3`, else the commit it was built from (with "-dirty" for
// uncommitted changes), else "dev".
func resolveVersion(v string, read func() (*debug.BuildInfo, bool)) string {
	if v != "dev" {
		return v
	}
	info, ok := read()
	if !ok {
		return "dev"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev == "" {
		return "dev"
	}
	return "dev-" + rev[:min(len(rev), 12)] + dirty
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "hedgerow",
		Short: "Delayed, bounded, cancellable hedged requests for LLM APIs",
		Long: `hedgerow cuts the tail latency of LLM API calls: it sends one primary attempt,
launches one duplicate on an equivalent route only when the primary is slower than
the cohort's measured delay and every budget allows it, commits the first valid
result and cancels the rest.`,
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("hedgerow {{.Version}}\n") // as `hedgerow version` prints it
	root.AddCommand(
		newVersionCmd(), newConfigCmd(), newSimulateCmd(),
		newServeCmd(), newGatewayCmd(), newWorkerCmd(),
		newFakeLLMCmd(), newDemoCmd(), newBenchCmd(),
		newNATSAuthCmd(), newReportCmd(), newClusterCmd(), newRegionsCmd(), newFaultProxyCmd(),
		newHealthcheckCmd(),
	)
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the hedgerow version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "hedgerow %s\n", version)
			return err
		},
	}
}

// defaultGCPercent is the GOGC every hedgerow process runs with when its
// environment sets none. A gateway's heap is small and its garbage
// short-lived (messages, records, request bodies), so at Go's default of
// 100 the collector ran often: 8.8 % of serve's CPU at 1,000 groups/s in
// `make bench-path`'s profile, 4.2 % at 200 (docs/architecture.md §12, "The
// path's cost"). The heap may grow to three times what is live instead of
// twice; GOMEMLIMIT, which the deployments set, still bounds it.
const defaultGCPercent = 200

func main() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "hedgerow:", err)
		os.Exit(exitCode(err))
	}
}

// exitCoder is an error that carries its own process exit code.
type exitCoder interface{ ExitCode() int }

func exitCode(err error) int {
	if ec, ok := err.(exitCoder); ok {
		return ec.ExitCode()
	}
	return 1
}
