package slice

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"
)

// fixedLeases is a region's leases that never change: a share per key
// (1 for any other) and the units wanted of each.
type fixedLeases struct {
	share map[string]float64

	mu     sync.Mutex
	wanted map[string]float64
}

func (l *fixedLeases) Share(key, kind string, now time.Time) float64 { return l.shareOf(key) }

func (l *fixedLeases) shareOf(key string) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.share[key]; ok {
		return s
	}
	return 1
}

func (l *fixedLeases) setShare(key string, share float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.share[key] = share
}

func (l *fixedLeases) wantedOf(key string) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.wanted[key]
}

func (l *fixedLeases) Want(key, kind string, units float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.wanted[key] += units
}

func TestWithLeasesAGlobalCeilingIsScaledByTheRegionsShare(t *testing.T) {
	ctx := context.Background()
	rate := Rate{Key: "tenant:acme:rate", Kind: "tenant_rate", PerSecond: 8, Burst: 8}
	tests := []struct {
		name  string
		share float64
		// admitted in the first instant (the burst), then in each second after
		burst, perSecond int
	}{
		{"a share of 1 (a kind that is not global) spends the whole ceiling", 1, 8, 8},
		{"a share scales the rate and the burst", 0.25, 2, 2},
		{"a share under one token of burst still has a burst of 1", 0.05, 1, 0}, // 0.4/s: a token every 2.5 s
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newTestClock()
			leases := &fixedLeases{share: map[string]float64{rate.Key: tt.share}, wanted: map[string]float64{}}
			s, err := newSlices(NewMemory(clock.Now), Options{Holder: "gw", Now: clock.Now, Leases: leases})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			admit := func() int {
				n := 0
				for range 20 {
					if ok, _ := s.Take(ctx, rate); ok {
						n++
					}
				}
				return n
			}
			if got := admit(); got != tt.burst {
				t.Fatalf("admitted %d at once; want the scaled burst %d", got, tt.burst)
			}
			clock.Advance(time.Second)
			if got := admit(); got != tt.perSecond {
				t.Fatalf("admitted %d a second later; want the scaled rate's %d", got, tt.perSecond)
			}
			if got := leases.wanted[rate.Key]; got != 40 {
				t.Fatalf("reported %v units wanted; want the 40 asked for, admitted or not", got)
			}
		})
	}
}

func TestWithLeasesAConcurrencyCeilingHoldsItsShareOfMaxRoundedDown(t *testing.T) {
	ctx := context.Background()
	conc := Concurrency{Key: "tenant:acme:conc", Kind: "tenant_concurrency", Max: 5}
	tests := []struct {
		name  string
		share float64
		slots int
		calls bool // the granter is asked
	}{
		{"a share of 1 holds every slot", 1, 5, true},
		{"a share holds its part, rounded down", 0.5, 2, true},
		{"a share of exactly k slots holds k", 0.6, 3, true},
		{"a share under one slot holds none and asks no granter", 0.1, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newTestClock()
			leases := &fixedLeases{share: map[string]float64{conc.Key: tt.share}, wanted: map[string]float64{}}
			g := &countingGranter{Granter: NewMemory(clock.Now)}
			s, err := newSlices(g, Options{Holder: "gw", Now: clock.Now, Leases: leases})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			n := 0
			for range 8 {
				if s.Acquire(ctx, conc) {
					n++
				}
			}
			if n != tt.slots {
				t.Fatalf("acquired %d slots of Max 5 at share %v; want %d", n, tt.share, tt.slots)
			}
			if called := g.calls.Load() > 0; called != tt.calls {
				t.Fatalf("granter asked: %v; want %v", called, tt.calls)
			}
			if got := leases.wanted[conc.Key]; got != 8 {
				t.Fatalf("reported %v slots wanted; want the 8 asked for", got)
			}
		})
	}
}

func TestWithLeasesABudgetIsSpentUpToTheRegionsAllowanceAsItGrows(t *testing.T) {
	ctx := context.Background()
	clock := newTestClock()
	leases := &fixedLeases{share: map[string]float64{"window": 0.25}, wanted: map[string]float64{}}
	s, err := newSlices(NewMemory(clock.Now), Options{Holder: "gw", Now: clock.Now, Leases: leases})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	window := Rate{Key: "window", Kind: "tenant_spend", PerSecond: 0, Burst: 100}
	spend := func(n float64, want bool) {
		t.Helper()
		if ok, _ := s.TakeN(ctx, window, n); ok != want {
			t.Fatalf("a take of %v at the allowance %v: admitted %v, want %v", n, leases.shareOf("window"), ok, want)
		}
	}
	spend(30, false) // more than the allowance at once: refused, not capped to it
	spend(25, true)
	spend(1, false)
	leases.setShare("window", 0.5)
	clock.Advance(time.Second)
	spend(25, true)
	spend(1, false)
	if got := leases.wantedOf("window"); math.Abs(got-0.82) > 1e-9 {
		t.Fatalf("reported %v as demand; want the 82 units asked for as 0.82 of the budget", got)
	}
}

// A unit asked for again after a refusal is not demand again: a request
// waiting for capacity asks once however often it tries.
func TestWithLeasesARetakeIsNotCountedAsDemandAgain(t *testing.T) {
	ctx := context.Background()
	clock := newTestClock()
	rate := Rate{Key: "route:a:requests", Kind: "route_requests", PerSecond: 1, Burst: 1}
	leases := &fixedLeases{share: map[string]float64{rate.Key: 1}, wanted: map[string]float64{}}
	s, err := newSlices(NewMemory(clock.Now), Options{Holder: "gw", Now: clock.Now, Leases: leases})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if ok, _ := s.TakeN(ctx, rate, 1); !ok {
		t.Fatal("the first take of a full bucket refused")
	}
	if ok, _ := s.TakeN(ctx, rate, 1); ok {
		t.Fatal("a second take of a bucket of 1 admitted at once")
	}
	for range 5 {
		if ok, _ := s.RetakeN(ctx, rate, 1); ok {
			t.Fatal("a retake of an empty bucket admitted")
		}
	}
	clock.Advance(time.Second)
	if ok, _ := s.RetakeN(ctx, rate, 1); !ok {
		t.Fatal("a retake a second later refused: the bucket refilled one")
	}
	if got := leases.wantedOf(rate.Key); got != 2 {
		t.Fatalf("reported %v units of demand; want the 2 asked for by TakeN, none by the retakes", got)
	}
}
