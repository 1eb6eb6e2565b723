package policy

import (
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

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

// The stall bound after the first token is derived from the cohort's
// inter-token gaps (docs/architecture.md §4 rule 4): the policy's
// stall_after_first_token (the cap) until 50 successful attempts measured a
// gap, then 4 × the P99 of their longest gaps, clamped to [stall_floor,
// cap]. Failed attempts are never samples; samples older than two
// generations are forgotten.
func TestTheStallBoundIsFourTimesTheCohortsP99GapClampedToFloorAndCap(t *testing.T) {
	const cohort = "default/general/stream/mt1024"
	t0 := time.Date(2026, 7, 31, 0, 0, 0, 0, time.UTC)
	type sample struct {
		n      int
		gap    time.Duration
		status schemas.StatusClass
		at     time.Duration // after t0
	}
	ok := func(n int, gap time.Duration) sample { return sample{n, gap, schemas.StatusOK, 0} }
	tests := []struct {
		name       string
		cap, floor time.Duration
		samples    []sample
		at         time.Duration // when the bound is read, after t0
		want       time.Duration
		tolerance  time.Duration // the sketch's 1% relative accuracy
	}{
		{name: "no samples: the cap", want: 2 * time.Second},
		{name: "49 samples are too few: the cap", samples: []sample{ok(stallSamples-1, 20*time.Millisecond)}, want: 2 * time.Second},
		{name: "tiny gaps: the floor", samples: []sample{ok(stallSamples, 3*time.Millisecond)}, want: 250 * time.Millisecond},
		{name: "mid gaps: four times the P99", samples: []sample{ok(100, 20*time.Millisecond), ok(100, 80*time.Millisecond)},
			want: 320 * time.Millisecond, tolerance: 4 * time.Millisecond},
		{name: "the P99, not the largest: one outlier in 200 is left out",
			samples: []sample{ok(199, 100*time.Millisecond), ok(1, 1900*time.Millisecond)},
			want:    400 * time.Millisecond, tolerance: 4 * time.Millisecond},
		{name: "huge gaps: the cap", samples: []sample{ok(100, time.Second)}, want: 2 * time.Second},
		{name: "failed attempts are no samples",
			samples: []sample{{100, 3 * time.Millisecond, schemas.StatusServerError, 0}, {100, 3 * time.Millisecond, schemas.StatusTimeout, 0}},
			want:    2 * time.Second},
		{name: "a floor equal to the cap pins the bound", cap: time.Second, floor: time.Second,
			samples: []sample{ok(100, 3*time.Millisecond)}, want: time.Second},
		{name: "a policy without a cap leaves the worker's default", cap: -1, samples: []sample{ok(100, 3*time.Millisecond)}, want: 0},
		{name: "the previous generation still counts", samples: []sample{ok(100, 3*time.Millisecond)},
			at: stallGeneration + time.Minute, want: 250 * time.Millisecond},
		{name: "two generations later the samples are forgotten: the cap", samples: []sample{ok(100, 3*time.Millisecond)},
			at: 2*stallGeneration + time.Second, want: 2 * time.Second},
		{name: "a new generation forgets the one before the last",
			samples: []sample{ok(100, time.Second), {60, 50 * time.Millisecond, schemas.StatusOK, stallGeneration + time.Second},
				{1, 50 * time.Millisecond, schemas.StatusOK, 2*stallGeneration + 2*time.Second}},
			at: 2*stallGeneration + 2*time.Second, want: 250 * time.Millisecond},
		{name: "two generations together", samples: []sample{ok(40, 100*time.Millisecond),
			{40, 100 * time.Millisecond, schemas.StatusOK, stallGeneration + time.Second}},
			at: stallGeneration + 2*time.Second, want: 400 * time.Millisecond, tolerance: 4 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := Default()
			p.StallFloor = 250 * time.Millisecond // the cases' own floor, below the default's
			if tc.cap != 0 {
				p.StallAfterFirstToken, p.StallFloor = max(tc.cap, 0), max(tc.floor, 0)
			}
			c, err := NewClass("default", p)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range tc.samples {
				for range s.n {
					c.ObserveTokenGap(cohort, t0.Add(s.at), s.status, s.gap)
				}
			}
			got := c.StallBound(cohort, t0.Add(tc.at))
			if d := got - tc.want; d < -tc.tolerance || d > tc.tolerance {
				t.Fatalf("stall bound %v, want %v (±%v)", got, tc.want, tc.tolerance)
			}
			if other := c.StallBound("default/general/stream/mt64", t0.Add(tc.at)); other != p.StallAfterFirstToken {
				t.Fatalf("another cohort's bound %v, want the cap %v: cohorts share no samples", other, p.StallAfterFirstToken)
			}
		})
	}
}
