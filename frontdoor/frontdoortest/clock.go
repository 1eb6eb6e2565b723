package frontdoortest

import (
	"sync"
	"time"
)

// SettableClock is a clock for tests of stores and limiters that read the
// time through a Now function: a test advances it instead of sleeping.
// The conformance suite of the replay stores (replaytest) hands one to
// the stores it tests, and the doors' tests to their tenants' slices. Safe for concurrent
// use.
type SettableClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewSettableClock returns a clock at a fixed instant, so runs are
// reproducible.
func NewSettableClock() *SettableClock {
	return &SettableClock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// Now is the clock's time.
func (c *SettableClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock by d.
func (c *SettableClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
