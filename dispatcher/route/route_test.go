package route

import (
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/schemas"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Unix(1_700_000_000, 0)

func seeded(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)) }

func newTestPicker(t *testing.T, routes ...Route) *Picker {
	t.Helper()
	p, err := NewPicker(routes, Options{HalfLife: 10 * time.Second})
	if err != nil {
		t.Fatalf("NewPicker: %v", err)
	}
	return p
}

func plain(names ...string) []Route {
	rs := make([]Route, len(names))
	for i, n := range names {
		rs[i] = Route{Name: n}
	}
	return rs
}

func labelled(name, provider, region string) Route {
	return Route{Name: name, Labels: map[string]string{LabelProvider: provider, LabelRegion: region}}
}

// shares runs n picks and returns how often each route was chosen.
func shares(t *testing.T, n int, pick func(rng *rand.Rand) (string, bool)) map[string]int {
	t.Helper()
	rng := seeded(42)
	got := make(map[string]int)
	for range n {
		name, ok := pick(rng)
		if !ok {
			t.Fatal("pick found no route")
		}
		got[name]++
	}
	return got
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestPickPrimaryNeverPicksQuarantinedOrPushbackRoutesUntilTheyExpire(t *testing.T) {
	p := newTestPicker(t, plain("a", "b", "c")...)
	pool := []string{"a", "b", "c"}
	mustDo(t, p.SetState("a", Quarantined, t0.Add(time.Minute)))
	mustDo(t, p.SetState("b", Pushback, t0.Add(30*time.Second)))

	tests := []struct {
		name string
		now  time.Time
		want []string // routes that must all appear, and nothing else
	}{
		{"both flags in force", t0, []string{"c"}},
		{"just before pushback ends", t0.Add(30*time.Second - time.Nanosecond), []string{"c"}},
		{"pushback expired", t0.Add(30 * time.Second), []string{"b", "c"}},
		{"quarantine expired too", t0.Add(time.Minute), []string{"a", "b", "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := shares(t, 600, func(rng *rand.Rand) (string, bool) { return p.PickPrimary(pool, tt.now, rng) })
			if len(got) != len(tt.want) {
				t.Fatalf("picked %v, want exactly %v", got, tt.want)
			}
			for _, w := range tt.want {
				if got[w] == 0 {
					t.Fatalf("picked %v, want %s among them", got, w)
				}
			}
		})
	}

	mustDo(t, p.SetState("c", Quarantined, t0.Add(time.Hour)))
	mustDo(t, p.SetState("a", Healthy, time.Time{}))
	if name, ok := p.PickPrimary(pool, t0, seeded(1)); !ok || name != "a" {
		t.Fatalf("after clearing a's quarantine picked %q, %v; want a", name, ok)
	}
}

func TestPickPrimaryPrefersTheLessLoadedOfTwoWithoutExcludingOthers(t *testing.T) {
	p := newTestPicker(t, plain("a", "b", "c", "d")...)
	pool := []string{"a", "b", "c", "d"}
	for _, name := range pool {
		mustDo(t, p.Observe(name, 500*time.Millisecond, t0))
	}
	for _, name := range []string{"b", "c", "d"} {
		for range 3 {
			mustDo(t, p.Acquire(name))
		}
	}
	const n = 8000
	got := shares(t, n, func(rng *rand.Rand) (string, bool) { return p.PickPrimary(pool, t0, rng) })
	// a wins every draw it is in: P = 1 - (3/4)(2/3) = 1/2.
	if share := float64(got["a"]) / n; math.Abs(share-0.5) > 0.03 {
		t.Fatalf("idle route share %.3f, want ≈ 0.5 (%v)", share, got)
	}
	for _, name := range []string{"b", "c", "d"} {
		if got[name] == 0 || got[name] >= got["a"] {
			t.Fatalf("loaded route %s picked %d times, want some but fewer than a's %d", name, got[name], got["a"])
		}
	}
}

// A primary whose first route has no capacity left goes to another
// route of the pool: PickPrimaryExcept never picks an excluded route, the
// ejected-only and no-worker fallbacks included, and says so when the
// exclusion leaves nothing.
func TestPickPrimaryExceptNeverPicksAnExcludedRoute(t *testing.T) {
	p := newTestPicker(t, plain("a", "b", "c")...)
	pool := []string{"a", "b", "c"}
	mustDo(t, p.Observe("a", 10*time.Millisecond, t0)) // a would win every draw it is in
	got := shares(t, 2000, func(rng *rand.Rand) (string, bool) { return p.PickPrimaryExcept(pool, []string{"a"}, t0, rng) })
	if got["a"] != 0 || got["b"] == 0 || got["c"] == 0 {
		t.Fatalf("picks %v: want b and c, never the excluded a", got)
	}
	if name, ok := p.PickPrimaryExcept(pool, pool, t0, seeded(1)); ok {
		t.Fatalf("every route excluded, yet %q was picked", name)
	}
	// Only ejected routes left (panic mode): still not an excluded one.
	mustDo(t, p.SetState("a", Ejected, t0.Add(time.Minute)))
	mustDo(t, p.SetState("b", Ejected, t0.Add(time.Minute)))
	mustDo(t, p.SetState("c", Quarantined, t0.Add(time.Minute)))
	if name, ok := p.PickPrimaryExcept(pool, []string{"a"}, t0, seeded(1)); !ok || name != "b" {
		t.Fatalf("ejected-only pick with a excluded: %q %v, want b", name, ok)
	}
	// Only routes marked as having no worker left: the same.
	q := newTestPicker(t, plain("a", "b")...)
	mustDo(t, q.MarkUnserved("a", t0.Add(time.Minute)))
	mustDo(t, q.MarkUnserved("b", t0.Add(time.Minute)))
	if name, ok := q.PickPrimaryExcept([]string{"a", "b"}, []string{"b"}, t0, seeded(1)); !ok || name != "a" {
		t.Fatalf("unserved-only pick with b excluded: %q %v, want a", name, ok)
	}
}

func TestPickPrimaryPrefersTheFasterRoute(t *testing.T) {
	p := newTestPicker(t, plain("fast", "mid", "slow")...)
	pool := []string{"fast", "mid", "slow"}
	mustDo(t, p.Observe("fast", 100*time.Millisecond, t0))
	mustDo(t, p.Observe("mid", 500*time.Millisecond, t0))
	mustDo(t, p.Observe("slow", 2*time.Second, t0))
	const n = 6000
	got := shares(t, n, func(rng *rand.Rand) (string, bool) { return p.PickPrimary(pool, t0, rng) })
	if share := float64(got["fast"]) / n; math.Abs(share-2.0/3) > 0.03 {
		t.Fatalf("fast route share %.3f, want ≈ 2/3 (%v)", share, got)
	}
	if got["mid"] == 0 || got["slow"] != 0 {
		t.Fatalf("picks %v: the middle route wins against the slowest, the slowest never wins a pair", got)
	}
}

func TestPickPrimaryWeighsLatencyByInFlight(t *testing.T) {
	// fast is 4× faster but has 7 in flight: (7+1)×0.1 = 0.8 > (0+1)×0.4.
	p := newTestPicker(t, plain("fast", "idle")...)
	mustDo(t, p.Observe("fast", 100*time.Millisecond, t0))
	mustDo(t, p.Observe("idle", 400*time.Millisecond, t0))
	for range 7 {
		mustDo(t, p.Acquire("fast"))
	}
	got := shares(t, 100, func(rng *rand.Rand) (string, bool) { return p.PickPrimary([]string{"fast", "idle"}, t0, rng) })
	if got["idle"] != 100 {
		t.Fatalf("picks %v, want the idle route every time", got)
	}
}

func TestPickPrimaryScoresRoutesWithoutDataAtThePoolMedian(t *testing.T) {
	p := newTestPicker(t, plain("a", "b", "new")...)
	pool := []string{"a", "b", "new"}
	mustDo(t, p.Observe("a", 100*time.Millisecond, t0))
	mustDo(t, p.Observe("b", 300*time.Millisecond, t0))
	// new is scored at the median, 200 ms: it beats b and loses to a.
	got := shares(t, 3000, func(rng *rand.Rand) (string, bool) { return p.PickPrimary(pool, t0, rng) })
	if got["b"] != 0 || got["new"] == 0 || got["a"] <= got["new"] {
		t.Fatalf("picks %v: want a most, new sometimes (wins only against b), b never", got)
	}
}

func TestPickPrimaryWithoutAnyLatencyDataDecidesOnInFlight(t *testing.T) {
	p := newTestPicker(t, plain("a", "b")...)
	mustDo(t, p.Acquire("a"))
	name, ok := p.PickPrimary([]string{"a", "b"}, t0, seeded(3))
	if !ok || name != "b" {
		t.Fatalf("picked %q, %v; want the idle route b", name, ok)
	}
}

func TestPickPrimaryCountsTheClusterInFlightWhileItIsFresh(t *testing.T) {
	// Twin routes, equally fast; busy has attempts in flight on other
	// replicas' workers, which this picker only knows from the shared count.
	until := t0.Add(500 * time.Millisecond)
	tests := []struct {
		name           string
		local, shared  int // in flight on busy
		at             time.Time
		wantBusyPicked bool // busy may win some pairs
	}{
		{"a high shared count steers primaries to the idle twin", 0, 20, t0, false},
		{"the larger of local and shared counts", 3, 1, t0, false},
		{"idle twins split the primaries evenly", 0, 0, t0, true},
		{"a stale shared count is ignored", 0, 20, until, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newTestPicker(t, plain("busy", "idle")...)
			pool := []string{"busy", "idle"}
			for _, name := range pool {
				mustDo(t, p.Observe(name, 200*time.Millisecond, t0))
			}
			for range tt.local {
				mustDo(t, p.Acquire("busy"))
			}
			mustDo(t, p.SetSharedInFlight("busy", tt.shared, until))
			const n = 1000
			got := shares(t, n, func(rng *rand.Rand) (string, bool) { return p.PickPrimary(pool, tt.at, rng) })
			if tt.wantBusyPicked {
				// Equal scores: ties go to the first draw, uniform.
				if share := float64(got["busy"]) / n; math.Abs(share-0.5) > 0.06 {
					t.Fatalf("picks %v: want the twins about even", got)
				}
				return
			}
			if got["busy"] != 0 || got["idle"] != n {
				t.Fatalf("picks %v: want every primary on idle", got)
			}
		})
	}
}

func TestStatsReportsTheSharedInFlightOnlyWhileFresh(t *testing.T) {
	p := newTestPicker(t, plain("a")...)
	until := t0.Add(time.Second)
	mustDo(t, p.SetSharedInFlight("a", 5, until))
	if st, _ := p.Stats("a", t0); st.SharedInFlight != 5 || st.InFlight != 0 {
		t.Fatalf("Stats = %+v, want 5 shared, 0 local", st)
	}
	if st, _ := p.Stats("a", until); st.SharedInFlight != 0 {
		t.Fatalf("Stats at expiry = %+v, want no shared count", st)
	}
	if err := p.SetSharedInFlight("x", 1, until); !errors.Is(err, ErrUnknownRoute) {
		t.Errorf("SetSharedInFlight unknown = %v, want ErrUnknownRoute", err)
	}
	if err := p.SetSharedInFlight("a", -1, until); err == nil {
		t.Error("SetSharedInFlight accepted a negative count")
	}
}

func TestObserveDecaysOldSamplesByTheHalfLife(t *testing.T) {
	p := newTestPicker(t, plain("a")...)
	mustDo(t, p.Observe("a", time.Second, t0))
	mustDo(t, p.Observe("a", 3*time.Second, t0.Add(10*time.Second))) // one half-life later
	st, err := p.Stats("a", t0.Add(10*time.Second))
	mustDo(t, err)
	want := (0.5*1 + 1*3) / 1.5 // the older sample weighs half
	if !st.HasLatency || math.Abs(st.Latency.Seconds()-want) > 1e-6 {
		t.Fatalf("latency %v (has=%v), want %.4fs", st.Latency, st.HasLatency, want)
	}

	// Many samples at one instant weigh equally.
	mustDo(t, p.Observe("a", time.Second, t0.Add(time.Hour)))
	mustDo(t, p.Observe("a", 2*time.Second, t0.Add(time.Hour)))
	st, _ = p.Stats("a", t0.Add(time.Hour))
	if math.Abs(st.Latency.Seconds()-1.5) > 0.01 {
		t.Fatalf("latency %v after an hour's gap, want ≈ 1.5s from the fresh samples", st.Latency)
	}
}

func TestLatencyGoesStaleAfterEightHalfLives(t *testing.T) {
	p := newTestPicker(t, plain("a")...)
	mustDo(t, p.Observe("a", time.Second, t0))
	tests := []struct {
		after time.Duration
		want  bool
	}{
		{0, true},
		{79 * time.Second, true},
		{80 * time.Second, true}, // exactly 1/256 left
		{81 * time.Second, false},
	}
	for _, tt := range tests {
		st, err := p.Stats("a", t0.Add(tt.after))
		mustDo(t, err)
		if st.HasLatency != tt.want {
			t.Errorf("after %v HasLatency = %v, want %v", tt.after, st.HasLatency, tt.want)
		}
	}
}

func TestPickHedgeAvoidsRoutesTheGroupAlreadyUsed(t *testing.T) {
	p := newTestPicker(t, plain("a", "b", "c")...)
	pool := []string{"a", "b", "c"}
	got := shares(t, 600, func(rng *rand.Rand) (string, bool) {
		return p.PickHedge(pool, []string{"a"}, t0, rng, true)
	})
	if got["a"] != 0 || got["b"] == 0 || got["c"] == 0 {
		t.Fatalf("hedge picks %v, want b and c only", got)
	}
}

func TestPickHedgePrefersAnotherProviderThenAnotherRegion(t *testing.T) {
	routes := []Route{
		labelled("oai-us", "openai", "us"),
		labelled("oai-us2", "openai", "us"),
		labelled("oai-eu", "openai", "eu"),
		labelled("ant-us", "anthropic", "us"),
		{Name: "bare"}, // no labels: never counted as different
	}
	pool := []string{"oai-us", "oai-us2", "oai-eu", "ant-us", "bare"}
	tests := []struct {
		name        string
		quarantined []string
		load        map[string]int
		want        string
	}{
		{"another provider wins even when busier", nil, map[string]int{"ant-us": 20}, "ant-us"},
		{"another region when no other provider is healthy", []string{"ant-us"}, nil, "oai-eu"},
		{"any other route when labels cannot differ", []string{"ant-us", "oai-eu"}, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newTestPicker(t, routes...)
			for _, q := range tt.quarantined {
				mustDo(t, p.SetState(q, Quarantined, t0.Add(time.Minute)))
			}
			for name, n := range tt.load {
				for range n {
					mustDo(t, p.Acquire(name))
				}
			}
			got := shares(t, 400, func(rng *rand.Rand) (string, bool) {
				return p.PickHedge(pool, []string{"oai-us"}, t0, rng, false)
			})
			if tt.want != "" {
				if got[tt.want] != 400 {
					t.Fatalf("hedge picks %v, want %s every time", got, tt.want)
				}
				return
			}
			if got["oai-us2"] == 0 || got["bare"] == 0 || len(got) != 2 {
				t.Fatalf("hedge picks %v, want both remaining healthy routes", got)
			}
		})
	}
}

func TestPickHedgeReusesAnExcludedRouteOnlyWhenSameRouteAllowed(t *testing.T) {
	tests := []struct {
		name        string
		pool        []string
		quarantined []string
		allowed     bool
		want        string
		wantOK      bool
	}{
		{"single route, same-route hedging off", []string{"a"}, nil, false, "", false},
		{"single route, same-route hedging on", []string{"a"}, nil, true, "a", true},
		{"other route quarantined, off", []string{"a", "b"}, []string{"b"}, false, "", false},
		{"other route quarantined, on", []string{"a", "b"}, []string{"b"}, true, "a", true},
		{"other route healthy wins over same route", []string{"a", "b"}, nil, true, "b", true},
		{"excluded route itself unhealthy", []string{"a"}, []string{"a"}, true, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newTestPicker(t, plain("a", "b")...)
			for _, q := range tt.quarantined {
				mustDo(t, p.SetState(q, Pushback, t0.Add(time.Second)))
			}
			name, ok := p.PickHedge(tt.pool, []string{"a"}, t0, seeded(7), tt.allowed)
			if name != tt.want || ok != tt.wantOK {
				t.Fatalf("PickHedge = %q, %v; want %q, %v", name, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestPicksOnEmptyOrUnhealthyPoolsReturnNotOK(t *testing.T) {
	p := newTestPicker(t, plain("a", "b")...)
	mustDo(t, p.SetState("a", Quarantined, t0.Add(time.Minute)))
	mustDo(t, p.SetState("b", Pushback, t0.Add(time.Minute)))
	tests := []struct {
		name string
		pool []string
	}{
		{"nil pool", nil},
		{"empty pool", []string{}},
		{"unknown routes only", []string{"x", "y"}},
		{"all unhealthy", []string{"a", "b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if name, ok := p.PickPrimary(tt.pool, t0, seeded(1)); ok {
				t.Fatalf("PickPrimary = %q, want not ok", name)
			}
			if name, ok := p.PickHedge(tt.pool, nil, t0, seeded(1), true); ok {
				t.Fatalf("PickHedge = %q, want not ok", name)
			}
			if name, ok := p.PickHedge(tt.pool, tt.pool, t0, nil, true); ok {
				t.Fatalf("PickHedge without rng = %q, want not ok", name)
			}
		})
	}
}

func TestPicksWithoutARandomSourceTakeTheBestScore(t *testing.T) {
	p := newTestPicker(t, plain("a", "b", "c")...)
	mustDo(t, p.Observe("a", time.Second, t0))
	mustDo(t, p.Observe("b", 200*time.Millisecond, t0))
	mustDo(t, p.Observe("c", 300*time.Millisecond, t0))
	if name, ok := p.PickPrimary([]string{"a", "b", "c"}, t0, nil); !ok || name != "b" {
		t.Fatalf("PickPrimary(nil rng) = %q, %v; want b", name, ok)
	}
}

func TestPicksAreReproducibleFromTheSeed(t *testing.T) {
	p := newTestPicker(t, plain("a", "b", "c", "d", "e")...)
	pool := []string{"a", "b", "c", "d", "e", "a"} // a duplicate entry counts once
	run := func() []string {
		rng := seeded(99)
		var out []string
		for range 50 {
			name, _ := p.PickPrimary(pool, t0, rng)
			out = append(out, name)
		}
		return out
	}
	first, second := run(), run()
	for i := range first {
		if first[i] != second[i] {
			t.Fatalf("pick %d differs between runs with one seed: %s vs %s", i, first[i], second[i])
		}
	}
}

func TestPickerRejectsBadInput(t *testing.T) {
	tests := []struct {
		name    string
		routes  []Route
		cfg     Options
		wantErr bool
	}{
		{"valid", plain("a", "b"), Options{}, false},
		{"unnamed route", []Route{{}}, Options{}, true},
		{"duplicate route", plain("a", "a"), Options{}, true},
		{"negative half-life", plain("a"), Options{HalfLife: -time.Second}, true},
		{"negative stall half-life", plain("a"), Options{StallHalfLife: -time.Second}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewPicker(tt.routes, tt.cfg); (err != nil) != tt.wantErr {
				t.Fatalf("NewPicker err = %v, want error %v", err, tt.wantErr)
			}
		})
	}

	p := newTestPicker(t, plain("a")...)
	for name, err := range map[string]error{
		"Acquire unknown":  p.Acquire("x"),
		"Release unknown":  p.Release("x"),
		"Observe unknown":  p.Observe("x", time.Second, t0),
		"SetState unknown": p.SetState("x", Healthy, t0),
	} {
		if !errors.Is(err, ErrUnknownRoute) {
			t.Errorf("%s = %v, want ErrUnknownRoute", name, err)
		}
	}
	if _, err := p.Stats("x", t0); !errors.Is(err, ErrUnknownRoute) {
		t.Errorf("Stats unknown = %v, want ErrUnknownRoute", err)
	}
	if err := p.Release("a"); !errors.Is(err, ErrNotAcquired) {
		t.Errorf("Release without Acquire = %v, want ErrNotAcquired", err)
	}
	if err := p.Observe("a", -time.Second, t0); err == nil {
		t.Error("Observe accepted a negative latency")
	}
	if err := p.SetState("a", State(9), t0); err == nil {
		t.Error("SetState accepted an unknown state")
	}
}

func TestStatsReportsStateInForceAndInFlight(t *testing.T) {
	p := newTestPicker(t, plain("a")...)
	mustDo(t, p.Acquire("a"))
	mustDo(t, p.Acquire("a"))
	mustDo(t, p.Release("a"))
	until := t0.Add(time.Minute)
	mustDo(t, p.SetState("a", Pushback, until))
	st, err := p.Stats("a", t0)
	mustDo(t, err)
	if st.InFlight != 1 || st.State != Pushback || !st.Until.Equal(until) || st.HasLatency {
		t.Fatalf("Stats = %+v, want 1 in flight, pushback until %v, no latency", st, until)
	}
	if st, _ := p.Stats("a", until); st.State != Healthy {
		t.Fatalf("Stats after expiry = %+v, want healthy", st)
	}
	if Quarantined.String() != "quarantined" || State(7).String() != "State(7)" {
		t.Fatal("State.String misnames a state")
	}
}

func TestPickerIsSafeForConcurrentUse(t *testing.T) {
	p := newTestPicker(t, plain("a", "b", "c")...)
	pool := []string{"a", "b", "c"}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := seeded(uint64(w))
			for i := range 500 {
				now := t0.Add(time.Duration(i) * time.Millisecond)
				name, ok := p.PickPrimary(pool, now, rng)
				if !ok {
					t.Error("no route picked")
					return
				}
				if err := p.Acquire(name); err != nil {
					t.Error(err)
					return
				}
				_ = p.Observe(name, time.Duration(rng.IntN(500))*time.Millisecond, now)
				if _, ok := p.PickHedge(pool, []string{name}, now, rng, false); !ok {
					t.Error("no hedge route picked")
				}
				if err := p.Release(name); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, name := range pool {
		if st, _ := p.Stats(name, t0); st.InFlight != 0 {
			t.Fatalf("route %s left %d in flight after balanced acquire/release", name, st.InFlight)
		}
	}
}

func TestPickLeastLoadedTakesTheIdlestOtherRouteAndSpreadsTies(t *testing.T) {
	p := newTestPicker(t, plain("a", "b", "c", "d")...)
	pool := []string{"a", "b", "c", "d"}
	// Ties go to the first route after the refusing one, cyclically.
	for busy, want := range map[string]string{"a": "b", "b": "c", "d": "a"} {
		if got, ok := p.PickLeastLoaded(pool, busy, t0); !ok || got != want {
			t.Fatalf("refused on %s: picked %q %v, want %s", busy, got, ok, want)
		}
	}
	mustDo(t, p.Acquire("b"))
	mustDo(t, p.SetState("c", Quarantined, t0.Add(time.Minute)))
	if got, _ := p.PickLeastLoaded(pool, "a", t0); got != "d" {
		t.Fatalf("picked %q, want d (b is loaded, c quarantined)", got)
	}
	if got, ok := p.PickLeastLoaded([]string{"a"}, "a", t0); ok {
		t.Fatalf("a one-route pool offered %q, want none", got)
	}
}

func TestARouteMarkedWithoutAWorkerIsPassedOverUntilServedOrExpired(t *testing.T) {
	pool := []string{"a", "b"}
	for _, tt := range []struct {
		name    string
		mark    func(p *Picker) // after a is marked unserved until t0+1s
		at      time.Time
		wantOut bool // a is never picked as primary, hedge or re-offer target
	}{
		{"marked: passed over", func(*Picker) {}, t0, true},
		{"served again: an Accept clears the mark", func(p *Picker) { _ = p.MarkServed("a") }, t0, false},
		{"expired: asked again", func(*Picker) {}, t0.Add(time.Second), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newTestPicker(t, plain(pool...)...)
			if err := p.MarkUnserved("a", t0.Add(time.Second)); err != nil {
				t.Fatal(err)
			}
			tt.mark(p)
			rng := seeded(1)
			pickedA := false
			for range 50 {
				primary, _ := p.PickPrimary(pool, tt.at, rng)
				hedge, _ := p.PickHedge(pool, []string{"b"}, tt.at, rng, false)
				reoffer, _ := p.PickLeastLoaded(pool, "b", tt.at)
				pickedA = pickedA || primary == "a" || hedge == "a" || reoffer == "a"
			}
			if pickedA == tt.wantOut {
				t.Errorf("a picked: %v; want passed over: %v", pickedA, tt.wantOut)
			}
		})
	}
	t.Run("every route marked: the primary still goes to one", func(t *testing.T) {
		p := newTestPicker(t, plain(pool...)...)
		for _, name := range pool {
			_ = p.MarkUnserved(name, t0.Add(time.Second))
		}
		if got, ok := p.PickPrimary(pool, t0, seeded(1)); !ok || got == "" {
			t.Fatalf("PickPrimary = %q %v; want a route: a worker may be back, and asking costs one no-responders", got, ok)
		}
		if got, ok := p.PickHedge(pool, nil, t0, seeded(1), false); ok {
			t.Fatalf("PickHedge = %q; want none: no hedge goes to a route without a worker", got)
		}
	})
	if err := newTestPicker(t, plain(pool...)...).MarkUnserved("x", t0); !errors.Is(err, ErrUnknownRoute) {
		t.Errorf("MarkUnserved(unknown) = %v, want ErrUnknownRoute", err)
	}
}

func TestPrimaryStalledWhenItsFirstByteMissesTheDelay(t *testing.T) {
	const d = time.Second
	tests := []struct {
		name           string
		s              PrimaryState
		stalled, known bool
	}{
		{"first byte within the delay", PrimaryState{Delay: d, Elapsed: 2 * d, FirstByte: d / 2}, false, true},
		{"first byte exactly at the delay", PrimaryState{Delay: d, Elapsed: d, FirstByte: d}, false, true},
		{"first byte after the delay", PrimaryState{Delay: d, Elapsed: 2 * d, FirstByte: d + 1}, true, true},
		{"first byte after the delay, hedged meanwhile", PrimaryState{Delay: d, Elapsed: 2 * d, FirstByte: 2 * d, Hedged: true}, true, true},
		{"no first byte when the hedge launched", PrimaryState{Delay: d, Elapsed: d - time.Millisecond, Hedged: true}, true, true},
		{"no first byte once the delay passed", PrimaryState{Delay: d, Elapsed: d}, true, true},
		{"no first byte yet, within the delay", PrimaryState{Delay: d, Elapsed: d / 2}, false, false},
		{"a group without a delay judges nothing", PrimaryState{Elapsed: time.Minute}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stalled, known := tt.s.Stalled()
			if stalled != tt.stalled || known != tt.known {
				t.Fatalf("Stalled() = %v, %v; want %v, %v", stalled, known, tt.stalled, tt.known)
			}
		})
	}
}

func TestVerdictCountsAnswersAndTransientFailuresOnly(t *testing.T) {
	tests := []struct {
		name            string
		status          schemas.StatusClass
		scope           schemas.ErrorScope
		valid, canceled bool
		failed, counted bool
	}{
		{"a valid answer", schemas.StatusOK, schemas.ScopeNone, true, false, false, true},
		{"a valid answer of a cancelled loser that finished", schemas.StatusOK, schemas.ScopeNone, true, true, false, true},
		{"an invalid answer", schemas.StatusContractInvalid, schemas.ScopeTransient, false, false, true, true},
		{"a 5xx", schemas.StatusServerError, schemas.ScopeTransient, false, false, true, true},
		{"a cancelled loser", schemas.StatusCanceled, schemas.ScopeNone, false, true, false, false},
		{"a cancelled attempt that reports a timeout", schemas.StatusTimeout, schemas.ScopeTransient, false, true, false, false},
		{"a busy refusal", schemas.StatusBusy, schemas.ScopeNone, false, false, false, false},
		{"a pushback", schemas.StatusRateLimited, schemas.ScopePushback, false, false, false, false},
		{"a quarantine", schemas.StatusAuth, schemas.ScopeRoute, false, false, false, false},
		{"the group's own error", schemas.StatusInvalidRequest, schemas.ScopeGroup, false, false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			failed, counted := Verdict(tt.status, tt.scope, tt.valid, tt.canceled)
			if failed != tt.failed || counted != tt.counted {
				t.Fatalf("Verdict = %v, %v; want %v, %v", failed, counted, tt.failed, tt.counted)
			}
		})
	}
}

// stallRun drives a closed loop of primaries through p, 50 a second: each
// pick holds its route for hold picks (so about hold attempts are in
// flight), every route answers in the same time, and the nth primary (from
// 1) on route r stalls when stalls(r, n). It returns how many of picks
// primaries each route drew and the clock after them.
func stallRun(t *testing.T, p *Picker, pool []string, stalls func(route string, nth int) bool, picks, hold int, now time.Time, rng *rand.Rand) (map[string]int, time.Time) {
	t.Helper()
	got := make(map[string]int)
	seen := make(map[string]int)
	var inFlight []string
	for range picks {
		now = now.Add(20 * time.Millisecond)
		if len(inFlight) == hold {
			mustDo(t, p.Release(inFlight[0]))
			inFlight = inFlight[1:]
		}
		name, ok := p.PickPrimary(pool, now, rng)
		if !ok {
			t.Fatal("PickPrimary found no route")
		}
		got[name]++
		seen[name]++
		mustDo(t, p.Acquire(name))
		inFlight = append(inFlight, name)
		mustDo(t, p.Observe(name, 500*time.Millisecond, now))
		mustDo(t, p.ObserveStall(name, stalls(name, seen[name]), now))
	}
	for _, name := range inFlight {
		mustDo(t, p.Release(name))
	}
	return got, now
}

// every stalls route r's primaries every every[r]-th time (0: never).
func every(every map[string]int) func(string, int) bool {
	return func(route string, nth int) bool { n := every[route]; return n > 0 && nth%n == 0 }
}

// chance stalls route r's primaries at random with probability chance[r],
// drawn from its own seeded source so that the picks' draws are unchanged.
func chance(chance map[string]float64, seed uint64) func(string, int) bool {
	rng := seeded(seed)
	return func(route string, _ int) bool { return rng.Float64() < chance[route] }
}

func TestARouteWhoseStallShareRisesLosesPrimariesGraduallyAndWinsThemBack(t *testing.T) {
	p := newTestPicker(t, plain("a", "b", "c")...)
	pool := []string{"a", "b", "c"}
	rng := seeded(5)
	const picks, hold = 3000, 12 // 60 s at 50 primaries a second, 12 in flight
	// Route a stalls twice as often as b and c.
	uneven := every(map[string]int{"a": 10, "b": 20, "c": 20})
	_, now := stallRun(t, p, pool, uneven, picks, hold, t0, rng) // learn
	got, now := stallRun(t, p, pool, uneven, picks, hold, now, rng)
	share := float64(got["a"]) / picks
	if share > 0.25 || share < 0.005 {
		t.Fatalf("route with twice the stall share drew %.3f of the primaries (%v), want well below 1/3 but not none", share, got)
	}
	st, _ := p.Stats("a", now)
	t.Logf("degraded: a drew %.3f of the primaries, stall share a %.3f", share, st.StallShare)
	// Route a recovers: its old stalls decay and it wins its share back.
	even := every(map[string]int{"a": 20, "b": 20, "c": 20})
	_, now = stallRun(t, p, pool, even, picks, hold, now, rng)
	got, _ = stallRun(t, p, pool, even, picks, hold, now, rng)
	if share := float64(got["a"]) / picks; share < 0.28 {
		t.Fatalf("recovered route drew %.3f of the primaries (%v), want about 1/3", share, got)
	}
	t.Logf("recovered: a drew %.3f of the primaries", float64(got["a"])/picks)
}

// A primary's pairing goes to the safer route when the two risks lie
// beyond the margins PickHedge uses, however idle the riskier one is, and
// to the lower score (load first) when they lie within them.
func TestPickPrimaryGivesThePairingToTheSaferRouteBeforeTheIdlerOne(t *testing.T) {
	tests := []struct {
		name string
		// stalled is how many of each route's 40 judged primaries stalled.
		stalled   map[string]int
		wantShare float64 // of the idle route a
	}{
		{"a route stalling far more than its siblings loses every pairing, however idle",
			map[string]int{"a": 12, "b": 1, "c": 1}, 0},
		{"a route stalling a little more, within the margins, wins its pairings on load",
			map[string]int{"a": 3, "b": 2, "c": 2}, 2.0 / 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newTestPicker(t, plain("a", "b", "c")...)
			pool := []string{"a", "b", "c"}
			for _, name := range pool {
				mustDo(t, p.Observe(name, 500*time.Millisecond, t0))
				for i := range 40 {
					mustDo(t, p.ObserveStall(name, i < tt.stalled[name], t0))
				}
			}
			for _, name := range []string{"b", "c"} {
				for range 12 {
					mustDo(t, p.Acquire(name))
				}
			}
			const n = 3000
			got := shares(t, n, func(rng *rand.Rand) (string, bool) { return p.PickPrimary(pool, t0, rng) })
			if share := float64(got["a"]) / n; math.Abs(share-tt.wantShare) > 0.03 {
				t.Fatalf("the idle route a drew %.3f of the primaries (%v), want %.3f", share, got, tt.wantShare)
			}
		})
	}
}

func TestEqualStallSharesLeaveThePrimariesEven(t *testing.T) {
	p := newTestPicker(t, plain("a", "b", "c")...)
	pool := []string{"a", "b", "c"}
	rng := seeded(6)
	even := every(map[string]int{"a": 20, "b": 20, "c": 20})
	_, now := stallRun(t, p, pool, even, 3000, 12, t0, rng)
	got, _ := stallRun(t, p, pool, even, 3000, 12, now, rng)
	for _, name := range pool {
		if share := float64(got[name]) / 3000; share < 0.3 || share > 0.37 {
			t.Fatalf("route %s drew %.3f of the primaries (%v), want about 1/3", name, share, got)
		}
	}
}

func TestRiskMarginsNarrowWithEvidence(t *testing.T) {
	tests := []struct {
		name           string
		ra, na, rb, nb float64
		want           bool
	}{
		{"a fresh route's first failure is beyond the margins", 0.525, 20, 0.05, 20, true},
		{"7 % against 4.8 % on 40 primaries each is noise", 0.07, 40, 0.048, 40, false},
		{"7 % against 4.8 % on 2,000 primaries each is a difference", 0.07, 2000, 0.048, 2000, true},
		{"7 % on 200 primaries against 4.8 % on 2,000 is not yet firm", 0.07, 200, 0.048, 2000, false},
		{"two stalls more in a cold route's first twenty primaries are noise", 0.125, 40, 0.025, 40, false},
		{"12 % against 5 % on 150 primaries each is a difference", 0.12, 150, 0.05, 150, true},
		{"equal risks are never riskier", 0.05, 5000, 0.05, 5000, false},
		{"the lower risk is never riskier", 0.048, 2000, 0.07, 2000, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := riskier(tt.ra, tt.na, tt.rb, tt.nb); got != tt.want {
				t.Fatalf("riskier(%v on %v, %v on %v) = %v, want %v", tt.ra, tt.na, tt.rb, tt.nb, got, tt.want)
			}
		})
	}
}

// Routes whose primaries stall at random at one rate keep about a third of
// the primaries each in every minute, however long they run: chance leads
// in the shares do not starve a route (a fixed narrow margin did, live:
// one of three equal routes drew a seventh of the primaries).
func TestNoisyEqualRoutesKeepTheirPrimariesEveryMinute(t *testing.T) {
	p := newTestPicker(t, plain("a", "b", "c")...)
	pool := []string{"a", "b", "c"}
	rng := seeded(1)
	stalls := chance(map[string]float64{"a": 0.05, "b": 0.05, "c": 0.05}, 101)
	now := t0
	const minute = 3000 // picks, at 50 a second
	for m := range 20 {
		var got map[string]int
		got, now = stallRun(t, p, pool, stalls, minute, 12, now, rng)
		for _, name := range pool {
			if share := float64(got[name]) / minute; share < 0.2 || share > 0.45 {
				t.Fatalf("minute %d: route %s drew %.3f of the primaries (%v), want about 1/3", m, name, share, got)
			}
		}
	}
}

// A route whose primaries stall at random half as often again as its
// siblings' (7 % against 4.8 %, as a route with twice their stalls reads
// once the slow answers every route has are counted too) loses most of its
// primaries once the shares rest on enough of them, keeps a few to learn
// from, and wins them back when it recovers.
func TestANoisyRouteStallingMoreOftenLosesMostOfItsPrimaries(t *testing.T) {
	p := newTestPicker(t, plain("a", "b", "c")...)
	pool := []string{"a", "b", "c"}
	rng := seeded(9)
	const picks = 6000 // two minutes at 50 a second
	degraded := chance(map[string]float64{"a": 0.07, "b": 0.048, "c": 0.048}, 10)
	_, now := stallRun(t, p, pool, degraded, picks, 12, t0, rng) // learn
	got, now := stallRun(t, p, pool, degraded, picks, 12, now, rng)
	if share := float64(got["a"]) / picks; share > 0.2 || share < 0.01 {
		t.Fatalf("route stalling 7 %% against 4.8 %% drew %.3f of the primaries (%v), want under 0.2 but not none", share, got)
	}
	t.Logf("degraded: a drew %.3f of the primaries", float64(got["a"])/picks)
	recovered := chance(map[string]float64{"a": 0.048, "b": 0.048, "c": 0.048}, 11)
	_, now = stallRun(t, p, pool, recovered, picks, 12, now, rng)
	got, _ = stallRun(t, p, pool, recovered, picks, 12, now, rng)
	if share := float64(got["a"]) / picks; share < 0.25 {
		t.Fatalf("recovered route drew %.3f of the primaries (%v), want about 1/3", share, got)
	}
}

func TestDecodeTimeIsAnAnsweredStreamsTimePerTokenAfterItsFirst(t *testing.T) {
	tests := []struct {
		name               string
		stream             bool
		status             schemas.StatusClass
		elapsed, firstByte time.Duration
		tokens             int
		want               time.Duration
		wantOK             bool
	}{
		{"an answered stream", true, schemas.StatusOK, 1300 * time.Millisecond, 300 * time.Millisecond, 21, 50 * time.Millisecond, true},
		{"a whole answer says nothing of its pace", false, schemas.StatusOK, time.Second, 900 * time.Millisecond, 21, 0, false},
		{"a failed stream", true, schemas.StatusServerError, time.Second, 300 * time.Millisecond, 21, 0, false},
		{"a stream of one token", true, schemas.StatusOK, time.Second, 300 * time.Millisecond, 1, 0, false},
		{"a stream without a first byte", true, schemas.StatusOK, time.Second, 0, 21, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := DecodeTime(tt.stream, tt.status, tt.elapsed, tt.firstByte, tt.tokens)
			if got != tt.want || ok != tt.wantOK {
				t.Fatalf("DecodeTime = %v, %v; want %v, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// At equal loads and first tokens, a route whose streams decode at half
// its siblings' pace loses its pairings (in a closed loop the siblings'
// loads then grow until it wins some back); equal paces, and paces all
// under a millisecond a token (the path's jitter), leave the pairings even.
func TestARouteDecodingSlowerLosesItsPairingsAtEqualLoads(t *testing.T) {
	tests := []struct {
		name      string
		perToken  map[string]time.Duration
		wantBelow float64 // route a's share
		wantAbove float64
	}{
		{"half the pace", map[string]time.Duration{"a": 40 * time.Millisecond, "b": 20 * time.Millisecond, "c": 20 * time.Millisecond}, 0.01, 0},
		{"the same pace", map[string]time.Duration{"a": 20 * time.Millisecond, "b": 20 * time.Millisecond, "c": 20 * time.Millisecond}, 0.37, 0.3},
		{"paces under the floor count alike", map[string]time.Duration{"a": 400 * time.Microsecond, "b": 100 * time.Microsecond, "c": 100 * time.Microsecond}, 0.37, 0.3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newTestPicker(t, plain("a", "b", "c")...)
			pool := []string{"a", "b", "c"}
			for _, name := range pool {
				mustDo(t, p.Observe(name, 300*time.Millisecond, t0))
				mustDo(t, p.ObserveDecode(name, tt.perToken[name], t0))
				for range 4 {
					mustDo(t, p.Acquire(name))
				}
			}
			const n = 3000
			got := shares(t, n, func(rng *rand.Rand) (string, bool) { return p.PickPrimary(pool, t0, rng) })
			if share := float64(got["a"]) / n; share > tt.wantBelow || share < tt.wantAbove {
				t.Fatalf("route a drew %.3f of the primaries (%v), want within [%.2f, %.2f]", share, got, tt.wantAbove, tt.wantBelow)
			}
		})
	}
}

func TestPickHedgeTakesTheRouteLeastLikelyToStallOrFailNow(t *testing.T) {
	pool := []string{"a", "b", "c"}
	tests := []struct {
		name string
		feed func(p *Picker)
		want string
	}{
		{"a cold route's first failure steers the replacement away", func(p *Picker) {
			mustDo(t, p.ObserveOutcome("b", false, t0))
		}, "c"},
		{"a route whose primaries stall loses the hedge", func(p *Picker) {
			for i := range 20 {
				mustDo(t, p.ObserveStall("c", i%4 == 0, t0))
				mustDo(t, p.ObserveStall("b", false, t0))
			}
		}, "b"},
		{"stalls and failures weigh against load", func(p *Picker) {
			mustDo(t, p.Acquire("c"))
			for range 3 {
				mustDo(t, p.ObserveOutcome("b", false, t0))
			}
		}, "c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newTestPicker(t, plain("a", "b", "c")...)
			tt.feed(p)
			got := shares(t, 200, func(rng *rand.Rand) (string, bool) {
				return p.PickHedge(pool, []string{"a"}, t0, rng, false)
			})
			if got[tt.want] != 200 {
				t.Fatalf("hedge picks %v, want %s every time", got, tt.want)
			}
			if name, _ := p.PickHedge(pool, []string{"a"}, t0, nil, false); name != tt.want {
				t.Fatalf("PickHedge without rng = %s, want %s", name, tt.want)
			}
		})
	}
}

func TestPickHedgeSendsTheReplacementToTheSaferRouteEvenWhenItIsBusier(t *testing.T) {
	p := newTestPicker(t, plain("a", "b", "c")...)
	// A cold gateway: b failed once, c holds two attempts in flight.
	mustDo(t, p.ObserveOutcome("b", false, t0))
	mustDo(t, p.Acquire("c"))
	mustDo(t, p.Acquire("c"))
	got := shares(t, 200, func(rng *rand.Rand) (string, bool) {
		return p.PickHedge([]string{"a", "b", "c"}, []string{"a"}, t0, rng, false)
	})
	if got["c"] != 200 {
		t.Fatalf("replacement picks %v, want c, the route that has not failed, every time", got)
	}
}

func TestARouteWithoutStallDataIsScoredAtItsPoolsShare(t *testing.T) {
	p := newTestPicker(t, plain("a", "b", "c")...)
	pool := []string{"a", "b", "c"}
	// b and c answered 100 primaries each within the delay; a, new or
	// quiet, has none judged.
	for range 100 {
		mustDo(t, p.ObserveStall("b", false, t0))
		mustDo(t, p.ObserveStall("c", false, t0))
	}
	got := shares(t, 900, func(rng *rand.Rand) (string, bool) { return p.PickPrimary(pool, t0, rng) })
	if share := float64(got["a"]) / 900; share < 0.3 {
		t.Fatalf("route without stall data drew %.3f of the primaries (%v), want about 1/3", share, got)
	}
}
