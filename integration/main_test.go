package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// binDir holds the binaries the process tests build; TestMain removes it.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hedgerow-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration: temp dir for binaries:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "integration: leaked goroutines:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// binaries are the executables the process tests run.
type binaries struct {
	hedgerow   string
	natsServer string
}

var (
	buildOnce  sync.Once
	built      binaries
	buildError error
)

// buildTimeout bounds building both binaries; with a warm build cache it
// takes seconds, from a cold one it compiles nats-server and hedgerow.
const buildTimeout = 5 * time.Minute

// buildBinaries builds bin/hedgerow's command and the nats-server of the
// module version go.mod pins, once per test run, into binDir. A build that
// fails fails the test: a process test never silently skips.
func buildBinaries(t *testing.T) binaries {
	t.Helper()
	buildOnce.Do(func() {
		goCmd, err := exec.LookPath("go")
		if err != nil {
			buildError = fmt.Errorf("the go command is needed to build the binaries the process tests run: %w", err)
			return
		}
		b := binaries{hedgerow: filepath.Join(binDir, "hedgerow"), natsServer: filepath.Join(binDir, "nats-server")}
		for _, target := range []struct{ out, pkg string }{
			{b.hedgerow, "github.com/hedgerow/hedgerow/cmd/hedgerow"},
			{b.natsServer, "github.com/nats-io/nats-server/v2"},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
			out, err := exec.CommandContext(ctx, goCmd, "build", "-o", target.out, target.pkg).CombinedOutput()
			cancel()
			if err != nil {
				buildError = fmt.Errorf("go build -o %s %s: %w\n%s", target.out, target.pkg, err, out)
				return
			}
		}
		built = b
	})
	if buildError != nil {
		t.Fatalf("cannot build the binaries under test: %v", buildError)
	}
	return built
}
