package lease

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)

func twoRegions() Options { return Options{Regions: []string{"east", "west"}} }

func mustRenew(t *testing.T, tb Table, a Ask, now time.Time, o Options) (Table, Grant) {
	t.Helper()
	next, g, err := Renew(tb, a, now, o)
	if err != nil {
		t.Fatal(err)
	}
	return next, g
}

// region is one region of a run: its clock's offset from true time, the
// lease that reached it, the replies on their way to it, and whether it is
// cut off from the authority.
type region struct {
	name    string
	offset  time.Duration
	held    Held
	replies []reply
	cut     bool
	demand  float64
	spent   float64 // of a budget, in all
}

// reply is a grant on its way to its region, arriving at a true time.
type reply struct {
	grant Grant
	at    time.Time
}

// receive takes the replies due at now, each only if it expires later than
// the lease the region holds (a late reply of an older renewal is dropped).
func (r *region) receive(now time.Time) {
	kept := r.replies[:0]
	for _, rep := range r.replies {
		switch {
		case rep.at.After(now):
			kept = append(kept, rep)
		case rep.grant.Expires.After(r.held.Expires):
			r.held = rep.grant.lease()
		}
	}
	r.replies = kept
}

// The invariant, under everything a run can throw at it: regions cut off
// for a while or for good, replies lost or late (two renewals of a region
// in flight, their replies out of order), the table lost and recreated,
// demand shifting, clocks apart by up to the skew. At every 50 ms of true
// time, what every region spends by its own clock sums to at most the
// ceiling.
func TestWhatTheRegionsSpendNeverSumsPastTheCeiling(t *testing.T) {
	for seed := uint64(1); seed <= 100; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			runRegions(t, seed, false)
		})
	}
}

// The same run of a budget: each region spends at its demand while its
// allowance lets it, and what the regions have spent in all never sums past
// the budget. (The table is not lost here: a lost budget table with a
// region cut off is the case §14 says is not covered.)
func TestWhatTheRegionsSpendOfABudgetNeverSumsPastIt(t *testing.T) {
	for seed := uint64(1); seed <= 100; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			runRegions(t, seed, true)
		})
	}
}

// runRegions is one seeded 5-minute run of 2–4 regions renewing one
// ceiling (a budget, or a rate), failing t when they spend past it.
func runRegions(t *testing.T, seed uint64, budget bool) {
	rng := rand.New(rand.NewPCG(seed, 27))
	n := 2 + rng.IntN(3)
	o := Options{Skew: time.Second}
	demand := func() float64 {
		if budget {
			return rng.Float64() * 0.01 // parts of the budget per second: it runs out within the run
		}
		return rng.Float64() * 100
	}
	var regions []*region
	for i := range n {
		name := fmt.Sprintf("r%d", i)
		o.Regions = append(o.Regions, name)
		regions = append(regions, &region{name: name,
			offset: time.Duration(rng.Int64N(int64(o.Skew))) - o.Skew/2, demand: demand()})
	}
	tb := NewTable(t0)
	const step = 50 * time.Millisecond
	spent := 0.0 // of a budget, by every region
	for now := t0; now.Before(t0.Add(5 * time.Minute)); now = now.Add(step) {
		for _, r := range regions {
			switch x := rng.Float64(); {
			case x < 0.002:
				r.cut = !r.cut
			case x < 0.004:
				r.demand = demand()
			}
		}
		if rng.Float64() < 0.0005 && !budget { // the authority's state is lost
			tb = NewTable(now.Add(regions[0].offset))
		}
		for _, r := range regions {
			r.receive(now)
			if r.cut || len(r.replies) == 2 || rng.Float64() > step.Seconds()/2 { // a renewal every 2 s on average
				continue
			}
			local := now.Add(r.offset)
			next, g, err := Renew(tb, Ask{Region: r.name, Demand: r.demand, Held: r.held, Budget: budget}, local, o)
			if err != nil {
				t.Fatal(err)
			}
			tb = next
			if rng.Float64() < 0.1 { // the reply is lost
				continue
			}
			// Most replies arrive within a step; many take up to 3 s.
			late := time.Duration(0)
			if rng.Float64() < 0.5 {
				late = time.Duration(rng.Int64N(int64(3 * time.Second)))
			}
			r.replies = append(r.replies, reply{grant: g, at: now.Add(late)})
		}
		sum := 0.0
		for _, r := range regions {
			if budget {
				may, err := SpendingBudget(r.held, o)
				if err != nil {
					t.Fatal(err)
				}
				r.spent += max(0, min(r.demand*step.Seconds(), may-r.spent))
				sum += r.spent
				continue
			}
			s, err := Spending(r.held, now.Add(r.offset), o)
			if err != nil {
				t.Fatal(err)
			}
			sum += s
		}
		if sum > 1+1e-9 {
			t.Fatalf("at %v the regions spend %.4f of the ceiling", now.Sub(t0), sum)
		}
		spent = sum
	}
	// Their demand over the run is several budgets: most of it is spent,
	// not stranded with the regions cut off (at most a validity's demand
	// and the floor each).
	if budget && spent < 0.5 {
		t.Errorf("the regions spent %.3f of the budget in all; their demand was several times it", spent)
	}
}

// With every region in reach, shares follow demand: within three renewals
// of a shift from 80/20 to 20/80 each region holds at least 90 % of its
// demand-fair share, the floor included.
func TestSharesFollowDemandWithinThreeRenewals(t *testing.T) {
	o := twoRegions()
	tb := NewTable(t0)
	heldBy := map[string]Held{}
	renewAll := func(now time.Time, demand map[string]float64) {
		for _, r := range o.Regions {
			var g Grant
			tb, g = mustRenew(t, tb, Ask{Region: r, Demand: demand[r], Held: heldBy[r]}, now, o)
			heldBy[r] = g.lease()
		}
	}
	now := t0
	before := map[string]float64{"east": 80, "west": 20}
	for now.Before(t0.Add(o.withDefaultsOrDie(t).Validity + 2*time.Second)) { // past learning
		renewAll(now, before)
		now = now.Add(2 * time.Second)
	}
	after := map[string]float64{"east": 20, "west": 80}
	for range 3 {
		renewAll(now, after)
		now = now.Add(2 * time.Second)
	}
	floor := o.withDefaultsOrDie(t).Floor
	for r, d := range after {
		fair := floor + (1-2*floor)*d/100
		if got := heldBy[r].Share; got < 0.9*fair {
			t.Errorf("%s holds %.3f after three renewals, want at least 90 %% of its fair %.3f", r, got, fair)
		}
	}
}

func (o Options) withDefaultsOrDie(t *testing.T) Options {
	t.Helper()
	o, err := o.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// The rules a renewal follows, each on its own.
func TestRenewalRules(t *testing.T) {
	o := twoRegions()
	learned := t0.Add(-time.Minute) // a table past its learning
	tests := []struct {
		name  string
		table Table
		ask   Ask
		at    time.Time
		want  float64
	}{
		{"a new table grants no more than a region spends: a region without a lease spends the fallback",
			NewTable(t0), Ask{Region: "east", Demand: 100}, t0, 0.5},
		{"a new table grants no more than the lease a region held under the table that was lost",
			NewTable(t0), Ask{Region: "east", Demand: 100, Held: Held{Share: 0.3, Expires: t0.Add(5 * time.Second)}}, t0, 0.3},
		{"a region the table never saw is reserved the fallback",
			Table{Since: learned}, Ask{Region: "east", Demand: 100}, t0, 0.5},
		{"the demand of every live region sizes the shares, each above the floor",
			Table{Since: learned, Grants: map[string]Grant{"west": {Share: 0.05, Expires: t0.Add(5 * time.Second), Demand: 25,
				Held: Held{Share: 0.05, Expires: t0.Add(3 * time.Second)}}}},
			Ask{Region: "east", Demand: 75}, t0, 0.05 + 0.9*0.75},
		{"a live region's share is not granted again before it expires",
			Table{Since: learned, Grants: map[string]Grant{"west": {Share: 0.6, Expires: t0.Add(5 * time.Second), Demand: 1}}},
			Ask{Region: "east", Demand: 99}, t0, 0.4},
		{"an expired region keeps its safe share: the smaller of its last share and the fallback",
			Table{Since: learned, Grants: map[string]Grant{"west": {Share: 0.6, Expires: t0.Add(-5 * time.Second), Demand: 1}}},
			Ask{Region: "east", Demand: 99}, t0, 0.5},
		{"an expired region counts as live until the skew has passed",
			Table{Since: learned, Grants: map[string]Grant{"west": {Share: 0.6, Expires: t0.Add(-500 * time.Millisecond), Demand: 1}}},
			Ask{Region: "east", Demand: 99}, t0, 0.4},
		{"the lease a region held when it asked stays reserved while its reply may be lost",
			Table{Since: learned, Grants: map[string]Grant{"west": {Share: 0.1, Expires: t0.Add(9 * time.Second), Demand: 1,
				Held: Held{Share: 0.7, Expires: t0.Add(3 * time.Second)}}}},
			Ask{Region: "east", Demand: 99}, t0, 0.3},
		{"a region that asked without a lease stays reserved the fallback: its reply may be lost",
			Table{Since: learned, Grants: map[string]Grant{"west": {Share: 0.05, Expires: t0.Add(5 * time.Second), Demand: 25}}},
			Ask{Region: "east", Demand: 75}, t0, 0.5},
		{"without demand anywhere the live regions split what is free evenly",
			Table{Since: learned, Grants: map[string]Grant{"west": {Share: 0.2, Expires: t0.Add(5 * time.Second)}}},
			Ask{Region: "east"}, t0, 0.5},
		{"a budget's new table grants the floor a region spends without a lease",
			NewTable(t0), Ask{Region: "east", Demand: 0.01, Budget: true}, t0, 0.05},
		{"a budget's allowance grows by a validity of its demand",
			Table{Since: learned, Budget: true, Grants: map[string]Grant{"west": {Share: 0.2, Expires: t0.Add(5 * time.Second), Demand: 0.001}}},
			Ask{Region: "east", Demand: 0.01, Held: Held{Share: 0.3, Expires: t0}, Budget: true}, t0, 0.4},
		{"a budget's allowance never shrinks, with no demand",
			Table{Since: learned, Budget: true}, Ask{Region: "east", Held: Held{Share: 0.3, Expires: t0}, Budget: true}, t0, 0.3},
		{"a budget's allowance keeps a grant whose reply was lost",
			Table{Since: learned, Budget: true, Grants: map[string]Grant{"east": {Share: 0.5, Expires: t0.Add(5 * time.Second)}}},
			Ask{Region: "east", Held: Held{Share: 0.3, Expires: t0}, Budget: true}, t0, 0.5},
		{"a budget's room is split by the live regions' demand when they ask for more",
			Table{Since: learned, Budget: true, Grants: map[string]Grant{"west": {Share: 0.5, Expires: t0.Add(5 * time.Second), Demand: 0.03}}},
			Ask{Region: "east", Demand: 0.01, Held: Held{Share: 0.3, Expires: t0}, Budget: true}, t0, 0.35},
		{"a region a budget's table never saw is reserved the floor",
			Table{Since: learned, Budget: true}, Ask{Region: "east", Demand: 1, Held: Held{Share: 0.3, Expires: t0}, Budget: true}, t0, 0.95},
		{"a table once a budget's stays one",
			Table{Since: learned, Budget: true}, Ask{Region: "east", Held: Held{Share: 0.3, Expires: t0}}, t0, 0.3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, g := mustRenew(t, tt.table, tt.ask, tt.at, o)
			if math.Abs(g.Share-tt.want) > 1e-9 {
				t.Fatalf("granted %.4f, want %.4f", g.Share, tt.want)
			}
			if !g.Expires.Equal(tt.at.Add(DefaultValidity)) {
				t.Fatalf("expires %v, want a validity after the renewal", g.Expires)
			}
		})
	}
}

func TestASharesExpiryIsCountedEarlyByItsRegionAndLateByTheAuthority(t *testing.T) {
	o := twoRegions()
	h := Held{Share: 0.8, Expires: t0}
	tb := Table{Since: t0.Add(-time.Minute), Grants: map[string]Grant{"west": {Share: 0.8, Expires: t0}}}
	for _, tt := range []struct {
		at                 time.Duration
		spends, reservedAs float64
	}{
		{-2 * time.Second, 0.8, 0.8},
		{-500 * time.Millisecond, 0.5, 0.8},
		{500 * time.Millisecond, 0.5, 0.8},
		{2 * time.Second, 0.5, 0.5},
	} {
		s, err := Spending(h, t0.Add(tt.at), o)
		if err != nil {
			t.Fatal(err)
		}
		r, err := tb.Reserved("west", t0.Add(tt.at), o)
		if err != nil {
			t.Fatal(err)
		}
		if s != tt.spends || r != tt.reservedAs {
			t.Errorf("%v from expiry: spends %.2f, reserved %.2f; want %.2f, %.2f", tt.at, s, r, tt.spends, tt.reservedAs)
		}
	}
}

func TestBadOptionsAndAsksAreRefused(t *testing.T) {
	tests := []struct {
		name string
		o    Options
		ask  Ask
	}{
		{"no regions", Options{}, Ask{Region: "east"}},
		{"a region named twice", Options{Regions: []string{"east", "east"}}, Ask{Region: "east"}},
		{"a validity within twice the skew", Options{Regions: []string{"east"}, Validity: 2 * time.Second, Skew: time.Second}, Ask{Region: "east"}},
		{"a fallback past an even split", Options{Regions: []string{"east", "west"}, Fallback: 0.6}, Ask{Region: "east"}},
		{"a floor above the fallback", Options{Regions: []string{"east", "west"}, Floor: 0.6}, Ask{Region: "east"}},
		{"an unknown region", twoRegions(), Ask{Region: "north"}},
		{"a negative demand", twoRegions(), Ask{Region: "east", Demand: -1}},
		{"a demand that is not a number", twoRegions(), Ask{Region: "east", Demand: math.NaN()}},
		{"a held share past the ceiling", twoRegions(), Ask{Region: "east", Held: Held{Share: 1.5, Expires: t0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, err := Renew(NewTable(t0), tt.ask, t0, tt.o); !errors.Is(err, ErrInvalid) {
				t.Fatalf("Renew = %v, want ErrInvalid", err)
			}
		})
	}
}
