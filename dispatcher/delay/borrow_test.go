package delay

import (
	"testing"
	"time"
)

// fill records n primaries of cohort c spread evenly over [lo, lo+span).
func fill(t *testing.T, e *Estimator, c Cohort, route string, n int, lo, span time.Duration) {
	t.Helper()
	for k := range n {
		if err := e.ObservePrimaryOn(c, route, t0, lo+time.Duration(k)*span/time.Duration(n)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestAColdCohortBorrowsItsDelayFromItsWarmSiblings(t *testing.T) {
	chat := func(stream bool, mt int) Cohort { return NewCohort("chat", "gpt4o", stream, mt) }
	type fed struct {
		c Cohort
		n int
	}
	// Every fed cohort's primaries spread evenly over [1 s, 2 s): P95 ≈ 1.95 s.
	const p95 = 1950 * time.Millisecond
	tests := []struct {
		name     string
		scale    bool // the total trigger
		fed      []fed
		cold     Cohort
		want     time.Duration // 0: Initial
		borrowed bool
	}{
		{"first_byte: a cold cohort takes its warm sibling's delay",
			false, []fed{{chat(true, 1024), 200}}, chat(true, 64), p95, true},
		{"first_byte: siblings each short of the warm-up are warm together",
			false, []fed{{chat(true, 1024), 100}, {chat(true, 4096), 100}}, chat(true, 64), p95, true},
		{"first_byte: the cold cohort's own samples count in the family's union",
			false, []fed{{chat(true, 1024), 150}, {chat(true, 64), 50}}, chat(true, 64), p95, true},
		{"first_byte: a family short of the warm-up together lends nothing",
			false, []fed{{chat(true, 1024), 100}, {chat(true, 64), 50}}, chat(true, 64), 0, false},
		{"a cohort of the other stream mode is no sibling",
			false, []fed{{chat(false, 1024), 200}}, chat(true, 64), 0, false},
		{"a cohort of another pool is no sibling",
			false, []fed{{NewCohort("chat", "sonnet", true, 1024), 200}}, chat(true, 64), 0, false},
		{"a cohort of another operation is no sibling",
			false, []fed{{NewCohort("code", "gpt4o", true, 1024), 200}}, chat(true, 64), 0, false},
		{"an embeddings cohort is no sibling of a chat one",
			false, []fed{{Cohort{Operation: "chat", Model: "gpt4o", Kind: KindEmbeddings}, 200}}, chat(false, 64), 0, false},
		{"total: a larger bucket takes a smaller sibling's delay scaled by the buckets",
			true, []fed{{chat(true, 64), 200}}, chat(true, 256), 4 * p95, true},
		{"total: a smaller bucket takes a larger sibling's delay unscaled",
			true, []fed{{chat(true, 1024), 200}}, chat(true, 64), p95, true},
		{"total: the nearest warm sibling lends",
			true, []fed{{chat(true, 64), 200}, {chat(true, 16384), 200}}, chat(true, 256), 4 * p95, true},
		{"total: of two siblings as near, the larger lends, unscaled",
			true, []fed{{chat(true, 64), 200}, {chat(true, 1024), 200}}, chat(true, 256), p95, true},
		{"total: a cold sibling lends nothing",
			true, []fed{{chat(true, 64), 199}}, chat(true, 256), 0, false},
		{"total: the unset bucket borrows nothing, having no bound to scale by",
			true, []fed{{chat(true, 64), 200}}, chat(true, 0), 0, false},
		{"total: the unset bucket lends nothing",
			true, []fed{{chat(true, 0), 200}}, chat(true, 64), 0, false},
		{"a borrowed delay is clamped to the max",
			true, []fed{{chat(true, 64), 200}}, chat(true, 4096), 10 * time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustEstimator(t, Options{Min: 10 * time.Millisecond, WarmupSamples: 200, ScaleBorrowed: tt.scale})
			for _, f := range tt.fed {
				fill(t, e, f.c, "", f.n, time.Second, time.Second)
			}
			d := e.Delay(tt.cold, t0, time.Minute)
			want := tt.want
			if want == 0 {
				want = e.Options().Initial
			}
			if d.Borrowed != tt.borrowed || d.Warm != tt.borrowed || relErr(d.Value, want) > 0.02 {
				t.Fatalf("delay %v (warm %v, borrowed %v), want %v (borrowed %v)", d.Value, d.Warm, d.Borrowed, want, tt.borrowed)
			}
		})
	}
}

func TestAWarmCohortKeepsItsOwnDelayWhateverItsSiblings(t *testing.T) {
	e := mustEstimator(t, Options{Min: 10 * time.Millisecond, WarmupSamples: 200})
	own, sib := NewCohort("chat", "gpt4o", true, 64), NewCohort("chat", "gpt4o", true, 1024)
	fill(t, e, own, "", 200, 100*time.Millisecond, 100*time.Millisecond)
	fill(t, e, sib, "", 1000, 5*time.Second, time.Second)
	if d := e.Delay(own, t0, time.Minute); d.Borrowed || relErr(d.Value, 195*time.Millisecond) > 0.02 {
		t.Fatalf("delay %v (borrowed %v), want its own 195ms", d.Value, d.Borrowed)
	}
}

func TestTheRoutesOfACohortAreBounded(t *testing.T) {
	e := mustEstimator(t, Options{MaxRoutes: 2})
	for _, r := range []string{"a", "b", "c", "d"} {
		if err := e.ObservePrimaryOn(testCohort, r, t0, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(e.cohorts[testCohort].routes); got != 2 {
		t.Fatalf("%d route windows, want the bound 2", got)
	}
	if d := e.Delay(testCohort, t0, time.Minute); d.Samples != 4 {
		t.Fatalf("the cohort holds %d samples, want all 4", d.Samples)
	}
}

// routeCount is how many samples route's window of cohort c holds.
func routeCount(e *Estimator, c Cohort, route string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	r, ok := e.cohorts[c].routes[route]
	if !ok {
		return 0
	}
	v, _ := r.merged(t0)
	return int(v.GetCount())
}

func TestCensoringAppliesToEachRouteAsToItsCohort(t *testing.T) {
	// Routes a and b are fast ([100, 200) ms, P95 ≈ 195 ms), route s slow
	// ([1, 2) s, P95 ≈ 1.95 s): s has a delay of its own; the cohort's P95
	// lies between.
	newEst := func(t *testing.T) *Estimator {
		e := mustEstimator(t, Options{Min: 10 * time.Millisecond, WarmupSamples: 200})
		fill(t, e, testCohort, "a", 300, 100*time.Millisecond, 100*time.Millisecond)
		fill(t, e, testCohort, "b", 300, 100*time.Millisecond, 100*time.Millisecond)
		fill(t, e, testCohort, "s", 300, time.Second, time.Second)
		return e
	}
	e := newEst(t)
	cohortDelay := e.Delay(testCohort, t0, time.Minute).Value
	slow := e.RouteDelay(testCohort, "s", t0, time.Minute)
	fast := e.RouteDelay(testCohort, "a", t0, time.Minute)
	if !slow.Route || !fast.Route || !(fast.Value < cohortDelay && cohortDelay < slow.Value) {
		t.Fatalf("route delays fast %+v, slow %+v around the cohort's %v: want each its own, either side", fast, slow, cohortDelay)
	}
	tests := []struct {
		name              string
		route             string
		elapsed           time.Duration
		toCohort, toRoute bool
	}{
		{"a slow route's primary superseded past both delays joins both windows", "s", slow.Value + time.Millisecond, true, true},
		{"a slow route's primary superseded before its route's delay joins only the cohort's", "s", (cohortDelay + slow.Value) / 2, true, false},
		{"a fast route's primary superseded past its route's delay joins its route's window", "a", (fast.Value + cohortDelay) / 2, false, true},
		{"a primary superseded before either delay joins neither", "a", fast.Value / 2, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEst(t)
			beforeCohort := e.Delay(testCohort, t0, time.Minute).Samples
			beforeRoute := routeCount(e, testCohort, tt.route)
			recorded, err := e.ObserveSupersededOn(testCohort, tt.route, t0, tt.elapsed)
			if err != nil {
				t.Fatal(err)
			}
			gotCohort := e.Delay(testCohort, t0, time.Minute).Samples - beforeCohort
			gotRoute := routeCount(e, testCohort, tt.route) - beforeRoute
			if recorded != (tt.toCohort || tt.toRoute) || (gotCohort == 1) != tt.toCohort || (gotRoute == 1) != tt.toRoute {
				t.Fatalf("recorded %v, cohort +%d, route +%d; want cohort %v, route %v", recorded, gotCohort, gotRoute, tt.toCohort, tt.toRoute)
			}
		})
	}
}
