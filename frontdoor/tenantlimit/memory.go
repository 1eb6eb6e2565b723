package tenantlimit

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"
)

// Memory is the Store of one replica: the limits hold per gateway process.
// Its size is bounded by the configured tenants (one bucket and one lease
// set each) and their MaxConcurrent.
type Memory struct {
	now func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
	leases  map[string]map[string]time.Time // key → holder → expiry
}

type bucket struct {
	tokens float64
	at     time.Time
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty Memory store on the clock now (nil:
// time.Now).
func NewMemory(now func() time.Time) *Memory {
	if now == nil {
		now = time.Now
	}
	return &Memory{now: now, buckets: map[string]*bucket{}, leases: map[string]map[string]time.Time{}}
}

// Take takes one token from the bucket under key.
func (m *Memory) Take(_ context.Context, key string, rate float64, burst int) (bool, time.Duration, error) {
	if rate <= 0 || burst < 1 {
		return false, 0, errors.New("tenantlimit: the rate and the burst must be positive")
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.buckets[key]
	if b == nil {
		b = &bucket{tokens: float64(burst), at: now}
		m.buckets[key] = b
	}
	if now.After(b.at) {
		b.tokens = math.Min(float64(burst), b.tokens+now.Sub(b.at).Seconds()*rate)
		b.at = now
	}
	b.tokens = math.Min(b.tokens, float64(burst)) // a burst lowered by a reload
	if b.tokens >= 1 {
		b.tokens--
		return true, 0, nil
	}
	return false, untilToken(b.tokens, rate), nil
}

// untilToken is how long a bucket holding tokens (< 1) takes to hold one,
// rounded up to the millisecond, at least one.
func untilToken(tokens, rate float64) time.Duration {
	ms := math.Ceil((1 - tokens) * 1000 / rate)
	return time.Duration(max(ms, 1)) * time.Millisecond
}

// Acquire gives holder a slot under key, if one of max is free.
func (m *Memory) Acquire(_ context.Context, key, holder string, max int, ttl time.Duration) (bool, error) {
	if max < 1 || ttl <= 0 {
		return false, errors.New("tenantlimit: the slot count and the lease TTL must be positive")
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	held := m.leases[key]
	if held == nil {
		held = map[string]time.Time{}
		m.leases[key] = held
	}
	for h, exp := range held {
		if !exp.After(now) {
			delete(held, h)
		}
	}
	if _, ok := held[holder]; !ok && len(held) >= max {
		return false, nil
	}
	held[holder] = now.Add(ttl)
	return true, nil
}

// Refresh extends holder's lease under key.
func (m *Memory) Refresh(_ context.Context, key, holder string, ttl time.Duration) (bool, error) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	exp, ok := m.leases[key][holder]
	if !ok || !exp.After(now) {
		delete(m.leases[key], holder)
		return false, nil
	}
	m.leases[key][holder] = now.Add(ttl)
	return true, nil
}

// Release frees holder's slot under key.
func (m *Memory) Release(_ context.Context, key, holder string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.leases[key], holder)
	return nil
}
