package lease

import (
	"context"
	"testing"
	"time"
)

// A first renewal creates the table, which learns: no region is granted
// more than it spends, a region without a lease the fallback. (Concurrent
// renewals are the conformance suite's, leasetest, run on Memory too.)
func TestRenewAtCreatesATableThatLearns(t *testing.T) {
	auth := NewMemory()
	g, err := RenewAt(context.Background(), auth, "tenant:acme:rate", Ask{Region: "east", Demand: 10}, t0, twoRegions())
	if err != nil {
		t.Fatal(err)
	}
	if g.Share > 0.5 {
		t.Fatalf("a new table granted %.2f, more than the fallback a region without a lease spends", g.Share)
	}
}

func TestATableTheAuthorityLostIsStartedAgainAndLearns(t *testing.T) {
	ctx := context.Background()
	o := twoRegions()
	auth := NewMemory()
	if _, err := RenewAt(ctx, auth, "k", Ask{Region: "west", Demand: 100}, t0, o); err != nil {
		t.Fatal(err)
	}
	auth.Forget()
	now := t0.Add(time.Minute)
	held := Held{Share: 0.2, Expires: now.Add(8 * time.Second)}
	g, err := RenewAt(ctx, auth, "k", Ask{Region: "east", Demand: 100, Held: held}, now, o)
	if err != nil {
		t.Fatal(err)
	}
	if g.Share > held.Share {
		t.Fatalf("a new table granted %.2f to a region holding %.2f of the lost one", g.Share, held.Share)
	}
	tb, _, err := auth.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if !tb.Since.Equal(now) || len(tb.Grants) != 1 {
		t.Fatalf("the new table is since %v with %d grants, want the renewal's %v and its one grant", tb.Since, len(tb.Grants), now)
	}
}
