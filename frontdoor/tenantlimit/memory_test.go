package tenantlimit_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/frontdoor/tenantlimit"
	"github.com/hedgerow/hedgerow/frontdoor/tenantlimit/tenantlimittest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMemoryConforms(t *testing.T) {
	tenantlimittest.Run(t, func(t *testing.T, clock *tenantlimittest.Clock) tenantlimit.Store {
		return tenantlimit.NewMemory(clock.Now)
	})
}
