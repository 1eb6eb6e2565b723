package budgets_test

import (
	"math"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/schemas"
)

func TestCancelledAttemptSettlesAtLargerOfReportAndDecodeEstimate(t *testing.T) {
	tests := []struct {
		name     string
		reported schemas.Usage
		elapsed  time.Duration
		tps      float64
		want     schemas.Usage
	}{
		{"estimate exceeds the report",
			schemas.Usage{InputUnits: 500, OutputUnits: 10}, 2 * time.Second, 100,
			schemas.Usage{InputUnits: 500, OutputUnits: 200, Estimated: true}},
		{"report exceeds the estimate",
			schemas.Usage{InputUnits: 500, OutputUnits: 300}, 2 * time.Second, 100,
			schemas.Usage{InputUnits: 500, OutputUnits: 300}},
		{"a tie keeps the report",
			schemas.Usage{OutputUnits: 50}, 500 * time.Millisecond, 100,
			schemas.Usage{OutputUnits: 50}},
		{"a partial token is billed whole",
			schemas.Usage{}, 15 * time.Millisecond, 130,
			schemas.Usage{OutputUnits: 2, Estimated: true}},
		{"nothing reported, provider lag billed",
			schemas.Usage{InputUnits: 800}, 200 * time.Millisecond, 104,
			schemas.Usage{InputUnits: 800, OutputUnits: 21, Estimated: true}},
		{"an estimated report stays estimated",
			schemas.Usage{OutputUnits: 90, Estimated: true}, time.Second, 10,
			schemas.Usage{OutputUnits: 90, Estimated: true}},
		{"no decode time estimates nothing",
			schemas.Usage{OutputUnits: 3}, 0, 100,
			schemas.Usage{OutputUnits: 3}},
		{"negative decode time estimates nothing",
			schemas.Usage{OutputUnits: 3}, -time.Second, 100,
			schemas.Usage{OutputUnits: 3}},
		{"unknown rate estimates nothing",
			schemas.Usage{OutputUnits: 3}, time.Second, math.NaN(),
			schemas.Usage{OutputUnits: 3}},
		{"infinite rate estimates nothing",
			schemas.Usage{OutputUnits: 3}, time.Second, math.Inf(1),
			schemas.Usage{OutputUnits: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := budgets.EstimateCancelled(tt.reported, tt.elapsed, tt.tps); got != tt.want {
				t.Errorf("EstimateCancelled(%+v, %v, %v) = %+v, want %+v", tt.reported, tt.elapsed, tt.tps, got, tt.want)
			}
		})
	}
}
