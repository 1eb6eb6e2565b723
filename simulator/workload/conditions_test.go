package workload

import (
	"math"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

func TestPinnedConditionsAreTheEvaluationConditions(t *testing.T) {
	c := PinnedConditions()
	want := Conditions{Deadline: 30 * time.Second, ArrivalRate: 50, InputCostPerToken: 1, OutputCostPerToken: 4}
	if c != want {
		t.Errorf("PinnedConditions() = %+v, want %+v", c, want)
	}
	if got := c.Cost(schemas.Usage{InputUnits: 800, OutputUnits: 150}); got != 1400 {
		t.Errorf("cost of 800 in + 150 out = %v, want 1400", got)
	}
}

func TestFailedGroupsCountAtTheDeadline(t *testing.T) {
	c := PinnedConditions()
	tests := []struct {
		name    string
		latency time.Duration
		failed  bool
		want    time.Duration
	}{
		{"success counts its latency", 2 * time.Second, false, 2 * time.Second},
		{"fast failure counts at the deadline", 300 * time.Millisecond, true, 30 * time.Second},
		{"hang counts at the deadline", Never, false, 30 * time.Second},
	}
	for _, tt := range tests {
		if got := c.LatencyAtDeadline(tt.latency, tt.failed); got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestArrivalsArePoissonAtTheRate(t *testing.T) {
	a, err := NewArrivals(PinnedArrivalRate, 3)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewArrivals(PinnedArrivalRate, 3)
	const n = 100_000
	gaps := make([]float64, n)
	var prev time.Duration
	for i := range n {
		x, y := a.Next(), b.Next()
		if x != y {
			t.Fatalf("arrival %d differs for the same seed: %+v vs %+v", i, x, y)
		}
		if x.ID != uint64(i) || x.At <= prev {
			t.Fatalf("arrival %d = %+v after %v: want id %d and a later time", i, x, prev, i)
		}
		gaps[i] = (x.At - prev).Seconds()
		prev = x.At
	}
	mean, std := meanStd(gaps)
	if !within(mean, 0.02, 0.02) || !within(std/mean, 1, 0.03) {
		t.Errorf("inter-arrival mean %.5f s, CV %.3f; want 0.02 s and 1 (exponential)", mean, std/mean)
	}
	c, _ := NewArrivals(PinnedArrivalRate, 4)
	if c.Next() == a.Next() {
		t.Error("different seeds gave the same arrival")
	}
}

func TestNewArrivalsRejectsNonPositiveRates(t *testing.T) {
	for _, rate := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		if _, err := NewArrivals(rate, 1); err == nil {
			t.Errorf("rate %v accepted", rate)
		}
	}
}

func TestTimeScaleTurnsModelSecondsIntoRealDurations(t *testing.T) {
	half, err := NewTimeScale(0.5)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		scale       TimeScale
		model, real time.Duration
	}{
		{"zero scale is real time", TimeScale{}, 3 * time.Second, 3 * time.Second},
		{"live runs make seconds milliseconds", SecondsAsMilliseconds(), 3500 * time.Millisecond, 3500 * time.Microsecond},
		{"half speed", half, time.Second, 500 * time.Millisecond},
		{"never stays never", SecondsAsMilliseconds(), Never, Never},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.scale.Real(tt.model); got != tt.real {
				t.Errorf("Real(%v) = %v, want %v", tt.model, got, tt.real)
			}
			if got := tt.scale.Model(tt.real); got != tt.model {
				t.Errorf("Model(%v) = %v, want %v", tt.real, got, tt.model)
			}
		})
	}
	for _, f := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		if _, err := NewTimeScale(f); err == nil {
			t.Errorf("factor %v accepted", f)
		}
	}
}
