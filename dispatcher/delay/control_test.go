package delay

import (
	"fmt"
	"math"
	"testing"
)

func TestControlFractionHitsItsShareOver100kDraws(t *testing.T) {
	const draws = 100_000
	r := newRand(2025)
	tests := []struct {
		name     string
		fraction float64
		draw     func(i int) float64
	}{
		{"default fraction, seeded rng", DefaultControlFraction, func(int) float64 { return r.Float64() }},
		{"default fraction, hashed group ids", DefaultControlFraction, func(i int) float64 { return UniformFromID(fmt.Sprintf("grp-%d", i)) }},
		{"ten percent, hashed group ids", 0.10, func(i int) float64 { return UniformFromID(fmt.Sprintf("01HV%08d", i)) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			control := 0
			for i := range draws {
				if IsControl(tt.draw(i), tt.fraction) {
					control++
				}
			}
			// Four binomial standard deviations: a false failure is ~1e-4.
			tol := 4 * math.Sqrt(draws*tt.fraction*(1-tt.fraction))
			if want := draws * tt.fraction; math.Abs(float64(control)-want) > tol {
				t.Fatalf("%d control groups of %d, want %.0f ± %.0f", control, draws, want, tol)
			}
		})
	}
}

func TestIsControlHandlesEdgeInputs(t *testing.T) {
	tests := []struct {
		name        string
		u, fraction float64
		want        bool
	}{
		{"zero fraction never controls", 0, 0, false},
		{"full fraction always controls", 0.999, 1, true},
		{"fraction above one is clamped", 0.999, 7, true},
		{"negative fraction is clamped", 0, -1, false},
		{"NaN draw is never control", math.NaN(), 0.5, false},
		{"NaN fraction is never control", 0.1, math.NaN(), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := IsControl(tt.u, tt.fraction); got != tt.want {
				t.Fatalf("IsControl(%v, %v) = %v, want %v", tt.u, tt.fraction, got, tt.want)
			}
		})
	}
}

func TestUniformFromIDIsStableAndInRange(t *testing.T) {
	for _, id := range []string{"", "a", "grp-1", "grp-2"} {
		u := UniformFromID(id)
		if u < 0 || u >= 1 || u != UniformFromID(id) {
			t.Fatalf("UniformFromID(%q) = %v, want a stable draw in [0, 1)", id, u)
		}
	}
}
