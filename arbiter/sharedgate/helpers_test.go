package sharedgate

import (
	"context"
	"testing"

	"github.com/hedgerow/hedgerow/arbiter"
)

// mustClaim is arbiter's test helper of the same name: a claim that must
// not fail.
func mustClaim(t *testing.T, g arbiter.Gate, ua, group string, attempt int) arbiter.Claim {
	t.Helper()
	c, err := g.Claim(context.Background(), ua, group, attempt)
	if err != nil {
		t.Fatalf("Claim(%s, %s, %d): %v", ua, group, attempt, err)
	}
	return c
}
