package workload

import (
	"fmt"
	"math"
	"time"
)

// TimeScale converts model time into real time for live runs (the fake LLM
// server, the demo): with factor 0.001 a 3.5 s stall takes 3.5 ms, so a live
// run covers hours of workload in seconds. The zero TimeScale is real time.
type TimeScale struct {
	realPerModel float64 // 0 means 1
}

// NewTimeScale returns the scale where one model second takes factor real
// seconds.
func NewTimeScale(factor float64) (TimeScale, error) {
	if !(factor > 0) || math.IsInf(factor, 0) {
		return TimeScale{}, fmt.Errorf("time scale %v must be finite and > 0", factor)
	}
	return TimeScale{realPerModel: factor}, nil
}

// SecondsAsMilliseconds is the scale of docs/architecture.md §11 for live runs: a model
// second takes a real millisecond.
func SecondsAsMilliseconds() TimeScale { return TimeScale{realPerModel: 1e-3} }

// Factor returns real seconds per model second.
func (s TimeScale) Factor() float64 {
	if s.realPerModel == 0 {
		return 1
	}
	return s.realPerModel
}

// Real converts a model duration into the real duration to wait; Never
// stays Never.
func (s TimeScale) Real(model time.Duration) time.Duration { return scale(model, s.Factor()) }

// Model converts a measured real duration back into model time; Never stays
// Never.
func (s TimeScale) Model(real time.Duration) time.Duration { return scale(real, 1/s.Factor()) }

func scale(d time.Duration, f float64) time.Duration {
	if d == Never {
		return Never
	}
	x := float64(d) * f
	switch {
	case x >= float64(Never):
		return Never
	case x <= math.MinInt64:
		return time.Duration(math.MinInt64)
	}
	return time.Duration(math.Round(x))
}
