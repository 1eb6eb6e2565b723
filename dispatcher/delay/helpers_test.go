package delay

import (
	"math"
	"math/rand/v2"
	"sort"
	"time"
)

// t0 is the virtual clock's origin in tests: a real date, like the simulator's.
var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

var testCohort = NewCohort("chat", "gpt4o", true, 512)

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }

// lognormal draws from a lognormal with the given median and σ (of the log).
func lognormal(r *rand.Rand, median time.Duration, sigma float64) time.Duration {
	return time.Duration(float64(median) * math.Exp(sigma*r.NormFloat64()))
}

// gpt4oTTFT draws a time to first byte from docs/architecture.md §11's gpt4o model, a hang
// counted at the 30 s deadline.
func gpt4oTTFT(r *rand.Rand) time.Duration {
	switch u := r.Float64(); {
	case u < 0.975:
		return lognormal(r, 620*time.Millisecond, 0.33)
	case u < 0.998:
		return lognormal(r, 3500*time.Millisecond, 0.45)
	default:
		return 30 * time.Second
	}
}

// exactQuantile is the q-quantile of xs at rank q·(n−1), DDSketch's convention.
func exactQuantile(xs []time.Duration, q float64) time.Duration {
	s := append([]time.Duration(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(math.Round(q*float64(len(s)-1)))]
}

func relErr(got, want time.Duration) float64 {
	return math.Abs(float64(got)-float64(want)) / float64(want)
}

func mustEstimator(t interface {
	Helper()
	Fatalf(string, ...any)
}, cfg Options) *Estimator {
	t.Helper()
	e, err := NewEstimator(cfg)
	if err != nil {
		t.Fatalf("NewEstimator: %v", err)
	}
	return e
}
