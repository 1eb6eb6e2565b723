package main

import (
	"math"
	"time"

	"github.com/hedgerow/hedgerow/internal/tools/loadgen"
)

// stepSearch finds the highest open-loop rate a target sustains, by steps:
// from start it doubles while a step passes (up to max), halves while one
// fails (down to min), and once one rate passed and a higher one failed it
// tries their geometric mean, refine times at most or until they are
// within resolution of each other. Every step is one bounded load run, so
// the search ends after at most log2(max/min) + refine + 1 steps.
type stepSearch struct {
	start, min, max float64
	refine          int
	// resolution: stop refining once failed/passed is at most this.
	resolution float64

	passed, failed float64 // highest rate that passed, lowest that failed; 0: none yet
	refined        int
}

// next returns the rate of the next step, or false when the search is over.
func (s *stepSearch) next() (float64, bool) {
	switch {
	case s.passed == 0 && s.failed == 0:
		return s.start, true
	case s.failed == 0: // every step passed
		if s.passed >= s.max {
			return 0, false
		}
		return min(s.passed*2, s.max), true
	case s.passed == 0: // every step failed
		if s.failed <= s.min {
			return 0, false
		}
		return max(s.failed/2, s.min), true
	}
	if s.refined >= s.refine || s.failed/s.passed <= s.resolution {
		return 0, false
	}
	s.refined++
	return roundRate(math.Sqrt(s.passed * s.failed)), true
}

// record keeps a step's outcome.
func (s *stepSearch) record(rate float64, ok bool) {
	if ok {
		s.passed = max(s.passed, rate)
	} else if s.failed == 0 || rate < s.failed {
		s.failed = rate
	}
}

// best is the highest rate that passed (0: none did), and whether the
// search stopped at its max rather than at a failure.
func (s *stepSearch) best() (rate float64, capped bool) {
	return s.passed, s.failed == 0 && s.passed >= s.max
}

// roundRate rounds a rate to two significant figures (1,414 → 1,400), so
// the steps read as round numbers.
func roundRate(r float64) float64 {
	if r <= 0 {
		return 0
	}
	unit := math.Pow(10, math.Floor(math.Log10(r))-1)
	return math.Round(r/unit) * unit
}

// stepVerdict says whether a step sustained its rate: every request
// answered, none held back by the generator's in-flight cap (the load was
// open-loop throughout), and the P99 of the answers within bound.
func stepVerdict(t loadgen.TargetReport, capDelayed int, bound time.Duration) (bool, string) {
	switch {
	case t.Requests == 0:
		return false, "no requests"
	case t.Errors > 0:
		return false, "errors"
	case capDelayed > 0:
		return false, "in-flight cap reached"
	case t.Latency.P99 > float64(bound)/float64(time.Millisecond):
		return false, "p99 over bound"
	}
	return true, "ok"
}
