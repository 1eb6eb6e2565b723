package delay

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"time"

	"github.com/DataDog/sketches-go/ddsketch"
	"github.com/DataDog/sketches-go/ddsketch/mapping"
	"github.com/DataDog/sketches-go/ddsketch/store"
)

// SlotSnapshot is one time slot of a cohort's window in portable form, so
// replicas can share one latency distribution through Redis: each replica
// publishes its own slots and merges everyone else's.
type SlotSnapshot struct {
	// Index identifies the slot on a clock shared by all replicas:
	// floor(now.UnixNano() / Width). Replicas with the same Width agree on it.
	Index int64
	// Width is the slot's duration (Window / Slots); merging refuses a
	// snapshot of another width, as its samples would land in the wrong slots.
	Width time.Duration
	// Count is the number of samples in the slot (informational; the sketch
	// is authoritative).
	Count float64
	// Sketch is the slot's DDSketch in sketches-go's binary encoding, index
	// mapping included, latencies in seconds.
	Sketch []byte
}

// ErrSnapshotMismatch is returned when a snapshot cannot be merged: another
// slot width or sketch accuracy, i.e. replicas running different configs.
var ErrSnapshotMismatch = errors.New("delay: snapshot does not match this window")

// sketchSpec builds the bounded-memory sketches of a window. The store
// collapses its lowest bins once maxBins is reached: accuracy is lost only in
// the low quantiles, never in the tail that sets the hedge delay, and a
// corrupt or hostile snapshot cannot make a slot grow without bound.
type sketchSpec struct {
	mapping mapping.IndexMapping
	maxBins int
}

func newSketchSpec(accuracy float64, maxBins int) (sketchSpec, error) {
	m, err := mapping.NewLogarithmicMapping(accuracy)
	if err != nil {
		return sketchSpec{}, fmt.Errorf("delay: sketch accuracy %v: %w", accuracy, err)
	}
	return sketchSpec{mapping: m, maxBins: maxBins}, nil
}

func (s sketchSpec) newSketch() *ddsketch.DDSketch {
	return ddsketch.NewDDSketch(s.mapping, s.provider(), s.provider())
}

func (s sketchSpec) provider() store.Store { return store.NewCollapsingLowestDenseStore(s.maxBins) }

// slot holds the samples of one time slot, plus a count of failures for the
// guardrail's error-rate test.
type slot struct {
	index    int64
	sketch   *ddsketch.DDSketch // nil until the slot gets a sample
	failures float64
}

// ring is a rolling window of len(slots) time slots of equal width. A sample
// lands in the slot of its time; a slot whose index is older than the window
// is cleared before it is reused, which is how old samples roll out.
//
// Queries read a cached merge of the live slots (view), rebuilt only when the
// current slot changes or a sample lands outside it, so a query costs one
// quantile lookup instead of a merge of every slot.
type ring struct {
	spec  sketchSpec
	width time.Duration
	slots []slot

	view         *ddsketch.DDSketch
	viewFailures float64
	viewAt       int64 // slot index the view was built for; noSlot = stale
}

const noSlot = math.MinInt64

func newRing(spec sketchSpec, window time.Duration, n int) ring {
	r := ring{spec: spec, width: window / time.Duration(n), slots: make([]slot, n)}
	r.reset()
	return r
}

func (r *ring) reset() {
	for i := range r.slots {
		r.slots[i].index = noSlot
		if r.slots[i].sketch != nil {
			r.slots[i].sketch.Clear()
		}
		r.slots[i].failures = 0
	}
	r.viewAt = noSlot
}

// slotIndex is floor(now / width) on the Unix clock. UnixNano is undefined
// outside years 1678–2262, so a virtual clock starting at time.Time{} takes
// the exact (slower) big-integer path instead of silently wrapping.
func slotIndex(now time.Time, width time.Duration) int64 {
	const safeSeconds = 9_000_000_000 // |sec·1e9| stays inside int64
	if sec := now.Unix(); sec > -safeSeconds && sec < safeSeconds {
		ns := now.UnixNano()
		i := ns / int64(width)
		if ns%int64(width) < 0 {
			i--
		}
		return i
	}
	n := new(big.Int).Mul(big.NewInt(now.Unix()), big.NewInt(1e9))
	n.Add(n, big.NewInt(int64(now.Nanosecond())))
	n.Div(n, big.NewInt(int64(width))) // Euclidean: floor for a positive divisor
	return n.Int64()
}

// live reports whether a slot index is inside the window that ends at cur.
func (r *ring) live(index, cur int64) bool {
	return index != noSlot && index <= cur && index > cur-int64(len(r.slots))
}

// pos is the ring position of a slot index (Go's % keeps the sign).
func (r *ring) pos(index int64) int {
	n := int64(len(r.slots))
	return int((index%n + n) % n)
}

// at returns the slot for index, clearing it first if it still holds an
// older slot's samples.
func (r *ring) at(index int64) *slot {
	s := &r.slots[r.pos(index)]
	if s.index != index {
		s.index = index
		if s.sketch != nil {
			s.sketch.Clear()
		}
		s.failures = 0
	}
	if s.sketch == nil {
		s.sketch = r.spec.newSketch()
	}
	return s
}

// add records one sample (seconds) at now. A sample older than the slot
// already in its ring position is outside the window and dropped, rather
// than clearing newer samples to make room.
func (r *ring) add(now time.Time, seconds float64, failed bool) {
	idx := slotIndex(now, r.width)
	if r.slots[r.pos(idx)].index > idx {
		return
	}
	s := r.at(idx)
	// Add fails only for NaN or values beyond float range; callers pass
	// validated, non-negative durations.
	_ = s.sketch.Add(seconds)
	if failed {
		s.failures++
	}
	if idx != r.viewAt {
		r.viewAt = noSlot
		return
	}
	_ = r.view.Add(seconds)
	if failed {
		r.viewFailures++
	}
}

// merged returns the merge of every live slot of the window ending at now,
// and the failures counted in them. The sketch is the ring's cache: callers
// read it and must not modify it.
func (r *ring) merged(now time.Time) (*ddsketch.DDSketch, float64) {
	cur := slotIndex(now, r.width)
	if r.view != nil && r.viewAt == cur && cur != noSlot {
		return r.view, r.viewFailures
	}
	if r.view == nil {
		r.view = r.spec.newSketch()
	}
	r.view.Clear()
	r.viewFailures = 0
	for i := range r.slots {
		s := &r.slots[i]
		if s.sketch == nil || !r.live(s.index, cur) {
			continue
		}
		// Same spec, same index mapping: MergeWith cannot fail.
		_ = r.view.MergeWith(s.sketch)
		r.viewFailures += s.failures
	}
	r.viewAt = cur
	return r.view, r.viewFailures
}

// snapshot encodes the live, non-empty slots, oldest first.
func (r *ring) snapshot(now time.Time) []SlotSnapshot {
	cur := slotIndex(now, r.width)
	var out []SlotSnapshot
	for idx := cur - int64(len(r.slots)) + 1; idx <= cur; idx++ {
		s := &r.slots[r.pos(idx)]
		if s.index != idx || s.sketch == nil || s.sketch.IsEmpty() {
			continue
		}
		var b []byte
		s.sketch.Encode(&b, false)
		out = append(out, SlotSnapshot{Index: idx, Width: r.width, Count: s.sketch.GetCount(), Sketch: b})
	}
	return out
}

// mergeSnapshot decodes snap into its slot if that slot is inside the window
// ending at now; older snapshots are dropped, as their samples would have
// rolled out anyway.
func (r *ring) mergeSnapshot(now time.Time, snap SlotSnapshot) (err error) {
	if snap.Width != r.width {
		return fmt.Errorf("%w: slot width %v, want %v", ErrSnapshotMismatch, snap.Width, r.width)
	}
	if !r.live(snap.Index, slotIndex(now, r.width)) {
		return nil
	}
	decoded, err := decodeSketch(r.spec, snap.Sketch)
	if err != nil {
		return err
	}
	if err := r.at(snap.Index).sketch.MergeWith(decoded); err != nil {
		return fmt.Errorf("%w: %v", ErrSnapshotMismatch, err)
	}
	r.viewAt = noSlot
	return nil
}

// decodeSketch decodes bytes from another replica. The bytes come over the
// network, so a decoder panic on corrupt input is turned into an error.
func decodeSketch(spec sketchSpec, b []byte) (sk *ddsketch.DDSketch, err error) {
	defer func() {
		if p := recover(); p != nil {
			sk, err = nil, fmt.Errorf("delay: corrupt sketch snapshot: %v", p)
		}
	}()
	sk, err = ddsketch.DecodeDDSketch(b, spec.provider, nil)
	if err != nil {
		return nil, fmt.Errorf("delay: decode sketch snapshot: %w", err)
	}
	if !sk.IndexMapping.Equals(spec.mapping) {
		return nil, fmt.Errorf("%w: sketch accuracy differs", ErrSnapshotMismatch)
	}
	return sk, nil
}
