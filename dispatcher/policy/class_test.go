package policy

import "testing"

func TestSpendEstimateWithoutMaxTokensIsTheCohortsP95Output(t *testing.T) {
	c := &Class{}
	const cohort = "default/general/non-stream/0"
	if got := c.OutputEstimate(cohort); got != initialOutputEstimate {
		t.Fatalf("a cohort with no answers: estimate %d, want %d", got, initialOutputEstimate)
	}
	for units := int64(1); units < outputSamples; units++ {
		c.ObserveOutput(cohort, units)
	}
	if got := c.OutputEstimate(cohort); got != initialOutputEstimate {
		t.Fatalf("%d answers are too few: estimate %d, want %d", outputSamples-1, got, initialOutputEstimate)
	}
	for units := int64(outputSamples); units <= 200; units++ {
		c.ObserveOutput(cohort, units)
	}
	// 1..200 output units: the P95 is 190, within the sketch's 1%.
	if got := c.OutputEstimate(cohort); got < 188 || got > 193 {
		t.Fatalf("estimate %d, want the P95 of 1..200 (190 ±1%%)", got)
	}
	if got := c.OutputEstimate("another/cohort"); got != initialOutputEstimate {
		t.Fatalf("another cohort borrowed the estimate: %d", got)
	}
}
