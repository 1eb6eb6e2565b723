package workload

import (
	"fmt"
	"math"
	"time"
)

// The uneven routes of docs/architecture.md §11: production routes are
// rarely equal — one provider region degrades, one key sits near its limit —
// and a hedger that measures every route should pull ahead there, where a
// static hedger keeps sending its primary to the route that is worst today.
const (
	// UnevenStallFactor multiplies the degraded route's stall share (gpt4o:
	// 2.3 % → 4.6 %).
	UnevenStallFactor = 2.0
	// UnevenSpeedFactor multiplies the degraded route's decode speed
	// (gpt4o: 130 → 65 tokens/s): a slower body.
	UnevenSpeedFactor = 0.5
	// DegradingAt is when the degrading model's route turns bad unless
	// ForRun places it at the run's midpoint: the midpoint of a 60,000-
	// request run at the pinned 50 arrivals per second.
	DegradingAt = 20 * time.Minute
)

// RouteShift makes one route of a model worse than its siblings from a
// point of the run on: an attempt that reaches the route at or after From
// stalls StallFactor times as often (the same draws: an attempt that
// stalled before still stalls) and decodes at SpeedFactor times the speed.
// Only the lognormal models shift; an empirical model is one route's
// measurement.
type RouteShift struct {
	// Route is the index of the route that shifts.
	Route int
	// From is the model time the shift begins; 0 is the whole run.
	From time.Duration
	// AtFraction, when > 0, places From at that fraction of the run's
	// length once ForRun is told it; until then From stands.
	AtFraction float64
	// StallFactor multiplies TTFT.StallFraction.
	StallFactor float64
	// SpeedFactor multiplies TokensPerSecond.
	SpeedFactor float64
}

// UnevenShift is the degraded route of the uneven and degrading models,
// for the whole run: route 0, twice the stall share, half the decode speed.
// Set on any lognormal model it makes that model's routes uneven.
func UnevenShift() *RouteShift {
	return &RouteShift{Route: 0, StallFactor: UnevenStallFactor, SpeedFactor: UnevenSpeedFactor}
}

// ForRun places a shift given as a fraction of the run (AtFraction) at that
// share of a run of the given length, in model time. Models without such a
// shift are unchanged.
func (m *Model) ForRun(length time.Duration) {
	if m.Shift != nil && m.Shift.AtFraction > 0 {
		m.Shift.From = durationOf(m.Shift.AtFraction * length.Seconds())
	}
}

// shifted reports whether an attempt reaching route at start is shifted.
func (s *RouteShift) shifted(route int, start time.Duration) bool {
	return s != nil && route == s.Route && start >= s.From
}

func (s *RouteShift) validate(m *Model) error {
	switch {
	case m.Empirical != nil:
		return fmt.Errorf("route shift: an empirical model does not shift")
	case s.Route < 0 || (m.Degradation != nil && s.Route >= m.Degradation.Routes):
		return fmt.Errorf("route shift: %w %d", ErrNoSuchRoute, s.Route)
	case s.From < 0:
		return fmt.Errorf("route shift: from %v must be ≥ 0", s.From)
	case !validFraction(s.AtFraction):
		return fmt.Errorf("route shift: at fraction %v must be in [0, 1]", s.AtFraction)
	case !(s.StallFactor >= 0) || math.IsInf(s.StallFactor, 0) || m.TTFT.StallFraction*s.StallFactor+m.TTFT.HangFraction > 1:
		return fmt.Errorf("route shift: stall factor %v must be ≥ 0 and keep the stall share %v × it plus hangs %v ≤ 1",
			s.StallFactor, m.TTFT.StallFraction, m.TTFT.HangFraction)
	case !(s.SpeedFactor > 0) || math.IsInf(s.SpeedFactor, 0):
		return fmt.Errorf("route shift: speed factor %v must be finite and > 0", s.SpeedFactor)
	}
	return nil
}
