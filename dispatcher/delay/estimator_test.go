package delay

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

func TestNewEstimatorRejectsInvalidConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Options
	}{
		{"quantile of one", Options{Quantile: 1}},
		{"negative quantile", Options{Quantile: -0.5}},
		{"max below min", Options{Min: 2 * time.Second, Max: time.Second, Initial: time.Second}},
		{"initial above max", Options{Max: time.Second, Initial: 2 * time.Second}},
		{"negative warm-up", Options{WarmupSamples: -1}},
		{"slots shorter than a millisecond", Options{Window: time.Millisecond, Slots: 10}},
		{"negative slots", Options{Slots: -3}},
		{"accuracy of one", Options{RelativeAccuracy: 1}},
		{"too few bins", Options{MaxBins: 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewEstimator(tt.cfg); !errors.Is(err, ErrInvalidOptions) {
				t.Fatalf("NewEstimator(%+v) error = %v, want ErrInvalidOptions", tt.cfg, err)
			}
		})
	}
}

func TestZeroConfigTakesDefaults(t *testing.T) {
	e := mustEstimator(t, Options{})
	got, want := e.Options(), DefaultOptions()
	want.Min, want.WarmupSamples = 0, 0 // zero is meaningful for both
	if got != want {
		t.Fatalf("Options() = %+v, want %+v", got, want)
	}
}

func TestDelayIsInitialUntilWarmup(t *testing.T) {
	cfg := Options{Initial: 700 * time.Millisecond, Min: 10 * time.Millisecond, WarmupSamples: 50}
	tests := []struct {
		name     string
		samples  int
		wantWarm bool
	}{
		{"no samples", 0, false},
		{"one short of warm-up", 49, false},
		{"exactly warm-up", 50, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustEstimator(t, cfg)
			for i := range tt.samples {
				if err := e.ObservePrimary(testCohort, t0, 2*time.Second+time.Duration(i)*time.Millisecond); err != nil {
					t.Fatal(err)
				}
			}
			d := e.Delay(testCohort, t0, time.Minute)
			if d.Warm != tt.wantWarm || d.Samples != tt.samples {
				t.Fatalf("Delay = %+v, want warm=%v samples=%d", d, tt.wantWarm, tt.samples)
			}
			if !tt.wantWarm && d.Value != cfg.Initial {
				t.Fatalf("cold delay = %v, want initial %v", d.Value, cfg.Initial)
			}
			if tt.wantWarm && d.Value < 2*time.Second {
				t.Fatalf("warm delay = %v, want the window quantile ≥ 2s", d.Value)
			}
		})
	}
}

func TestDelayIsTheWindowQuantileWithinSketchAccuracy(t *testing.T) {
	tests := []struct {
		name     string
		quantile float64
		seed     uint64
	}{
		{"p95 of gpt4o ttft", 0.95, 1},
		{"p90 of gpt4o ttft", 0.90, 2},
		{"p99 of gpt4o ttft", 0.99, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustEstimator(t, Options{Quantile: tt.quantile, Max: time.Minute})
			r := newRand(tt.seed)
			xs := make([]time.Duration, 20000)
			for i := range xs {
				xs[i] = gpt4oTTFT(r)
				if err := e.ObservePrimary(testCohort, t0.Add(time.Duration(i)*time.Millisecond), xs[i]); err != nil {
					t.Fatal(err)
				}
			}
			d := e.Delay(testCohort, t0.Add(20*time.Second), time.Minute)
			want := exactQuantile(xs, tt.quantile)
			if !d.Warm || relErr(d.Value, want) > 0.011 {
				t.Fatalf("delay = %v (warm %v), want %v within 1%%", d.Value, d.Warm, want)
			}
		})
	}
}

func TestDelayClampsToMinMaxAndRemainingTime(t *testing.T) {
	cfg := Options{Min: 200 * time.Millisecond, Max: 3 * time.Second, Initial: time.Second, WarmupSamples: 10}
	tests := []struct {
		name      string
		latency   time.Duration // every sample
		remaining time.Duration
		want      time.Duration
		wantClamp Clamp
	}{
		{"quantile inside the bounds", time.Second, time.Minute, time.Second, ClampNone},
		{"fast cohort clamps to min", 20 * time.Millisecond, time.Minute, 200 * time.Millisecond, ClampMin},
		{"slow cohort clamps to max", 10 * time.Second, time.Minute, 3 * time.Second, ClampMax},
		{"deadline cuts below the quantile", time.Second, 400 * time.Millisecond, 400 * time.Millisecond, ClampDeadline},
		{"deadline cuts below min too", 20 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond, ClampDeadline},
		{"deadline already past gives zero", time.Second, -time.Second, 0, ClampDeadline},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustEstimator(t, cfg)
			for range 20 {
				if err := e.ObservePrimary(testCohort, t0, tt.latency); err != nil {
					t.Fatal(err)
				}
			}
			d := e.Delay(testCohort, t0, tt.remaining)
			if relErr(d.Value, tt.want) > 0.01 && d.Value != tt.want || d.Clamp != tt.wantClamp {
				t.Fatalf("Delay = %+v, want %v clamped by %q", d, tt.want, tt.wantClamp)
			}
		})
	}
	t.Run("cold delay is cut by the deadline too", func(t *testing.T) {
		e := mustEstimator(t, cfg)
		if d := e.Delay(testCohort, t0, 300*time.Millisecond); d.Value != 300*time.Millisecond || d.Clamp != ClampDeadline {
			t.Fatalf("Delay = %+v, want 300ms clamped by deadline", d)
		}
	})
}

func TestOldSlotsRollOutOfTheWindow(t *testing.T) {
	// 60 s window in 6 slots of 10 s: slow samples at t0, fast ones 30 s later.
	cfg := Options{Window: time.Minute, Slots: 6, Min: time.Millisecond, WarmupSamples: 1}
	tests := []struct {
		name        string
		at          time.Duration
		wantSamples int
		wantFast    bool
	}{
		{"both batches in the window", 40 * time.Second, 200, false},
		{"last moment of the slow slot", 59*time.Second + 999*time.Millisecond, 200, false},
		{"slow slot rolled out", 60 * time.Second, 100, true},
		{"everything rolled out", 90 * time.Second, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustEstimator(t, cfg)
			for range 100 {
				_ = e.ObservePrimary(testCohort, t0, 5*time.Second)
				_ = e.ObservePrimary(testCohort, t0.Add(30*time.Second), 500*time.Millisecond)
			}
			d := e.Delay(testCohort, t0.Add(tt.at), time.Minute)
			if d.Samples != tt.wantSamples {
				t.Fatalf("samples = %d, want %d", d.Samples, tt.wantSamples)
			}
			if tt.wantFast && relErr(d.Value, 500*time.Millisecond) > 0.01 {
				t.Fatalf("delay = %v, want ≈500ms once the slow slot rolled out", d.Value)
			}
		})
	}
}

func TestStaleSampleNeverEvictsNewerSlot(t *testing.T) {
	e := mustEstimator(t, Options{Window: time.Minute, Slots: 6, WarmupSamples: 1})
	_ = e.ObservePrimary(testCohort, t0.Add(2*time.Minute), time.Second)
	// A sample from exactly one window earlier maps to the same ring position.
	_ = e.ObservePrimary(testCohort, t0.Add(time.Minute), 9*time.Second)
	if d := e.Delay(testCohort, t0.Add(2*time.Minute), time.Minute); d.Samples != 1 || relErr(d.Value, time.Second) > 0.01 {
		t.Fatalf("Delay = %+v, want the one newer 1s sample", d)
	}
}

func TestWindowRotatesOnAVirtualClockStartingAtZeroTime(t *testing.T) {
	e := mustEstimator(t, Options{Window: time.Minute, Slots: 6, WarmupSamples: 1})
	var zero time.Time
	_ = e.ObservePrimary(testCohort, zero, time.Second)
	if d := e.Delay(testCohort, zero.Add(59*time.Second), time.Minute); d.Samples != 1 {
		t.Fatalf("samples inside the window = %d, want 1", d.Samples)
	}
	if d := e.Delay(testCohort, zero.Add(61*time.Second), time.Minute); d.Samples != 0 {
		t.Fatalf("samples after the window = %d, want 0", d.Samples)
	}
}

func TestObservationsRejectNegativeLatency(t *testing.T) {
	e := mustEstimator(t, Options{})
	if err := e.ObservePrimary(testCohort, t0, -time.Millisecond); !errors.Is(err, ErrNegativeLatency) {
		t.Errorf("ObservePrimary error = %v, want ErrNegativeLatency", err)
	}
	if _, err := e.ObserveSuperseded(testCohort, t0, -time.Millisecond); !errors.Is(err, ErrNegativeLatency) {
		t.Errorf("ObserveSuperseded error = %v, want ErrNegativeLatency", err)
	}
}

func TestMergingSnapshotsEqualsObservingAllSamples(t *testing.T) {
	cfg := Options{Window: time.Minute, Slots: 6, WarmupSamples: 100, Max: time.Minute}
	a, b, all := mustEstimator(t, cfg), mustEstimator(t, cfg), mustEstimator(t, cfg)
	r := newRand(7)
	for i := range 6000 {
		at := t0.Add(time.Duration(i) * 10 * time.Millisecond) // spans all six slots
		x := gpt4oTTFT(r)
		if i%3 == 0 { // uneven split, and b's share is slower
			x *= 2
			_ = b.ObservePrimary(testCohort, at, x)
		} else {
			_ = a.ObservePrimary(testCohort, at, x)
		}
		_ = all.ObservePrimary(testCohort, at, x)
	}
	now := t0.Add(60 * time.Second)
	if err := a.Merge(testCohort, now, b.Snapshot(testCohort, now)); err != nil {
		t.Fatal(err)
	}
	if err := b.Merge(testCohort, now, a.Snapshot(testCohort, now)); err != nil {
		t.Fatal(err)
	}
	want := all.Delay(testCohort, now, time.Minute)
	for name, e := range map[string]*Estimator{"a": a, "b": b} {
		if got := e.Delay(testCohort, now, time.Minute); got != want {
			t.Errorf("replica %s Delay = %+v, want %+v as from one estimator", name, got, want)
		}
	}
	// Merging the same snapshots again replaces the peer samples.
	if err := a.Merge(testCohort, now, b.Snapshot(testCohort, now)); err != nil {
		t.Fatal(err)
	}
	if got := a.Delay(testCohort, now, time.Minute); got != want {
		t.Errorf("after a second Merge Delay = %+v, want %+v (peers counted once)", got, want)
	}
}

func TestMergeRefusesMismatchedOrCorruptSnapshots(t *testing.T) {
	e := mustEstimator(t, Options{Window: time.Minute, Slots: 6})
	other := mustEstimator(t, Options{Window: time.Minute, Slots: 3})
	coarse := mustEstimator(t, Options{Window: time.Minute, Slots: 6, RelativeAccuracy: 0.05})
	for _, x := range []*Estimator{e, other, coarse} {
		_ = x.ObservePrimary(testCohort, t0, time.Second)
	}
	good := e.Snapshot(testCohort, t0)
	corrupt := append([]SlotSnapshot(nil), good...)
	corrupt[0].Sketch = []byte{0xff, 0x01, 0x02}
	tests := []struct {
		name     string
		snaps    []SlotSnapshot
		wantErr  error
		wantNone bool // any error will do
	}{
		{"another slot width", other.Snapshot(testCohort, t0), ErrSnapshotMismatch, false},
		{"another accuracy", coarse.Snapshot(testCohort, t0), ErrSnapshotMismatch, false},
		{"corrupt bytes", corrupt, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := e.Merge(testCohort, t0, tt.snaps)
			if err == nil || (!tt.wantNone && !errors.Is(err, tt.wantErr)) {
				t.Fatalf("Merge error = %v, want %v", err, tt.wantErr)
			}
			if d := e.Delay(testCohort, t0, time.Minute); d.Samples != 1 {
				t.Fatalf("after a failed Merge samples = %d, want the own 1", d.Samples)
			}
		})
	}
}

func TestMergeIgnoresSnapshotsOutsideTheWindow(t *testing.T) {
	cfg := Options{Window: time.Minute, Slots: 6, WarmupSamples: 1}
	a, b := mustEstimator(t, cfg), mustEstimator(t, cfg)
	_ = b.ObservePrimary(testCohort, t0, time.Second)
	snaps := b.Snapshot(testCohort, t0)
	if err := a.Merge(testCohort, t0.Add(2*time.Minute), snaps); err != nil {
		t.Fatal(err)
	}
	if d := a.Delay(testCohort, t0.Add(2*time.Minute), time.Minute); d.Samples != 0 {
		t.Fatalf("samples = %d, want 0: the snapshot's slot had rolled out", d.Samples)
	}
}

// degradedPrimary draws a primary's time to first byte on a route that is
// degraded (docs/architecture.md §11: TTFT ×5, here with a wide spread) for a fifth of the
// requests; healthyHedge draws the hedge's on another, healthy route.
func degradedPrimary(r *rand.Rand) time.Duration {
	if r.Float64() < 0.8 {
		return lognormal(r, 620*time.Millisecond, 0.33)
	}
	return lognormal(r, 3100*time.Millisecond, 1.0)
}

func healthyHedge(r *rand.Rand) time.Duration { return lognormal(r, 620*time.Millisecond, 0.33) }

// TestCensoringRuleKeepsTheQuantileWhenPrimariesAreSuperseded runs the
// estimator in a closed loop: each primary hedges at the current delay, and
// when the hedge answers first the primary is superseded, its latency never
// known. Recording it at its elapsed time keeps the estimate on the true
// quantile (at the fixed point exactly the primaries slower than the delay
// are recorded above it); recording nothing removes the slow primaries and
// the delay spirals down — the reason the rule exists.
func TestCensoringRuleKeepsTheQuantileWhenPrimariesAreSuperseded(t *testing.T) {
	tests := []struct {
		name           string
		quantile       float64
		primary, hedge func(*rand.Rand) time.Duration
		recordCensored bool
		minSuperseded  float64 // share of primaries superseded, to prove the scenario
		maxRelErr      float64 // with the rule: estimate within this of the truth
		minLowBias     float64 // without it: estimate at least this far below
	}{
		{"p90 delay, ~9% superseded, rule applied", 0.90, degradedPrimary, healthyHedge, true, 0.08, 0.03, 0},
		{"p90 delay, ~9% superseded, nothing recorded", 0.90, degradedPrimary, healthyHedge, false, 0.08, 0, 0.30},
		{"p95 delay, most of the tail superseded, rule applied", 0.95, degradedPrimary, healthyHedge, true, 0.04, 0.03, 0},
		{"p95 delay, most of the tail superseded, nothing recorded", 0.95, degradedPrimary, healthyHedge, false, 0.04, 0, 0.30},
		{"p95 delay on gpt4o, rule applied", 0.95, gpt4oTTFT, gpt4oTTFT, true, 0.02, 0.03, 0},
		{"p95 delay on gpt4o, nothing recorded", 0.95, gpt4oTTFT, gpt4oTTFT, false, 0.02, 0, 0.05},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustEstimator(t, Options{Quantile: tt.quantile, Min: time.Millisecond, Max: time.Minute,
				Initial: time.Second, WarmupSamples: 200, Window: 2 * time.Minute, Slots: 12})
			r := newRand(42)
			const n = 30000
			truth := make([]time.Duration, n)
			superseded := 0
			for i := range truth {
				now := t0.Add(time.Duration(i) * 20 * time.Millisecond)
				d := e.Delay(testCohort, now, 30*time.Second).Value
				primary, hedge := tt.primary(r), tt.hedge(r)
				truth[i] = primary
				if primary > d && d+hedge < primary {
					superseded++
					if tt.recordCensored {
						if _, err := e.ObserveSuperseded(testCohort, now, d+hedge); err != nil {
							t.Fatal(err)
						}
					}
					continue
				}
				if err := e.ObservePrimary(testCohort, now, primary); err != nil {
					t.Fatal(err)
				}
			}
			got := e.Delay(testCohort, t0.Add(n*20*time.Millisecond), 30*time.Second).Estimate
			want := exactQuantile(truth, tt.quantile)
			share := float64(superseded) / n
			t.Logf("superseded %.1f%%, estimate %v, true %v", 100*share, got, want)
			if share < tt.minSuperseded {
				t.Fatalf("only %.1f%% superseded, scenario needs ≥ %.0f%%", 100*share, 100*tt.minSuperseded)
			}
			if tt.recordCensored && relErr(got, want) > tt.maxRelErr {
				t.Fatalf("with the censoring rule estimate %v, want %v within %.0f%%", got, want, 100*tt.maxRelErr)
			}
			if !tt.recordCensored && float64(got) > (1-tt.minLowBias)*float64(want) {
				t.Fatalf("recording nothing estimate %v, want biased ≥ %.0f%% below %v", got, 100*tt.minLowBias, want)
			}
		})
	}
}

func TestSupersededPrimaryBelowTheCurrentDelayIsNotRecorded(t *testing.T) {
	e := mustEstimator(t, Options{Initial: time.Second, WarmupSamples: 1000})
	tests := []struct {
		elapsed time.Duration
		want    bool
	}{
		{999 * time.Millisecond, false},
		{time.Second, true},
		{3 * time.Second, true},
	}
	for _, tt := range tests {
		got, err := e.ObserveSuperseded(testCohort, t0, tt.elapsed)
		if err != nil || got != tt.want {
			t.Errorf("ObserveSuperseded(%v) = %v, %v; want %v", tt.elapsed, got, err, tt.want)
		}
	}
}

func TestCohortsAreListedInKeyOrder(t *testing.T) {
	e := mustEstimator(t, Options{})
	b, a := NewCohort("b", "m", false, 0), NewCohort("a", "m", true, 100)
	_ = e.ObservePrimary(b, t0, time.Second)
	_ = e.ObservePrimary(a, t0, time.Second)
	got := e.Cohorts()
	if len(got) != 2 || got[0] != a || got[1] != b {
		t.Fatalf("Cohorts() = %v, want [%v %v]", got, a, b)
	}
}
