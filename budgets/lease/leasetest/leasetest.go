// Package leasetest holds the conformance suites of budgets/lease: the
// rules every lease.Authority keeps, whatever holds the leases' tables
// (Memory in one process, natslease's key-value bucket across regions),
// and those every lease.RegionStore keeps (MemoryRegion in one process,
// redislease in a region's Redis, standalone or cluster), on a settable
// Clock. An implementation's tests run a suite with a constructor of
// fresh ones.
package leasetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/budgets/lease"
)

// t0 is the suite's clock: leases run on explicit times, never the wall's.
var t0 = time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)

// opTimeout bounds each of the suite's operations: an authority that
// does not answer fails the test instead of hanging it.
const opTimeout = 10 * time.Second

// Authority runs the conformance suite. newAuthority returns, for each
// subtest, an authority no one else writes to, whose revisions count its
// writes: each successful write's revision is one more than the last one
// it returned, as Memory's revisions and a key-value bucket's sequence are.
func Authority(t *testing.T, newAuthority func(t *testing.T) lease.Authority) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, auth lease.Authority)
	}{
		{"a missing table reads revision 0", missingReadsZero},
		{"a create-only write of an existing table conflicts", createOnlyConflicts},
		{"a write at a stale revision conflicts and changes nothing", staleConflicts},
		{"a write at the current revision returns a higher one and is read back equal", writeReadsBack},
		{"keys with colons, slashes, spaces and unicode round-trip and do not collide", keysRoundTrip},
		{"concurrent renewals of two regions all succeed and each write counts once", concurrentRenewals},
		{"a cancelled context fails", cancelledFails},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newAuthority(t)) })
	}
}

func ctxOf(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	t.Cleanup(cancel)
	return ctx
}

// table is a table with one grant of region, distinct per n.
func table(region string, n int) lease.Table {
	now := t0.Add(time.Duration(n) * time.Second)
	return lease.Table{Since: now, Grants: map[string]lease.Grant{region: {
		Share:   0.25 + float64(n)/1000,
		Expires: now.Add(lease.DefaultValidity),
		Demand:  float64(10 + n),
		Held:    lease.Held{Share: 0.1, Expires: now.Add(time.Second)},
	}}}
}

// sameTable reports whether a and b are the same table, comparing times
// with Equal: a table read back has lost its monotonic reading and may
// have another location.
func sameTable(a, b lease.Table) bool {
	if !a.Since.Equal(b.Since) || len(a.Grants) != len(b.Grants) {
		return false
	}
	for r, ga := range a.Grants {
		gb, ok := b.Grants[r]
		if !ok || ga.Share != gb.Share || !ga.Expires.Equal(gb.Expires) || ga.Demand != gb.Demand ||
			ga.Held.Share != gb.Held.Share || !ga.Held.Expires.Equal(gb.Held.Expires) {
			return false
		}
	}
	return true
}

func mustGet(t *testing.T, auth lease.Authority, key string) (lease.Table, uint64) {
	t.Helper()
	tb, rev, err := auth.Get(ctxOf(t), key)
	if err != nil {
		t.Fatalf("get %q: %v", key, err)
	}
	return tb, rev
}

func mustPut(t *testing.T, auth lease.Authority, key string, tb lease.Table, rev uint64) uint64 {
	t.Helper()
	next, err := auth.Put(ctxOf(t), key, tb, rev)
	if err != nil {
		t.Fatalf("put %q at revision %d: %v", key, rev, err)
	}
	return next
}

func missingReadsZero(t *testing.T, auth lease.Authority) {
	tb, rev := mustGet(t, auth, "tenant:acme:rate")
	if rev != 0 || !sameTable(tb, lease.Table{}) {
		t.Fatalf("a missing table read at revision %d as %+v, want revision 0 and a zero table", rev, tb)
	}
}

func createOnlyConflicts(t *testing.T, auth lease.Authority) {
	const key = "tenant:acme:rate"
	rev := mustPut(t, auth, key, table("east", 1), 0)
	if rev == 0 {
		t.Fatal("a created table has revision 0, which reads as none")
	}
	if _, err := auth.Put(ctxOf(t), key, table("west", 2), 0); !errors.Is(err, lease.ErrConflict) {
		t.Fatalf("create-only write of an existing table: %v, want lease.ErrConflict", err)
	}
	if tb, got := mustGet(t, auth, key); got != rev || !sameTable(tb, table("east", 1)) {
		t.Fatalf("after the refused create the table is at revision %d (%+v), want %d and the first", got, tb, rev)
	}
}

func staleConflicts(t *testing.T, auth lease.Authority) {
	const key = "tenant:acme:rate"
	first := mustPut(t, auth, key, table("east", 1), 0)
	second := mustPut(t, auth, key, table("east", 2), first)
	for _, stale := range []uint64{first, second + 1, second + 100} {
		if _, err := auth.Put(ctxOf(t), key, table("west", 3), stale); !errors.Is(err, lease.ErrConflict) {
			t.Fatalf("write at revision %d, the table being at %d: %v, want lease.ErrConflict", stale, second, err)
		}
	}
	if tb, rev := mustGet(t, auth, key); rev != second || !sameTable(tb, table("east", 2)) {
		t.Fatalf("after stale writes the table is at revision %d (%+v), want %d and the second write", rev, tb, second)
	}
}

func writeReadsBack(t *testing.T, auth lease.Authority) {
	const key = "tenant:acme:rate"
	rev := mustPut(t, auth, key, table("east", 1), 0)
	for i := 2; i <= 4; i++ {
		want := table("west", i)
		next := mustPut(t, auth, key, want, rev)
		if next <= rev {
			t.Fatalf("write at revision %d returned %d, want a higher one", rev, next)
		}
		tb, got := mustGet(t, auth, key)
		if got != next || !sameTable(tb, want) {
			t.Fatalf("read back revision %d, %+v; want %d, %+v", got, tb, next, want)
		}
		rev = next
	}
}

func keysRoundTrip(t *testing.T, auth lease.Authority) {
	// Pairs a careless encoding would map to one key: separators
	// replaced, case folded, a trailing space trimmed.
	keys := []string{
		"tenant:acme:rate", "tenant/acme/rate", "tenant acme rate", "tenant.acme.rate", "tenant_acme_rate",
		"tenant:acme:rate ", "Tenant:Acme:Rate", "tenant:ácme:率", "tenant:🦔:concurrency", "*", ">", "a",
	}
	for i, key := range keys {
		mustPut(t, auth, key, table("east", i), 0)
	}
	for i, key := range keys {
		if tb, rev := mustGet(t, auth, key); rev == 0 || !sameTable(tb, table("east", i)) {
			t.Errorf("key %q read back at revision %d as %+v, want its own table %+v", key, rev, tb, table("east", i))
		}
	}
}

func concurrentRenewals(t *testing.T, auth lease.Authority) {
	const key = "tenant:acme:rate"
	o := lease.Options{Regions: []string{"east", "west"}}
	if _, err := lease.RenewAt(ctxOf(t), auth, key, lease.Ask{Region: "east", Demand: 10}, t0, o); err != nil {
		t.Fatalf("first renewal: %v", err)
	}
	_, first := mustGet(t, auth, key)
	later := t0.Add(time.Minute)
	const renewals = 8
	ctx := ctxOf(t)
	errs := make(chan error, renewals)
	var wg sync.WaitGroup
	for i := range renewals {
		region := o.Regions[i%2]
		wg.Go(func() {
			_, err := lease.RenewAt(ctx, auth, key, lease.Ask{Region: region, Demand: float64(10 + i)}, later, o)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a concurrent renewal failed: %v", err)
		}
	}
	tb, rev := mustGet(t, auth, key)
	if rev != first+renewals {
		t.Fatalf("revision %d after %d renewals from %d, want %d: a write was lost or counted twice", rev, renewals, first, first+renewals)
	}
	sum := 0.0
	for _, r := range o.Regions {
		if _, ok := tb.Grants[r]; !ok {
			t.Fatalf("region %s renewed but has no grant in %+v", r, tb)
		}
		res, err := tb.Reserved(r, later, o)
		if err != nil {
			t.Fatal(err)
		}
		sum += res
	}
	if sum > 1+1e-9 {
		t.Fatalf("reservations sum to %.3f of the ceiling", sum)
	}
}

func cancelledFails(t *testing.T, auth lease.Authority) {
	const key = "tenant:acme:rate"
	rev := mustPut(t, auth, key, table("east", 1), 0)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for op, err := range map[string]error{
		"get": func() error { _, _, err := auth.Get(ctx, key); return err }(),
		"put": func() error { _, err := auth.Put(ctx, key, table("west", 2), rev); return err }(),
		"renew": func() error {
			_, err := lease.RenewAt(ctx, auth, key, lease.Ask{Region: "west"}, t0, lease.Options{Regions: []string{"east", "west"}})
			return err
		}(),
	} {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: %v, want an error wrapping %v", op, err, context.Canceled)
		}
	}
	if tb, got := mustGet(t, auth, key); got != rev || !sameTable(tb, table("east", 1)) {
		t.Fatalf("after cancelled writes the table is at revision %d (%+v), want %d and the first", got, tb, rev)
	}
}
