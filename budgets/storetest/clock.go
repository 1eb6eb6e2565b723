package storetest

import (
	"slices"
	"sync"
	"time"
)

// Epoch is where every suite clock starts: ten minutes into an hour, so that
// the one-hour tenant windows the suite uses are not crossed by its advances.
var Epoch = time.Date(2025, 1, 1, 0, 10, 0, 0, time.UTC)

// Clock is the time a store under test keeps. The suite moves time only by
// calling Advance; it never sleeps. A factory wires the store to the clock in
// one of two ways:
//
//   - The store reads Now (Memory does; a Redis store can pass now to its
//     scripts as an argument and keep Redis TTLs for garbage collection only).
//     The run is then deterministic.
//   - The store keeps its own real time (Redis PX TTLs, Redis TIME) and the
//     factory registers an OnAdvance hook that waits until that much real time
//     has passed. The suite keeps every TTL it tests at a few hundred
//     milliseconds and every advance under two seconds so such a run stays
//     short, allows for real time passing between its calls, and skips the
//     few checks that need to jump further (they say so).
type Clock struct {
	mu    sync.Mutex
	now   time.Time
	hooks []func(time.Duration)
}

// NewClock returns a clock standing at Epoch.
func NewClock() *Clock { return &Clock{now: Epoch} }

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d and then runs the OnAdvance hooks, so
// that when it returns a store on real time has seen d pass too.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	hooks := slices.Clone(c.hooks)
	c.mu.Unlock()
	for _, h := range hooks {
		h(d)
	}
}

// OnAdvance registers f to run on every Advance with the duration advanced. A
// store that keeps real time uses it to let that time pass.
func (c *Clock) OnAdvance(f func(d time.Duration)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hooks = append(c.hooks, f)
}

// followsRealTime reports whether a store waits on Advance rather than reading
// Now, so checks that jump far ahead are skipped.
func (c *Clock) followsRealTime() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.hooks) > 0
}
