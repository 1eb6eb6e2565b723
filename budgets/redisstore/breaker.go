package redisstore

import (
	"errors"
	"sync/atomic"
	"time"
)

// DefaultProbeInterval is Options.ProbeInterval when zero.
const DefaultProbeInterval = 250 * time.Millisecond

// errBreakerOpen is what a call that was not sent reports, wrapped in
// ErrUnavailable.
var errBreakerOpen = errors.New("redis gave no answer moments ago; failing at once until the next probe")

// breaker lets calls fail at once while Redis is known not to answer, so
// that an outage costs each primary microseconds instead of the store's
// whole timeout. After a round trip got no answer, only one call per
// interval (a probe) goes to Redis; the first answer closes the breaker.
// Time is the wall clock, whatever clock the store judges budgets by.
type breaker struct {
	interval time.Duration // negative: never open
	// openUntil is when the next probe may go, in Unix ns; 0 when closed.
	openUntil atomic.Int64
}

// allow reports whether a call may go to Redis: always while the breaker
// is closed; while it is open, only the first call after each interval.
func (b *breaker) allow() bool {
	until := b.openUntil.Load()
	if until == 0 || b.interval < 0 {
		return true
	}
	now := time.Now().UnixNano()
	if now < until {
		return false
	}
	return b.openUntil.CompareAndSwap(until, now+b.interval.Nanoseconds())
}

// answered closes the breaker: Redis answered a round trip.
func (b *breaker) answered() {
	if b.openUntil.Load() != 0 {
		b.openUntil.Store(0)
	}
}

// unanswered opens the breaker: a round trip got no answer in time.
func (b *breaker) unanswered() {
	if b.interval >= 0 {
		b.openUntil.Store(time.Now().UnixNano() + b.interval.Nanoseconds())
	}
}
