package schemas

import (
	"testing"
	"time"
)

func TestEffectiveDeadlineTakesTheEarlierOfAbsoluteAndRemaining(t *testing.T) {
	deadline := eventTime.Add(8 * time.Second)
	a := Attempt{DeadlineUnixMs: deadline.UnixMilli(), RemainingMs: 6000}
	for _, tc := range []struct {
		name     string
		received time.Time // the worker's clock at receipt
		want     time.Time
	}{
		// sent at eventTime+2s with 6s left
		{"clocks agree", eventTime.Add(2 * time.Second), deadline},
		{"worker clock behind cannot extend", eventTime.Add(-3 * time.Second), eventTime.Add(3 * time.Second)},
		{"worker clock ahead ends at the absolute deadline", eventTime.Add(4 * time.Second), deadline},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := a.EffectiveDeadline(tc.received); !got.Equal(tc.want) {
				t.Errorf("EffectiveDeadline(%v) = %v, want %v", tc.received, got, tc.want)
			}
		})
	}
}
