package dispatcher

import (
	"sync"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/policy"
)

// dupWindows is this dispatcher's view of each cohort's duplicate rate —
// extra attempts (hedges and replacements) per primary over the cohort's
// duplicate-rate window — as the records' duplicate_rate_window carries it
// (docs/architecture.md §9). It counts the attempts this replica launched;
// the shared ceiling (budgets) counts every replica's.
type dupWindows struct {
	mu      sync.Mutex
	cohorts map[string]*dupWindow
}

// dupWindow is one cohort's window, kept as policy.DuplicateWindowSlots
// slots of counts.
type dupWindow struct {
	slot      time.Duration
	start     [policy.DuplicateWindowSlots]int64 // slot index each counter belongs to
	primaries [policy.DuplicateWindowSlots]int64
	extras    [policy.DuplicateWindowSlots]int64
}

// count adds one launched attempt of cohort at now; window is the cohort's
// duplicate-rate window.
func (w *dupWindows) count(cohort string, window time.Duration, now time.Time, primary bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.cohort(cohort, window)
	i := now.UnixNano() / int64(c.slot)
	k := int(i % policy.DuplicateWindowSlots)
	if c.start[k] != i {
		c.start[k], c.primaries[k], c.extras[k] = i, 0, 0
	}
	if primary {
		c.primaries[k]++
	} else {
		c.extras[k]++
	}
}

// rate is cohort's extra attempts per primary over the window ending at
// now; 0 with no primary in it.
func (w *dupWindows) rate(cohort string, window time.Duration, now time.Time) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.cohort(cohort, window)
	i := now.UnixNano() / int64(c.slot)
	var primaries, extras int64
	for k := range policy.DuplicateWindowSlots {
		if i-c.start[k] < policy.DuplicateWindowSlots {
			primaries += c.primaries[k]
			extras += c.extras[k]
		}
	}
	if primaries == 0 {
		return 0
	}
	return float64(extras) / float64(primaries)
}

func (w *dupWindows) cohort(key string, window time.Duration) *dupWindow {
	if w.cohorts == nil {
		w.cohorts = make(map[string]*dupWindow)
	}
	c := w.cohorts[key]
	if c == nil {
		c = &dupWindow{slot: max(window/policy.DuplicateWindowSlots, time.Millisecond)}
		for k := range c.start {
			c.start[k] = -policy.DuplicateWindowSlots // empty: never inside a window
		}
		w.cohorts[key] = c
	}
	return c
}
