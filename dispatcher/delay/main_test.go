package delay

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if any test leaves a goroutine behind: the package
// promises to start none.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
