package workload

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Empirical is a workload measured rather than modelled: the distribution of
// how a primary attempt ends, estimated from recorded traffic
// (docs/architecture.md §11, what-if on your own traffic). A Model carrying
// one draws its requests and attempts from it instead of from the
// lognormal fits; everything else (billing after a disconnect, the
// simulator's handling of the draw) is unchanged.
type Empirical struct {
	// Ends are the first-byte and error atoms of an attempt, in time order,
	// each with its probability; the probability left over is a hang (no
	// first byte before the deadline).
	Ends []EndAtom
	// ITL are measured inter-token latencies, sorted; one is drawn per
	// attempt, as the model draws one.
	ITL []time.Duration
	// Tokens are measured (input, output) token counts of requests, drawn
	// as a pair: a request's prompt and answer lengths are not independent
	// in real traffic.
	Tokens []TokenCounts
}

// EndAtom is one possible end of the wait for an attempt's first byte.
type EndAtom struct {
	// At is the time since the attempt's start.
	At time.Duration
	// Error is set when the attempt fails (5xx) at At instead of sending its
	// first byte.
	Error bool
	// P is the atom's probability.
	P float64
}

// TokenCounts are a request's prompt and full answer lengths.
type TokenCounts struct {
	Input, Output int
}

// ErrEmptyEmpirical is returned for an empirical workload that has nothing
// to draw from.
var ErrEmptyEmpirical = errors.New("empirical workload is empty")

// PrimaryEnd is how one recorded primary attempt ended, as far as its
// record tells: a first byte or an error at At, or, Censored, still waiting
// at At when it was cancelled (another attempt won, the deadline passed).
type PrimaryEnd struct {
	At       time.Duration
	Error    bool
	Censored bool
}

// EndDistribution estimates the distribution of a primary's first byte
// (or error) from recorded primaries, some of them censored: a primary
// cancelled because its hedge won says only that its first byte came later
// than its cancellation. The estimate is the Kaplan–Meier product limit
// with the two ends as competing risks (the Aalen–Johansen cumulative
// incidences): at each recorded time the primaries still waiting are the
// risk set, and censored ones leave it without an end. Dropping censored
// primaries instead would erase exactly the stalls hedging rescued; counting
// them as ending at their cancellation would shorten them. The probability
// the risk set leaves unspent past the last end is returned as hangs by the
// Empirical holding the atoms.
func EndDistribution(ends []PrimaryEnd) ([]EndAtom, error) {
	if len(ends) == 0 {
		return nil, fmt.Errorf("%w: no primaries", ErrEmptyEmpirical)
	}
	sorted := slices.Clone(ends)
	for _, e := range sorted {
		if e.At < 0 {
			return nil, fmt.Errorf("primary end at %v: negative time", e.At)
		}
	}
	// Ends before censorings at the same time: a primary cancelled at t was
	// still waiting at t, so it is at risk for the ends at t.
	slices.SortFunc(sorted, func(a, b PrimaryEnd) int {
		if a.At != b.At {
			return int(min(max(a.At-b.At, -1), 1))
		}
		return boolOrder(a.Censored) - boolOrder(b.Censored)
	})
	var atoms []EndAtom
	atRisk := float64(len(sorted))
	survival := 1.0
	for i := 0; i < len(sorted); {
		t := sorted[i].At
		var firstBytes, errs, censored int
		for ; i < len(sorted) && sorted[i].At == t; i++ {
			switch {
			case sorted[i].Censored:
				censored++
			case sorted[i].Error:
				errs++
			default:
				firstBytes++
			}
		}
		if errs > 0 {
			atoms = append(atoms, EndAtom{At: t, Error: true, P: survival * float64(errs) / atRisk})
		}
		if firstBytes > 0 {
			atoms = append(atoms, EndAtom{At: t, P: survival * float64(firstBytes) / atRisk})
		}
		survival *= 1 - float64(errs+firstBytes)/atRisk
		atRisk -= float64(errs + firstBytes + censored)
	}
	if len(atoms) == 0 {
		return nil, fmt.Errorf("%w: every primary was cancelled before it ended", ErrEmptyEmpirical)
	}
	return atoms, nil
}

func boolOrder(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (e *Empirical) validate() error {
	if len(e.Ends) == 0 || len(e.ITL) == 0 || len(e.Tokens) == 0 {
		return fmt.Errorf("%w: %d ends, %d inter-token latencies, %d token counts", ErrEmptyEmpirical, len(e.Ends), len(e.ITL), len(e.Tokens))
	}
	var total float64
	for _, a := range e.Ends {
		if a.At < 0 || !(a.P >= 0) {
			return fmt.Errorf("empirical end at %v with probability %v", a.At, a.P)
		}
		total += a.P
	}
	if total > 1+1e-9 {
		return fmt.Errorf("empirical ends sum to probability %v > 1", total)
	}
	if !slices.IsSorted(e.ITL) || e.ITL[0] <= 0 {
		return errors.New("empirical inter-token latencies must be sorted and > 0")
	}
	for _, tc := range e.Tokens {
		if tc.Input < 0 || tc.Output < 1 {
			return fmt.Errorf("empirical token counts %d in, %d out (want ≥ 0 and ≥ 1)", tc.Input, tc.Output)
		}
	}
	return nil
}

// request draws a request's token counts with the request's uniform u.
func (e *Empirical) request(u float64) (input, output int) {
	tc := e.Tokens[pick(u, len(e.Tokens))]
	return tc.Input, tc.Output
}

// end draws how an attempt ends with the attempt's uniform u; ok is false
// for a hang.
func (e *Empirical) end(u float64) (EndAtom, bool) {
	for _, a := range e.Ends {
		if u < a.P {
			return a, true
		}
		u -= a.P
	}
	return EndAtom{}, false
}

// itl draws an inter-token latency from a standard normal z (its uniform
// is Φ(z)), so the draw order of Provider.Attempt stays the same.
func (e *Empirical) itl(z float64) time.Duration {
	u := 0.5 * math.Erfc(-z/math.Sqrt2)
	return e.ITL[pick(u, len(e.ITL))]
}

// pick maps a uniform in [0, 1) to an index below n.
func pick(u float64, n int) int { return min(max(int(u*float64(n)), 0), n-1) }

// attempt completes a drawn attempt from the attempt's uniform u and normal
// z: a hang, an error at its atom's time, or a first byte and a stream.
func (e *Empirical) attempt(a Attempt, u, z float64) Attempt {
	end, ok := e.end(u)
	switch {
	case !ok:
		a.Outcome, a.FirstByte, a.End = OutcomeHang, Never, Never
	case end.Error:
		a.Outcome, a.FirstByte, a.End = OutcomeServerError, Never, end.At
	default:
		a.Outcome, a.FirstByte, a.ITL = OutcomeOK, end.At, e.itl(z)
		a.End = addSaturating(a.FirstByte, durationMul(a.ITL, a.Request.OutputTokens))
	}
	return a
}
