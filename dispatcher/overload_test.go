package dispatcher

import (
	"testing"
	"time"
)

// A pool is saturated from a Busy until an Accept, or until the Busy is
// older than the freshness window; its overload is logged at most once per
// overloadLogEvery (docs/architecture.md §4 rule 4).
func TestOverloadTracksSaturationAndRateLimitsItsLog(t *testing.T) {
	var o overload
	t0 := time.Unix(1_800_000_000, 0)
	if o.saturated("p", t0, time.Second) || o.accepted("p") {
		t.Fatal("a pool never refused is saturated")
	}
	if !o.busy("p", t0) {
		t.Fatal("the first Busy of a pool is not logged")
	}
	if o.busy("p", t0.Add(overloadLogEvery-time.Millisecond)) {
		t.Fatal("a second overload line within overloadLogEvery")
	}
	if !o.busy("p", t0.Add(overloadLogEvery)) {
		t.Fatal("no overload line after overloadLogEvery")
	}
	last := t0.Add(overloadLogEvery)
	if !o.saturated("p", last.Add(999*time.Millisecond), time.Second) || o.saturated("q", last, time.Second) {
		t.Fatal("saturation not kept per pool")
	}
	if o.saturated("p", last.Add(time.Second), time.Second) {
		t.Fatal("a Busy older than the freshness window still saturates")
	}
	if !o.accepted("p") || o.saturated("p", last, time.Second) {
		t.Fatal("an Accept did not end the saturation")
	}
}
