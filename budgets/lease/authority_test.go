package lease

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestRenewAtCreatesATableThatLearnsAndSurvivesConcurrentRenewals(t *testing.T) {
	ctx := context.Background()
	o := twoRegions()
	auth := NewMemory()
	g, err := RenewAt(ctx, auth, "tenant:acme:rate", Ask{Region: "east", Demand: 10}, t0, o)
	if err != nil {
		t.Fatal(err)
	}
	if g.Share > 0.5 {
		t.Fatalf("a new table granted %.2f, more than the fallback a region without a lease spends", g.Share)
	}
	later := t0.Add(time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		region := o.Regions[i%2]
		wg.Go(func() {
			_, err := RenewAt(ctx, auth, "tenant:acme:rate", Ask{Region: region, Demand: 10}, later, o)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	tb, rev, err := auth.Get(ctx, "tenant:acme:rate")
	if err != nil {
		t.Fatal(err)
	}
	if rev != 9 {
		t.Fatalf("revision %d after 9 renewals, want 9: a renewal was lost or written twice", rev)
	}
	sum := 0.0
	for _, r := range o.Regions {
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
