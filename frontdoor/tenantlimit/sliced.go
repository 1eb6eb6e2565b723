package tenantlimit

import (
	"context"
	"sync"
	"time"

	"github.com/hedgerow/hedgerow/budgets/slice"
)

// Sliced is the Store of a gateway that shares its tenants' limits with
// the region's other gateways through slices (docs/architecture.md §7,
// "Slices"): a take or an acquire spends from the gateway's slice in
// memory, so admission makes no round trip in the common case, and while
// the region's granter cannot be reached the limits still hold at the
// gateway's safe share. It never answers an error: the slices decide.
type Sliced struct {
	slices *slice.Slices

	mu   sync.Mutex
	held map[string]slice.Concurrency // holder → the ceiling its slot is of
}

var _ Store = (*Sliced)(nil)

// NewSliced returns a Store spending from slices.
func NewSliced(slices *slice.Slices) *Sliced {
	return &Sliced{slices: slices, held: map[string]slice.Concurrency{}}
}

// The ceilings of a tenant's limits, keyed by its name. Their kinds label
// the slices' metrics; the tenant's name never does.
func rateCeiling(tenant string, rate float64, burst int) slice.Rate {
	return slice.Rate{Key: "tenant:" + tenant + ":rate", Kind: "tenant_rate", PerSecond: rate, Burst: float64(burst)}
}

func concurrencyCeiling(tenant string, max int) slice.Concurrency {
	return slice.Concurrency{Key: "tenant:" + tenant + ":concurrency", Kind: "tenant_concurrency", Max: max}
}

// Take spends one token of the tenant's rate slice.
func (s *Sliced) Take(ctx context.Context, key string, rate float64, burst int) (bool, time.Duration, error) {
	ok, wait := s.slices.Take(ctx, rateCeiling(key, rate, burst))
	return ok, wait, nil
}

// Acquire takes one of the tenant's slots for holder. The slices renew the
// gateway's hold; ttl is theirs, not the caller's.
func (s *Sliced) Acquire(ctx context.Context, key, holder string, max int, _ time.Duration) (bool, error) {
	c := concurrencyCeiling(key, max)
	if !s.slices.Acquire(ctx, c) {
		return false, nil
	}
	s.mu.Lock()
	s.held[holder] = c
	s.mu.Unlock()
	return true, nil
}

// Refresh reports whether holder still holds its slot: the slices keep
// the gateway's hold alive, so there is nothing to extend.
func (s *Sliced) Refresh(_ context.Context, _, holder string, _ time.Duration) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.held[holder]
	return ok, nil
}

// Release gives holder's slot back to the gateway's slice.
func (s *Sliced) Release(_ context.Context, _, holder string) error {
	s.mu.Lock()
	c, ok := s.held[holder]
	delete(s.held, holder)
	s.mu.Unlock()
	if ok {
		s.slices.Release(c)
	}
	return nil
}
