package policytest

import (
	"math"
	"sort"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/policy"
)

// RouteDelayRoutes is how many routes a route-delay case's pool has.
const RouteDelayRoutes = 3

// Where a route-delay case's hedge delay comes from.
const (
	FromRoute   = "route"   // the primary's route's own quantile
	FromCohort  = "cohort"  // the cohort's quantile, every route's samples
	FromInitial = "initial" // the policy's initial delay: the cohort is cold
)

// RouteDelay is a case of the per-route delay rule: the first bytes a
// cohort's primaries reported on each route of a pool of RouteDelayRoutes,
// then a group whose primary goes to route Primary, and where its hedge
// delay comes from.
type RouteDelay struct {
	Name string
	// Slowness scales each route's first bytes: route i's k-th of n
	// primaries reports after Slowness[i] × (400 ms + k × 1 s / n).
	Slowness [RouteDelayRoutes]float64
	// Samples is how many primaries each route reported.
	Samples [RouteDelayRoutes]int
	// Primary is the route (0-based) the group's primary goes to.
	Primary int

	From string
}

// RouteDelayCases are the per-route delay rule's cases, under the default
// policy: a 0.95 quantile, 200 warm-up samples, a 10% margin.
func RouteDelayCases() []RouteDelay {
	n := [RouteDelayRoutes]int{300, 300, 300}
	return []RouteDelay{
		{Name: "a primary on one of equal routes takes its cohort's delay",
			Slowness: [3]float64{1, 1, 1}, Samples: n, Primary: 2, From: FromCohort},
		{Name: "a primary on a route three times slower than its siblings takes that route's own delay",
			Slowness: [3]float64{1, 1, 3}, Samples: n, Primary: 2, From: FromRoute},
		{Name: "a primary on a fast route beside a slow one takes its route's shorter delay",
			Slowness: [3]float64{1, 1, 3}, Samples: n, Primary: 0, From: FromRoute},
		{Name: "a route five percent slower, inside the margin, shares its cohort's delay",
			Slowness: [3]float64{1, 1, 1.05}, Samples: n, Primary: 2, From: FromCohort},
		{Name: "a slow route short of the warm-up samples takes its cohort's delay",
			Slowness: [3]float64{1, 1, 3}, Samples: [3]int{300, 300, 150}, Primary: 2, From: FromCohort},
		{Name: "a primary of a cold cohort takes the initial delay, whatever its route",
			Slowness: [3]float64{1, 1, 3}, Samples: [3]int{50, 50, 50}, Primary: 2, From: FromInitial},
	}
}

// Sample is a primary's first byte on a route (0-based), after Latency.
type Sample struct {
	Route   int
	Latency time.Duration
}

func (c RouteDelay) samples() []Sample {
	var out []Sample
	for k := 0; ; k++ {
		added := false
		for r := range RouteDelayRoutes {
			if n := c.Samples[r]; k < n {
				base := 400*time.Millisecond + time.Duration(k)*time.Second/time.Duration(n)
				out = append(out, Sample{Route: r, Latency: time.Duration(c.Slowness[r] * float64(base))})
				added = true
			}
		}
		if !added {
			return out
		}
	}
}

// RouteFacts are what a route-delay case sets up before its group starts.
type RouteFacts struct {
	// Samples are the primaries' first bytes, to be observed through the
	// driver's own path (a first-byte report of a primary on that route).
	Samples []Sample
	// Primary is the route the group's primary must go to; the driver
	// makes it the only one its picker may pick (the others quarantined).
	Primary int
}

// Armed is what a group's start set from its delays: the hedge delay its
// timer was armed with, and the delay its primary's stall is judged by
// (route.PrimaryState.Delay).
type Armed struct {
	Hedge, StallJudgedBy time.Duration
}

// TestRouteDelay runs every route-delay case through arm: the driver's path
// from a group of a class running p, on a pool of RouteDelayRoutes routes,
// after the case's first bytes, to the delays its start armed. Whatever
// its hedge delay, a primary's stall is judged by its cohort's delay, so
// that a route given its own, longer delay still counts the stalls its
// siblings would not have had (docs/architecture.md §5, "Route choice").
func TestRouteDelay(t *testing.T, arm func(t *testing.T, p *policy.Policy, f RouteFacts) Armed) {
	for _, tc := range RouteDelayCases() {
		t.Run(tc.Name, func(t *testing.T) {
			p := policy.Default()
			samples := tc.samples()
			got := arm(t, p, RouteFacts{Samples: samples, Primary: tc.Primary})
			var want, cohort time.Duration
			switch tc.From {
			case FromInitial:
				want, cohort = p.Delay.Initial, p.Delay.Initial
			case FromCohort:
				want = quantile(samples, -1, p.Delay.Quantile)
				cohort = want
			case FromRoute:
				want = quantile(samples, tc.Primary, p.Delay.Quantile)
				cohort = quantile(samples, -1, p.Delay.Quantile)
			}
			// Within the sketches' 1% relative accuracy, with room.
			if !near(got.Hedge, want) {
				t.Fatalf("armed a hedge delay of %v, want the %s's %v", got.Hedge, tc.From, want)
			}
			if !near(got.StallJudgedBy, cohort) {
				t.Fatalf("judges the primary's stall by %v, want the cohort's delay %v", got.StallJudgedBy, cohort)
			}
		})
	}
}

// near reports whether got is within 2.5 % of want.
func near(got, want time.Duration) bool {
	return math.Abs(float64(got-want))/float64(want) <= 0.025
}

// quantile is the q-quantile of the samples on route (-1: all), at rank
// q·(n−1) as DDSketch reads it.
func quantile(samples []Sample, route int, q float64) time.Duration {
	var xs []time.Duration
	for _, s := range samples {
		if route < 0 || s.Route == route {
			xs = append(xs, s.Latency)
		}
	}
	sort.Slice(xs, func(i, j int) bool { return xs[i] < xs[j] })
	return xs[int(math.Round(q*float64(len(xs)-1)))]
}
