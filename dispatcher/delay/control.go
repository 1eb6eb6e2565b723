package delay

import (
	"hash/fnv"
	"math"
)

// DefaultControlFraction is the share of groups whose primary-only run is
// the guardrail's live baseline when a policy sets none. It is 1%, not the
// 2% first planned: control groups were then never hedged, so their stalls
// landed in the tail, and on the gpt4o workload 2% of them lifted
// hedgerow's P99.9 from 2.67–2.89 s to 2.93–3.07 s (hedgerow simulate,
// 200,000 requests, seeds 1–3). Control groups hedge now and measure their
// baseline on a primary kept running past the hedge's win
// (docs/architecture.md §5), so their callers no longer pay for it; 1%
// still gathers the guardrail's 1000 control groups in its 30-minute
// window at 56 requests/s per cohort.
const DefaultControlFraction = 0.01

// IsControl reports whether a group whose uniform draw is u (in [0, 1)) is a
// control group — its primary-only run measured as the guardrail's baseline
// — given the control fraction. The draw comes from the caller (a seeded rng in the simulator,
// UniformFromID in the live runtime) so that the choice is reproducible. A
// fraction outside [0, 1] is clamped; a NaN draw is never control.
func IsControl(u, fraction float64) bool {
	if math.IsNaN(u) || math.IsNaN(fraction) {
		return false
	}
	return u < math.Min(math.Max(fraction, 0), 1)
}

// UniformFromID maps an ID (e.g. the hedge group ID) to a uniform draw in
// [0, 1). Every replica computes the same draw for the same group, so a
// group's control status survives retries and replica changes. FNV-1a alone
// mixes sequential IDs poorly in its high bits, so its result goes through
// the splitmix64 finalizer before the top 53 bits become the draw.
func UniformFromID(id string) float64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(id)) // hash.Hash writes never fail
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11) / (1 << 53)
}
