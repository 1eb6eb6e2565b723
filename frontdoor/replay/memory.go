package replay

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"sync"
	"time"
)

// MemoryOptions bound a Memory store; zero values take the defaults.
type MemoryOptions struct {
	MaxEntryBytes int
	MaxTotalBytes int
	// MarkerKeep is how long a marker is remembered after its last claim
	// or refresh; zero means DefaultMarkerKeep.
	MarkerKeep time.Duration
	// Now is the store's clock; nil means time.Now.
	Now func() time.Time
	// Metrics count the live answers evicted for room (nil: none).
	Metrics *Metrics
}

// Memory is the Store of one replica: a map with expiry, bounded in bytes.
// When a Put would pass the total bound the oldest entries are evicted
// first (an evicted answer is no longer replayed; its retry runs a group
// whose election meets the winner gate and is answered already_committed
// while the gate remembers the commit — its TTL, 10 minutes or more —
// and commits anew past it, docs/architecture.md §2, §6).
type Memory struct {
	mu       sync.Mutex
	opts     MemoryOptions
	entries  map[string]*list.Element // of *memEntry, oldest first in order
	order    *list.List
	total    int
	maxEntry int
	markers  map[string]memMarker // in-flight leases, by key
	sweepAt  int                  // sweep the markers when there are this many
}

type memMarker struct {
	m           Marker
	leaseExpiry time.Time
	keepUntil   time.Time
}

type memEntry struct {
	key     string
	answer  *Answer
	expires time.Time
	size    int
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty Memory store.
func NewMemory(opts MemoryOptions) (*Memory, error) {
	if opts.MaxEntryBytes < 0 || opts.MaxTotalBytes < 0 || opts.MarkerKeep < 0 {
		return nil, errors.New("replay: size bounds and the marker keep must not be negative")
	}
	opts.MarkerKeep = cmp.Or(opts.MarkerKeep, DefaultMarkerKeep)
	opts.MaxEntryBytes = cmp.Or(opts.MaxEntryBytes, DefaultMaxEntryBytes)
	opts.MaxTotalBytes = cmp.Or(opts.MaxTotalBytes, DefaultMaxTotalBytes)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Memory{opts: opts, entries: map[string]*list.Element{}, order: list.New(), markers: map[string]memMarker{},
		maxEntry: min(opts.MaxEntryBytes, opts.MaxTotalBytes)}, nil
}

// Get returns the live answer under key, or nil; an expired one is dropped.
func (m *Memory) Get(ctx context.Context, key string) (*Answer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	el, ok := m.entries[key]
	if !ok {
		return nil, nil
	}
	e := el.Value.(*memEntry)
	if !m.opts.Now().Before(e.expires) {
		m.remove(el)
		return nil, nil
	}
	return clone(e.answer), nil
}

// Put stores a copy of a under key for ttl, evicting expired entries and
// then the oldest until it fits.
func (m *Memory) Put(ctx context.Context, key string, a *Answer, ttl time.Duration) error {
	if ttl <= 0 {
		return errors.New("replay: the TTL must be positive")
	}
	size := a.size() + len(key)
	if size > m.maxEntry {
		return ErrTooLarge
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.opts.Now()
	if el, ok := m.entries[key]; ok {
		m.remove(el)
	}
	// Entries are in insertion order, which is expiry order for one TTL:
	// the sweep stops at the first live entry.
	for el := m.order.Front(); el != nil && !now.Before(el.Value.(*memEntry).expires); el = m.order.Front() {
		m.remove(el)
	}
	for m.total+size > m.opts.MaxTotalBytes {
		m.remove(m.order.Front())
		m.opts.Metrics.NotKept(NotKeptEvicted)
	}
	e := &memEntry{key: key, answer: clone(a), expires: now.Add(ttl), size: size}
	m.entries[key] = m.order.PushBack(e)
	m.total += size
	delete(m.markers, key) // the answer replaces the marker
	return nil
}

// Claim takes the lease of key for mk unless a live marker holds it.
func (m *Memory) Claim(ctx context.Context, key string, mk Marker, lease time.Duration) (Claimed, error) {
	if lease <= 0 {
		return Claimed{}, errors.New("replay: the lease must be positive")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.opts.Now()
	m.sweepMarkers(now)
	var c Claimed
	if cur, ok := m.markers[key]; ok && now.Before(cur.keepUntil) {
		if now.Before(cur.leaseExpiry) {
			held := cur.m
			return Claimed{Holder: &held}, nil
		}
		orphan := cur.m
		c.Orphaned = &orphan
	}
	m.markers[key] = memMarker{m: mk, leaseExpiry: now.Add(lease), keepUntil: now.Add(max(lease, m.opts.MarkerKeep))}
	c.Won = true
	return c, nil
}

// Refresh extends the lease of key if mk's token holds it.
func (m *Memory) Refresh(ctx context.Context, key string, mk Marker, lease time.Duration) (bool, error) {
	if lease <= 0 {
		return false, errors.New("replay: the lease must be positive")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.opts.Now()
	cur, ok := m.markers[key]
	if !ok || cur.m.Token != mk.Token || !now.Before(cur.keepUntil) {
		return false, nil
	}
	cur.leaseExpiry, cur.keepUntil = now.Add(lease), now.Add(max(lease, m.opts.MarkerKeep))
	m.markers[key] = cur
	return true, nil
}

// Release drops the lease of key if mk's token holds it.
func (m *Memory) Release(ctx context.Context, key string, mk Marker) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur, ok := m.markers[key]; ok && cur.m.Token == mk.Token {
		delete(m.markers, key)
	}
	return nil
}

// Lapse ends the lease of key now if mk's token holds it, leaving mk as
// the orphan marker.
func (m *Memory) Lapse(ctx context.Context, key string, mk Marker) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur, ok := m.markers[key]; ok && cur.m.Token == mk.Token {
		cur.m, cur.leaseExpiry = mk, m.opts.Now()
		m.markers[key] = cur
	}
	return nil
}

// sweepMarkers forgets the markers past their keep once their number
// doubled since the last sweep (amortised O(1) per claim); m.mu is held.
// Markers are few: one per request in flight, as a memory store does not
// outlive the requests it served.
func (m *Memory) sweepMarkers(now time.Time) {
	if len(m.markers) < m.sweepAt {
		return
	}
	for k, cur := range m.markers {
		if !now.Before(cur.keepUntil) {
			delete(m.markers, k)
		}
	}
	m.sweepAt = 2*len(m.markers) + 64
}

// Len is the number of entries held, expired ones not yet dropped
// included.
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.entries)
}

func (m *Memory) remove(el *list.Element) {
	e := m.order.Remove(el).(*memEntry)
	delete(m.entries, e.key)
	m.total -= e.size
}
