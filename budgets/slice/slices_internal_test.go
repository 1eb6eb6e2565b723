package slice

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// testClock is a clock the tests advance; nothing sleeps.
type testClock struct {
	mu sync.Mutex
	at time.Time
}

func newTestClock() *testClock { return &testClock{at: time.Unix(1_800_000_000, 0)} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.at = c.at.Add(d)
	c.mu.Unlock()
}

// countingGranter counts the calls that reach a granter and fails them
// while down is set, as an unreachable Redis would.
type countingGranter struct {
	Granter
	calls atomic.Int64
	down  atomic.Bool
}

var errDown = errors.New("granter unreachable")

func (g *countingGranter) Take(ctx context.Context, r Rate, holder string, want, adjust float64) (float64, float64, time.Duration, error) {
	g.calls.Add(1)
	if g.down.Load() {
		return 0, 0, 0, errDown
	}
	return g.Granter.Take(ctx, r, holder, want, adjust)
}

func (g *countingGranter) Hold(ctx context.Context, c Concurrency, holder string, want int, ttl time.Duration) (int, error) {
	g.calls.Add(1)
	if g.down.Load() {
		return 0, errDown
	}
	return g.Granter.Hold(ctx, c, holder, want, ttl)
}

func (g *countingGranter) Alive(ctx context.Context, holder string, ttl time.Duration) (int, string, error) {
	if g.down.Load() {
		return 0, "", errDown
	}
	return g.Granter.Alive(ctx, holder, ttl)
}

// gateway is one gateway's Slices on a shared granter, driven by the test:
// its background work runs when the test says.
func gateway(t *testing.T, g Granter, clock *testClock, holder string) *Slices {
	t.Helper()
	s, err := newSlices(g, Options{Holder: holder, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// twoGatewaysAlive is two gateways on g that have each seen both alive:
// the divisor of their safe shares is 2.
func twoGatewaysAlive(t *testing.T, g Granter, clock *testClock) (*Slices, *Slices) {
	t.Helper()
	a, b := gateway(t, g, clock, "gw-a"), gateway(t, g, clock, "gw-b")
	for _, s := range []*Slices{a, b, a} {
		s.countAlive(context.Background())
	}
	return a, b
}

var tenantRate = Rate{Key: "tenant:acme:rate", Kind: "tenant_rate", PerSecond: 5, Burst: 5}

// drive offers perSecond takes a second to each gateway for d, running
// each gateway's background round every 250 ms as its loop would, and
// counts what each admitted.
func drive(ctx context.Context, clock *testClock, r Rate, perSecond int, d time.Duration, gws ...*Slices) []int {
	admitted := make([]int, len(gws))
	step := time.Second / time.Duration(perSecond)
	var sinceRenew time.Duration
	for elapsed := time.Duration(0); elapsed < d; elapsed += step {
		for i, s := range gws {
			if ok, _ := s.Take(ctx, r); ok {
				admitted[i]++
			}
		}
		clock.Advance(step)
		if sinceRenew += step; sinceRenew >= 250*time.Millisecond {
			sinceRenew = 0
			for _, s := range gws {
				s.renew(ctx)
			}
		}
	}
	return admitted
}

func TestASteadyRequestSpendsFromItsSliceWithoutARoundTrip(t *testing.T) {
	ctx := context.Background()
	clock := newTestClock()
	g := &countingGranter{Granter: NewMemory(clock.Now)}
	s := gateway(t, g, clock, "gw-a")
	// 2 requests a second against a ceiling of 5: once its use is a token
	// a lead, the slice is refilled a lead ahead in the background, so no
	// request waits for the granter. Before that (the first few takes of
	// a cold slice) each asks on its path.
	onPath, warm := 0, 0
	for i := range 120 {
		before := g.calls.Load()
		if ok, _ := s.Take(ctx, tenantRate); !ok {
			t.Fatalf("take %d refused at 2/s under a ceiling of 5/s", i)
		}
		if g.calls.Load() != before {
			onPath++
			warm = i
		}
		clock.Advance(250 * time.Millisecond)
		s.renew(ctx)
		clock.Advance(250 * time.Millisecond)
		s.renew(ctx)
	}
	if warm >= 5 {
		t.Fatalf("take %d of 120 (%d in all) called the granter on its path; want only the first few, while the slice was cold", warm, onPath)
	}
}

func TestTwoGatewaysAboveTheCeilingAdmitNoMoreThanItsBurstAndRefill(t *testing.T) {
	ctx := context.Background()
	clock := newTestClock()
	g := NewMemory(clock.Now)
	a, b := gateway(t, g, clock, "gw-a"), gateway(t, g, clock, "gw-b")
	// Each offers 20/s against 5/s (burst 5) for a minute.
	got := drive(ctx, clock, tenantRate, 20, time.Minute, a, b)
	total := got[0] + got[1]
	ceiling := int(tenantRate.Burst + tenantRate.PerSecond*60)
	t.Logf("admitted %v of a ceiling of %d", got, ceiling)
	if total > ceiling {
		t.Fatalf("admitted %d (%v) in a minute; the ceiling allows %d", total, got, ceiling)
	}
	// The slices lose little of the ceiling to grants left unspent.
	if total < ceiling*95/100 {
		t.Fatalf("admitted %d (%v) in a minute against %d: the slices starve their gateways", total, got, ceiling)
	}
	if got[0] < total/4 || got[1] < total/4 {
		t.Fatalf("admitted %v: one gateway starved the other", got)
	}
}

func TestAGatewayCutOffFromItsGranterSpendsItsSliceThenItsSafeShare(t *testing.T) {
	ctx := context.Background()
	clock := newTestClock()
	g := &countingGranter{Granter: NewMemory(clock.Now)}
	a, _ := twoGatewaysAlive(t, g, clock)
	drive(ctx, clock, tenantRate, 20, 5*time.Second, a)
	g.down.Store(true)
	// 30 s without the granter at 20/s: a spends what its slice holds,
	// then half the ceiling (two gateways alive), never more.
	got := drive(ctx, clock, tenantRate, 20, 30*time.Second, a)[0]
	safe := tenantRate.Burst/2 + tenantRate.PerSecond/2*30
	slice := 2 * tenantRate.PerSecond * DefaultLead.Seconds() // a grant is at most two leads of use
	t.Logf("admitted %d without the granter; safe share %.0f", got, safe)
	if float64(got) > safe+slice {
		t.Fatalf("admitted %d in 30 s without the granter; safe share %.0f + a slice %.0f", got, safe, slice)
	}
	if float64(got) < safe*0.95 {
		t.Fatalf("admitted %d in 30 s without the granter; the safe share allows %.0f", got, safe)
	}
	calls := g.calls.Load()
	if ok, _ := a.Take(ctx, tenantRate); !ok {
		clock.Advance(time.Second)
		if ok, _ := a.Take(ctx, tenantRate); !ok {
			t.Fatal("a safe share refuses a take after a second's refill")
		}
	}
	if g.calls.Load() != calls {
		t.Fatal("a take called the unreachable granter on its path; only the background probes it")
	}
	if v := gaugeSafeShare(a); v != 1 {
		t.Fatalf("hedgerow_slice_safe_share = %v while on the safe share; want 1", v)
	}
	g.down.Store(false)
	a.renew(ctx) // the background probe succeeds
	if v := gaugeSafeShare(a); v != 0 {
		t.Fatalf("hedgerow_slice_safe_share = %v after the granter answered; want 0", v)
	}
}

var tenantConcurrency = Concurrency{Key: "tenant:acme:conc", Kind: "tenant_concurrency", Max: 3}

func TestSlotsHeldAcrossGatewaysNeverExceedTheMax(t *testing.T) {
	ctx := context.Background()
	clock := newTestClock()
	g := &countingGranter{Granter: NewMemory(clock.Now)}
	a, b := gateway(t, g, clock, "gw-a"), gateway(t, g, clock, "gw-b")
	for i := range 2 {
		if !a.Acquire(ctx, tenantConcurrency) {
			t.Fatalf("a's acquire %d of 3 refused", i+1)
		}
	}
	if !b.Acquire(ctx, tenantConcurrency) {
		t.Fatal("b's acquire of the third slot refused")
	}
	if a.Acquire(ctx, tenantConcurrency) || b.Acquire(ctx, tenantConcurrency) {
		t.Fatal("a fourth slot granted against a max of 3")
	}
	// A freed slot lingers with its gateway, so its next request takes it
	// without a round trip; the other gateway gets it once the linger is
	// over and the background gives it back.
	a.Release(tenantConcurrency)
	calls := g.calls.Load()
	if !a.Acquire(ctx, tenantConcurrency) || g.calls.Load() != calls {
		t.Fatal("a's freed slot was not reused without a round trip")
	}
	a.Release(tenantConcurrency)
	if b.Acquire(ctx, tenantConcurrency) {
		t.Fatal("b took a slot a still holds within its linger")
	}
	clock.Advance(DefaultLinger)
	a.renew(ctx)
	if !b.Acquire(ctx, tenantConcurrency) {
		t.Fatal("b could not take the slot a gave back after its linger")
	}
}

func TestAGatewayCutOffFromItsGranterKeepsItsSlotsThenItsSafeShare(t *testing.T) {
	ctx := context.Background()
	clock := newTestClock()
	g := &countingGranter{Granter: NewMemory(clock.Now)}
	a, b := twoGatewaysAlive(t, g, clock)
	if !a.Acquire(ctx, tenantConcurrency) {
		t.Fatal("a's acquire refused")
	}
	g.down.Store(true)
	// While its hold lives, a uses what it holds: one slot.
	if a.Acquire(ctx, tenantConcurrency) {
		t.Fatal("a took a slot it does not hold while the granter is down")
	}
	// Once the hold lapses, a runs on its safe share: 3 / 2 gateways = 1.
	clock.Advance(DefaultTTL)
	a.renew(ctx)
	if a.Acquire(ctx, tenantConcurrency) {
		t.Fatal("a went past its safe share of 1 slot (one in use)")
	}
	a.Release(tenantConcurrency)
	if !a.Acquire(ctx, tenantConcurrency) {
		t.Fatal("a's safe share of 1 slot refused with none in use")
	}
	g.down.Store(false)
	a.renew(ctx) // re-holds the slot in use
	if !b.Acquire(ctx, tenantConcurrency) || !b.Acquire(ctx, tenantConcurrency) || b.Acquire(ctx, tenantConcurrency) {
		t.Fatal("after the granter returned, b did not get exactly the 2 slots a leaves")
	}
}

// gaugeSafeShare reads the safe-share gauge as a scrape would.
func gaugeSafeShare(s *Slices) float64 {
	ch := make(chan prometheusMetric, 16)
	go func() { (*gauges)(s).Collect(ch); close(ch) }()
	v := -1.0
	for m := range ch {
		if m.Desc() == safeShareDesc {
			v = metricValue(m)
		}
	}
	return v
}

type prometheusMetric = prometheus.Metric

// metricValue is a gauge's value.
func metricValue(m prometheus.Metric) float64 {
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		return -1
	}
	return out.GetGauge().GetValue()
}

// switchableGranter is a granter whose state can be lost, as a Redis
// restarted empty loses it: Lose swaps in a fresh Memory.
type switchableGranter struct {
	mu    sync.Mutex
	clock *testClock
	g     *Memory
}

func (s *switchableGranter) current() *Memory {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.g
}

func (s *switchableGranter) Lose() {
	s.mu.Lock()
	s.g = NewMemory(s.clock.Now)
	s.mu.Unlock()
}

func (s *switchableGranter) Take(ctx context.Context, r Rate, holder string, want, adjust float64) (float64, float64, time.Duration, error) {
	return s.current().Take(ctx, r, holder, want, adjust)
}

func (s *switchableGranter) Hold(ctx context.Context, c Concurrency, holder string, want int, ttl time.Duration) (int, error) {
	return s.current().Hold(ctx, c, holder, want, ttl)
}

func (s *switchableGranter) Alive(ctx context.Context, holder string, ttl time.Duration) (int, string, error) {
	return s.current().Alive(ctx, holder, ttl)
}

// spendWindow is a window's budget: it never refills; the next window is
// another key.
var spendWindow = Rate{Key: "tenant:acme:spend:3600000:0", Kind: "tenant_spend", Burst: 1000}

// spendAll takes units in steps of step until refused and says how many
// it got.
func spendAll(ctx context.Context, s *Slices, r Rate, step float64) float64 {
	got := 0.0
	for range 1000 {
		if ok, _ := s.TakeN(ctx, r, step); !ok {
			return got
		}
		got += step
	}
	return got
}

func TestAWindowsBudgetIsNotForgottenWhenTheGranterLosesItsState(t *testing.T) {
	ctx := context.Background()
	clock := newTestClock()
	g := &switchableGranter{clock: clock, g: NewMemory(clock.Now)}
	a := gateway(t, g, clock, "gw-a")
	a.countAlive(ctx)
	spentA := 0.0
	for range 6 {
		if ok, _ := a.TakeN(ctx, spendWindow, 100); !ok {
			t.Fatal("a's take within the window's budget refused")
		}
		spentA += 100
	}
	g.Lose() // Redis restarted empty
	a.countAlive(ctx)
	a.renew(ctx) // charges the new state with what a consumed
	b := gateway(t, g, clock, "gw-b")
	spentB := spendAll(ctx, b, spendWindow, 50)
	spentA += spendAll(ctx, a, spendWindow, 50)
	if spentA+spentB > spendWindow.Burst {
		t.Fatalf("a spent %v and b %v after the granter lost its state: %v past the window's %v", spentA, spentB, spentA+spentB, spendWindow.Burst)
	}
	if spentA+spentB < spendWindow.Burst-100 {
		t.Fatalf("a spent %v and b %v of a window of %v: the charge-back lost more than a grant", spentA, spentB, spendWindow.Burst)
	}
}

func TestWhatASafeShareSpentIsChargedWhenTheGranterReturns(t *testing.T) {
	ctx := context.Background()
	clock := newTestClock()
	g := &countingGranter{Granter: NewMemory(clock.Now)}
	a, b := twoGatewaysAlive(t, g, clock)
	spentA := 0.0
	if ok, _ := a.TakeN(ctx, spendWindow, 100); !ok {
		t.Fatal("a's first take refused")
	}
	spentA += 100
	g.down.Store(true)
	spentA += spendAll(ctx, a, spendWindow, 100) // its slice, then half the window
	if spentA > spendWindow.Burst/2+2*100 {
		t.Fatalf("a spent %v without the granter: past its safe share %v and a grant", spentA, spendWindow.Burst/2)
	}
	g.down.Store(false)
	a.renew(ctx) // charges what a spent on its safe share
	spentB := spendAll(ctx, b, spendWindow, 100)
	if spentA+spentB > spendWindow.Burst+100 {
		t.Fatalf("a spent %v and b %v: the window's %v passed by more than a grant", spentA, spentB, spendWindow.Burst)
	}
	t.Logf("a spent %v (partly on its safe share), then b %v, of %v", spentA, spentB, spendWindow.Burst)
}

// A slice left holding tokens after a burst keeps serving a slow trickle
// past its TTL: its tokens lapse only while the granter is away.
func TestASliceLeftFullAfterABurstServesASlowTrickle(t *testing.T) {
	ctx := context.Background()
	clock := newTestClock()
	g := &countingGranter{Granter: NewMemory(clock.Now)}
	s := gateway(t, g, clock, "gw-a")
	busy := Rate{Key: "tenant:busy:rate", Kind: "tenant_rate", PerSecond: 100, Burst: 100}
	drive(ctx, clock, busy, 50, 3*time.Second, s)
	refused := 0
	for range 30 {
		for range 6 { // the background round every 250 ms
			clock.Advance(250 * time.Millisecond)
			s.renew(ctx)
		}
		if ok, _ := s.Take(ctx, busy); !ok {
			refused++
		}
	}
	if refused > 0 {
		t.Fatalf("%d of 30 requests, one every 1.5 s under a ceiling of 100/s, refused", refused)
	}
}

// A Memory forgets the buckets a missing one stands for: windows' budgets
// untouched for KeepBudgets, refilling buckets full again.
func TestAMemoryForgetsBucketsThatCameBackFullOrWentStale(t *testing.T) {
	ctx := context.Background()
	clock := newTestClock()
	m := NewMemory(clock.Now)
	for i := range pruneEvery {
		w := Rate{Key: "tenant:t:spend:" + string(rune('a'+i%26)) + time.Duration(i).String(), Kind: "tenant_spend", Burst: 10}
		if _, _, _, err := m.Take(ctx, w, "gw", 1, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, _, err := m.Take(ctx, tenantRate, "gw", 1, 0); err != nil {
		t.Fatal(err)
	}
	clock.Advance(KeepBudgets)
	for range pruneEvery {
		if _, _, _, err := m.Take(ctx, tenantRate, "gw", 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	// Only the rate in use is left: the windows' budgets went stale.
	if _, ok := m.buckets[tenantRate.Key]; len(m.buckets) != 1 || !ok {
		t.Fatalf("%d buckets kept past KeepBudgets; want only the rate in use", len(m.buckets))
	}
}

// Cut off from the granter, two gateways share out what was left of a
// window's budget at the granter's last answer to each, not the whole
// window again: together they spend at most the window and what the
// other's grants took after each one's last answer (at most a grant each
// here; a share of the whole window would have let them spend 1,800).
func TestGatewaysCutOffShareWhatWasLeftOfAWindowNotTheWholeWindow(t *testing.T) {
	ctx := context.Background()
	clock := newTestClock()
	g := &countingGranter{Granter: NewMemory(clock.Now)}
	a, b := twoGatewaysAlive(t, g, clock)
	spent := 0.0
	for range 4 { // 800 of the window's 1000, half through each
		for _, s := range []*Slices{a, b} {
			if ok, _ := s.TakeN(ctx, spendWindow, 100); !ok {
				t.Fatal("a take within the window's budget refused")
			}
			spent += 100
		}
	}
	g.down.Store(true)
	spent += spendAll(ctx, a, spendWindow, 10) + spendAll(ctx, b, spendWindow, 10)
	if spent > spendWindow.Burst+2*100 {
		t.Fatalf("the gateways spent %v of a window of %v, %v of it after the granter went away", spent, spendWindow.Burst, spent-800)
	}
	t.Logf("spent %v of %v, %v after the granter went away", spent, spendWindow.Burst, spent-800)
}
