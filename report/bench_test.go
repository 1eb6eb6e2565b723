package report

import (
	"testing"
	"time"
)

// BenchmarkCompute100kGroups is the cost of one report over 100,000
// groups (about 225,000 records), bootstrap included: what a gateway's
// report endpoint spends on a busy hour.
func BenchmarkCompute100kGroups(b *testing.B) {
	recs := readLinesB(b, Generated(b, 9, 100_000, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)))
	b.ResetTimer()
	for b.Loop() {
		if rep := Compute(recs, Options{}); rep.Total.Gain == nil {
			b.Fatal("no gain")
		}
	}
}
