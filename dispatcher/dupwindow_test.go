package dispatcher

import (
	"testing"
	"time"
)

// launch is one attempt launched, at an offset from the test's start.
type launch struct {
	at      time.Duration
	primary bool
}

func TestDuplicateRateWindowCountsExtrasPerPrimaryWithinTheWindowOnly(t *testing.T) {
	const window = 10 * time.Second
	t0 := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name     string
		launches []launch
		at       time.Duration
		want     float64
	}{
		{"no primary yet", nil, 0, 0},
		{"one hedge per two primaries", []launch{{0, true}, {time.Second, true}, {2 * time.Second, false}}, 3 * time.Second, 0.5},
		{"launches older than the window slid out", []launch{{0, true}, {0, false}, {0, false}, {11 * time.Second, true}}, 12 * time.Second, 0},
		{"another cohort's launches are not counted", []launch{{0, true}}, time.Second, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w dupWindows
			w.count("other", window, t0, false) // a hedge of another cohort
			for _, l := range tt.launches {
				w.count("c", window, t0.Add(l.at), l.primary)
			}
			if got := w.rate("c", window, t0.Add(tt.at)); got != tt.want {
				t.Fatalf("rate = %v, want %v", got, tt.want)
			}
		})
	}
}
