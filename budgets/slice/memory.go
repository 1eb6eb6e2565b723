package slice

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"
)

// Memory is the Granter of one process: the ceilings hold across the
// Slices that share it. Its size is bounded by the ceilings in use: a
// bucket that is full again and a window's budget untouched for
// KeepBudgets are forgotten (a forgotten bucket comes back full, as it
// would be), and so are holds once none lives.
type Memory struct {
	now   func() time.Time
	epoch string

	mu      sync.Mutex
	calls   int // since the last prune
	buckets map[string]*bucket
	holds   map[string]map[string]hold // ceiling key → holder → its hold
	alive   map[string]time.Time       // holder → expiry
}

type bucket struct {
	tokens    float64
	burst     float64 // the burst the bucket was last asked with
	perSecond float64
	at        time.Time
	wants     map[string]want // holder → its last want, for sharing a contended bucket
}

type want struct {
	tokens float64
	at     time.Time
}

type hold struct {
	slots   int
	expires time.Time
}

var _ Granter = (*Memory)(nil)

// NewMemory returns an empty Memory on the clock now (nil: time.Now).
func NewMemory(now func() time.Time) *Memory {
	if now == nil {
		now = time.Now
	}
	return &Memory{now: now, epoch: NewEpoch(), buckets: map[string]*bucket{}, holds: map[string]map[string]hold{}, alive: map[string]time.Time{}}
}

// Take grants holder its share of up to want tokens of r's bucket after
// adjusting it.
func (m *Memory) Take(_ context.Context, r Rate, holder string, wanted, adjust float64) (float64, float64, time.Duration, error) {
	if err := r.Validate(); err != nil {
		return 0, 0, 0, err
	}
	if err := checkUnits(holder, wanted, adjust); err != nil {
		return 0, 0, 0, err
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.buckets[r.Key]
	if b == nil {
		b = &bucket{tokens: r.Burst, burst: r.Burst, perSecond: r.PerSecond, at: now, wants: map[string]want{}}
		m.buckets[r.Key] = b
	}
	if now.After(b.at) {
		b.tokens += now.Sub(b.at).Seconds() * r.PerSecond
		b.at = now
	}
	b.tokens += Rebudget(r, b.burst)
	b.burst, b.perSecond = r.Burst, r.PerSecond
	if m.calls++; m.calls >= pruneEvery {
		m.calls = 0
		m.prune(now)
	}
	if adjust > 0 {
		b.tokens = math.Min(r.Burst, b.tokens+adjust)
	} else {
		b.tokens = math.Min(r.Burst, b.tokens) + adjust
	}
	if wanted == 0 {
		return 0, b.tokens, 0, nil
	}
	live := make(map[string]float64, len(b.wants)+1)
	for h, w := range b.wants {
		if now.Sub(w.at) >= DemandWindow {
			delete(b.wants, h)
			continue
		}
		live[h] = w.tokens
	}
	live[holder] = wanted
	took := Share(math.Max(0, b.tokens), wanted, live)
	b.tokens -= took
	if took < wanted {
		b.wants[holder] = want{tokens: wanted - took, at: now}
	} else {
		delete(b.wants, holder)
	}
	if took < wanted {
		return took, b.tokens, UntilToken(b.tokens, r.PerSecond), nil
	}
	return took, b.tokens, 0, nil
}

// Hold sets holder's slots of c.
func (m *Memory) Hold(_ context.Context, c Concurrency, holder string, want int, ttl time.Duration) (int, error) {
	if err := c.Validate(); err != nil {
		return 0, err
	}
	if holder == "" || want < 0 || ttl <= 0 {
		return 0, fmt.Errorf("%w: a hold needs a holder, a want ≥ 0 and a positive TTL", ErrInvalidRequest)
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	holds := m.holds[c.Key]
	if holds == nil {
		holds = map[string]hold{}
		m.holds[c.Key] = holds
	}
	others := 0
	for h, hd := range holds {
		switch {
		case !hd.expires.After(now):
			delete(holds, h)
		case h != holder:
			others += hd.slots
		}
	}
	held := max(0, min(want, c.Max-others))
	if held == 0 {
		delete(holds, holder)
		return 0, nil
	}
	holds[holder] = hold{slots: held, expires: now.Add(ttl)}
	return held, nil
}

// Alive records holder as live and counts the live holders. A Memory's
// epoch is its own: its state is lost only with it.
func (m *Memory) Alive(_ context.Context, holder string, ttl time.Duration) (int, string, error) {
	if holder == "" || ttl <= 0 {
		return 0, "", fmt.Errorf("%w: a live holder needs a name and a positive TTL", ErrInvalidRequest)
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.alive[holder] = now.Add(ttl)
	for h, exp := range m.alive {
		if !exp.After(now) {
			delete(m.alive, h)
		}
	}
	return len(m.alive), m.epoch, nil
}

// pruneEvery is how many takes pass between prunes of a Memory.
const pruneEvery = 1024

// KeepBudgets is how long a Memory keeps a budget that never refills past
// its last call, as redisslice's DefaultKeepBudgets: longer than any spend
// window a tenant is likely to have.
const KeepBudgets = 8 * 24 * time.Hour

// prune forgets what a missing entry means anyway: a refilling bucket
// full again with no live want, a window's budget untouched for
// KeepBudgets, a ceiling's holds once none lives. Called with m.mu held.
func (m *Memory) prune(now time.Time) {
	for key, b := range m.buckets {
		full := b.perSecond > 0 && b.tokens+now.Sub(b.at).Seconds()*b.perSecond >= b.burst
		stale := b.perSecond == 0 && now.Sub(b.at) >= KeepBudgets
		if (full || stale) && !liveWant(b, now) {
			delete(m.buckets, key)
		}
	}
	for key, holds := range m.holds {
		for h, hd := range holds {
			if !hd.expires.After(now) {
				delete(holds, h)
			}
		}
		if len(holds) == 0 {
			delete(m.holds, key)
		}
	}
}

// liveWant reports whether some holder's want of b still counts.
func liveWant(b *bucket, now time.Time) bool {
	for _, w := range b.wants {
		if now.Sub(w.at) < DemandWindow {
			return true
		}
	}
	return false
}

// checkUnits refuses token counts no bucket could mean.
func checkUnits(holder string, want, adjust float64) error {
	if holder == "" {
		return fmt.Errorf("%w: a take needs a holder", ErrInvalidRequest)
	}
	if !(want >= 0) || math.IsNaN(adjust) || math.IsInf(want, 0) || math.IsInf(adjust, 0) {
		return fmt.Errorf("%w: want must be finite and ≥ 0, adjust finite (got %v, %v)", ErrInvalidRequest, want, adjust)
	}
	return nil
}
