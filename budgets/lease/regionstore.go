package lease

import (
	"context"
	"maps"
	"sync"
	"time"
)

// RegionStore is what a region's gateways share of their leases, in the
// region's own store (its Redis in production, redislease): the leases the
// region holds, the demand its gateways saw since the renewer last
// looked, and the region-wide lock of the one gateway that renews
// (docs/architecture.md §14, "The region's side"). Nothing in it crosses
// regions. Implementations are safe for concurrent use and pass the
// conformance suite in leasetest.
type RegionStore interface {
	// Held answers every lease the region holds, by ceiling key.
	Held(ctx context.Context) (map[string]Held, error)
	// SetHeld records the lease the region now holds of key.
	SetHeld(ctx context.Context, key string, h Held) error
	// AddDemand adds units wanted, by ceiling key, to the region's demand
	// since the last TakeDemand.
	AddDemand(ctx context.Context, units map[string]float64) error
	// TakeDemand answers the demand added since the last TakeDemand and
	// starts it again from zero, atomically: a unit added concurrently is
	// counted by this call or by the next, never by both or neither.
	TakeDemand(ctx context.Context) (map[string]float64, error)
	// Lock makes holder the region's renewer until ttl from now when no
	// other holder has the lock (or its hold expired), or extends holder's
	// own hold, and reports whether holder has it.
	Lock(ctx context.Context, holder string, ttl time.Duration) (bool, error)
	// Unlock gives holder's lock back, if holder has it, so that another
	// gateway renews without waiting for the hold to expire.
	Unlock(ctx context.Context, holder string) error
}

// MemoryRegion is a RegionStore in one process: for tests and the
// simulator. Its lock's expiry reads now.
type MemoryRegion struct {
	now func() time.Time

	mu         sync.Mutex
	held       map[string]Held
	demand     map[string]float64
	lockHolder string
	lockUntil  time.Time
}

// NewMemoryRegion returns an empty MemoryRegion on the clock now (the
// wall clock when nil).
func NewMemoryRegion(now func() time.Time) *MemoryRegion {
	if now == nil {
		now = time.Now
	}
	return &MemoryRegion{now: now, held: map[string]Held{}, demand: map[string]float64{}}
}

// Held implements RegionStore.
func (m *MemoryRegion) Held(ctx context.Context) (map[string]Held, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.held), nil
}

// SetHeld implements RegionStore.
func (m *MemoryRegion) SetHeld(ctx context.Context, key string, h Held) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.held[key] = h
	return nil
}

// AddDemand implements RegionStore.
func (m *MemoryRegion) AddDemand(ctx context.Context, units map[string]float64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, u := range units {
		m.demand[k] += u
	}
	return nil
}

// TakeDemand implements RegionStore.
func (m *MemoryRegion) TakeDemand(ctx context.Context) (map[string]float64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	d := m.demand
	m.demand = map[string]float64{}
	return d, nil
}

// Lock implements RegionStore.
func (m *MemoryRegion) Lock(ctx context.Context, holder string, ttl time.Duration) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if m.lockHolder != holder && now.Before(m.lockUntil) {
		return false, nil
	}
	m.lockHolder, m.lockUntil = holder, now.Add(ttl)
	return true, nil
}

// Unlock implements RegionStore.
func (m *MemoryRegion) Unlock(ctx context.Context, holder string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lockHolder == holder {
		m.lockHolder, m.lockUntil = "", time.Time{}
	}
	return nil
}
