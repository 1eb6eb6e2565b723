package workload

import (
	"math"
	"testing"
	"time"
)

// overlap returns the fraction of [0, horizon) each route spends degraded and
// the correlation of the two degraded indicators, integrated exactly over
// the episodes rather than sampled.
func overlap(a, b []Episode, horizon time.Duration) (fa, fb, corr float64) {
	clip := func(e Episode) Episode {
		return Episode{Start: max(e.Start, 0), End: min(e.End, horizon)}
	}
	total := func(eps []Episode) (s float64) {
		for _, e := range eps {
			e = clip(e)
			s += (e.End - e.Start).Seconds()
		}
		return s
	}
	var both float64
	for i, j := 0, 0; i < len(a) && j < len(b); {
		x, y := clip(a[i]), clip(b[j])
		if lo, hi := max(x.Start, y.Start), min(x.End, y.End); hi > lo {
			both += (hi - lo).Seconds()
		}
		if x.End < y.End {
			i++
		} else {
			j++
		}
	}
	T := horizon.Seconds()
	fa, fb = total(a)/T, total(b)/T
	corr = (both/T - fa*fb) / math.Sqrt(fa*(1-fa)*fb*(1-fb))
	return fa, fb, corr
}

// degradedHorizon is about 33 000 episode cycles per route and seed.
const degradedHorizon = 10_000_000 * time.Second

func TestDegradedRoutesSpendTheStationaryFractionDegraded(t *testing.T) {
	m := mustModel(t, Degraded)
	want := m.Degradation.StationaryFraction()
	if want != 0.4 {
		t.Fatalf("stationary fraction %v, want 0.4 (2 min episodes every 5 min)", want)
	}
	g := mustGenerator(t, m, 101)
	for route := range 3 {
		eps, err := g.DegradedEpisodes(route, degradedHorizon)
		if err != nil {
			t.Fatal(err)
		}
		f, _, _ := overlap(eps, eps, degradedHorizon)
		t.Logf("route %d: degraded %.4f of the time, %d episodes", route, f, len(eps))
		if !within(f, want, 0.03) {
			t.Errorf("route %d degraded %.4f of the time, want %.2f", route, f, want)
		}
		// Episode starts every 5 min on average; each lasts 1–3 min.
		cycle := degradedHorizon.Seconds() / float64(len(eps))
		if !within(cycle, 300, 0.03) {
			t.Errorf("route %d: one episode every %.1f s, want 300 s", route, cycle)
		}
		for _, e := range eps {
			if d := e.End - e.Start; d < time.Minute || d > 3*time.Minute {
				t.Fatalf("route %d: episode %v lasts %v, want 1–3 min", route, e, d)
			}
		}
	}
}

func TestDegradedRoutesAreCorrelated(t *testing.T) {
	m := mustModel(t, Degraded)
	var sum float64
	var n int
	for seed := uint64(1); seed <= 3; seed++ {
		g := mustGenerator(t, m, seed)
		eps := make([][]Episode, 3)
		for r := range eps {
			var err error
			if eps[r], err = g.DegradedEpisodes(r, degradedHorizon); err != nil {
				t.Fatal(err)
			}
		}
		for _, pair := range [][2]int{{0, 1}, {0, 2}, {1, 2}} {
			_, _, c := overlap(eps[pair[0]], eps[pair[1]], degradedHorizon)
			if math.Abs(c-0.3) > 0.05 {
				t.Errorf("seed %d routes %v: correlation %.3f, want 0.30 ± 0.05", seed, pair, c)
			}
			sum += c
			n++
		}
	}
	mean := sum / float64(n)
	t.Logf("mean pairwise correlation %.4f over %d pairs", mean, n)
	if math.Abs(mean-m.Degradation.TargetCorrelation) > 0.02 {
		t.Errorf("mean pairwise correlation %.3f, want %.2f ± 0.02", mean, m.Degradation.TargetCorrelation)
	}
}

func TestIndependentRoutesAreUncorrelatedWithoutCommonShocks(t *testing.T) {
	m := mustModel(t, Degraded)
	m.Degradation.CommonShare = 0
	g := mustGenerator(t, m, 9)
	a, _ := g.DegradedEpisodes(0, degradedHorizon)
	b, _ := g.DegradedEpisodes(1, degradedHorizon)
	if _, _, c := overlap(a, b, degradedHorizon); math.Abs(c) > 0.03 {
		t.Errorf("correlation %.3f without common shocks, want ≈ 0", c)
	}
}

func TestDegradedScheduleDoesNotDependOnQueryOrder(t *testing.T) {
	forward := mustGenerator(t, mustModel(t, Degraded), 77)
	backward := mustGenerator(t, mustModel(t, Degraded), 77)
	pf := mustProvider(t, forward, 2, RateLimit{})
	pb := mustProvider(t, backward, 2, RateLimit{})
	const steps = 5000
	got := make([]bool, steps)
	for i := steps - 1; i >= 0; i-- {
		got[i] = pb.Degraded(time.Duration(i) * 7 * time.Second)
	}
	degraded := 0
	for i := range steps {
		want := pf.Degraded(time.Duration(i) * 7 * time.Second)
		if got[i] != want {
			t.Fatalf("at %v: backward query says %v, forward %v", time.Duration(i)*7*time.Second, got[i], want)
		}
		if want {
			degraded++
		}
	}
	if degraded == 0 || degraded == steps {
		t.Errorf("route degraded at %d of %d samples: the schedule is not alternating", degraded, steps)
	}
}

func TestDegradedAttemptsAreSlowerAndFailMore(t *testing.T) {
	g := mustGenerator(t, mustModel(t, Degraded), 13)
	p := mustProvider(t, g, 0, RateLimit{})
	var healthyTTFT, degradedTTFT []float64
	var healthyN, healthyErr, degradedN, degradedErr int
	for i := range 200_000 {
		a := mustAttempt(t, p, g.Request(uint64(i)), 0, time.Duration(i)*50*time.Millisecond)
		if a.Degraded != p.Degraded(a.Start) {
			t.Fatalf("attempt at %v: Degraded %v disagrees with the route", a.Start, a.Degraded)
		}
		failed := a.Outcome == OutcomeServerError
		if a.Degraded {
			degradedN++
			if failed {
				degradedErr++
			} else if a.Outcome == OutcomeOK && !a.Stalled {
				degradedTTFT = append(degradedTTFT, a.FirstByte.Seconds())
			}
		} else {
			healthyN++
			if failed {
				healthyErr++
			} else if a.Outcome == OutcomeOK && !a.Stalled {
				healthyTTFT = append(healthyTTFT, a.FirstByte.Seconds())
			}
		}
	}
	if got := float64(degradedErr) / float64(degradedN); !within(got, 0.10, 0.08) {
		t.Errorf("error fraction while degraded %.4f, want 0.10", got)
	}
	if got := float64(healthyErr) / float64(healthyN); !within(got, 0.005, 0.25) {
		t.Errorf("error fraction while healthy %.4f, want 0.005", got)
	}
	if got := quantile(degradedTTFT, 0.5); !within(got, 5*0.62, 0.03) {
		t.Errorf("degraded main-mode median %.3f s, want 5 × 0.62 s", got)
	}
	if got := quantile(healthyTTFT, 0.5); !within(got, 0.62, 0.03) {
		t.Errorf("healthy main-mode median %.3f s, want 0.62 s", got)
	}
}

func TestNonDegradingModelsAreNeverDegraded(t *testing.T) {
	g := mustGenerator(t, mustModel(t, Sonnet), 1)
	p := mustProvider(t, g, 5, RateLimit{})
	eps, err := g.DegradedEpisodes(5, time.Hour)
	if err != nil || len(eps) != 0 || p.Degraded(30*time.Minute) {
		t.Errorf("sonnet route degraded: episodes %v, err %v", eps, err)
	}
}
