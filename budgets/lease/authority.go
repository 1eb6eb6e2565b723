package lease

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"
)

// ErrConflict is an Authority's answer to a write whose revision is no
// longer the table's: another region renewed in between.
var ErrConflict = errors.New("lease: the table changed since it was read")

// Authority holds the tables of the global ceilings where every region can
// read and write them: a NATS key-value bucket across the regions in
// production (natslease), Memory in one process. Implementations are safe
// for concurrent use and pass the conformance suite in leasetest.
type Authority interface {
	// Get returns ceiling key's table and its revision; revision 0 and a
	// zero table when it has none.
	Get(ctx context.Context, key string) (Table, uint64, error)
	// Put writes key's table if its revision is still rev (0: only if it
	// has none) and returns the new revision, or ErrConflict.
	Put(ctx context.Context, key string, t Table, rev uint64) (uint64, error)
}

// maxConflicts bounds one renewal's read-and-write retries: each conflict
// is another region's renewal, a handful per interval at most.
const maxConflicts = 8

// RenewAt renews a's lease of ceiling key at the authority at now by the
// region's clock: read the table (a new one if it has none), Renew, write
// it back with compare-and-set, and again on a conflict.
func RenewAt(ctx context.Context, auth Authority, key string, a Ask, now time.Time, o Options) (Grant, error) {
	for range maxConflicts {
		t, rev, err := auth.Get(ctx, key)
		if err != nil {
			return Grant{}, fmt.Errorf("lease: read %q: %w", key, err)
		}
		if rev == 0 {
			t = NewTable(now)
		}
		next, g, err := Renew(t, a, now, o)
		if err != nil {
			return Grant{}, err
		}
		switch _, err := auth.Put(ctx, key, next, rev); {
		case err == nil:
			return g, nil
		case !errors.Is(err, ErrConflict):
			return Grant{}, fmt.Errorf("lease: write %q: %w", key, err)
		}
	}
	return Grant{}, fmt.Errorf("lease: renew %q: %w %d times in a row", key, ErrConflict, maxConflicts)
}

// Memory is an Authority in one process: for tests and the simulator.
type Memory struct {
	mu     sync.Mutex
	tables map[string]memoryEntry
}

type memoryEntry struct {
	table Table
	rev   uint64
}

// NewMemory returns an empty Memory authority.
func NewMemory() *Memory { return &Memory{tables: map[string]memoryEntry{}} }

// Get implements Authority.
func (m *Memory) Get(ctx context.Context, key string) (Table, uint64, error) {
	if err := ctx.Err(); err != nil {
		return Table{}, 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.tables[key]
	return e.table.clone(), e.rev, nil
}

// Put implements Authority.
func (m *Memory) Put(ctx context.Context, key string, t Table, rev uint64) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.tables[key]
	if e.rev != rev {
		return 0, ErrConflict
	}
	e = memoryEntry{table: t.clone(), rev: e.rev + 1}
	m.tables[key] = e
	return e.rev, nil
}

// Forget drops every table, as an authority whose state was lost: the next
// renewals start new tables, which learn first.
func (m *Memory) Forget() {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.tables)
}

// clone copies t so that neither side's later changes reach the other.
func (t Table) clone() Table {
	return Table{Since: t.Since, Grants: maps.Clone(t.Grants), Budget: t.Budget}
}
