package config

import (
	"slices"
	"testing"

	"github.com/hedgerow/hedgerow/budgets/lease"
)

// The kinds global.ceilings may name are the kinds whose lease gauges a
// region exports from its start (lease.CeilingKinds): a kind added to one
// list and not the other would be leased without its gauges, or export
// gauges of a kind never leased.
func TestLeasableCeilingsAreTheKindsARegionExportsFromTheStart(t *testing.T) {
	if !slices.Equal(LeasableCeilings, lease.CeilingKinds) {
		t.Errorf("LeasableCeilings %v, lease.CeilingKinds %v: want the same kinds", LeasableCeilings, lease.CeilingKinds)
	}
}
