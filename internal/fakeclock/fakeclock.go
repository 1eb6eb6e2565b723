// Package fakeclock is a settable clock for tests of stores and limiters
// that read the time through a Now function: a test advances it instead of
// sleeping.
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a settable clock, safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// New returns a clock at a fixed instant, so runs are reproducible.
func New() *Clock { return &Clock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
