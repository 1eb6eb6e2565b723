package lease

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/hedgerow/hedgerow/budgets/slice/slicetest"
)

// flakyAuthority fails every call while cut, as an authority a region
// cannot reach.
type flakyAuthority struct {
	Authority
	cut atomic.Bool
}

var errCut = errors.New("authority unreachable")

func (a *flakyAuthority) Get(ctx context.Context, key string) (Table, uint64, error) {
	if a.cut.Load() {
		return Table{}, 0, errCut
	}
	return a.Authority.Get(ctx, key)
}

func (a *flakyAuthority) Put(ctx context.Context, key string, t Table, rev uint64) (uint64, error) {
	if a.cut.Load() {
		return 0, errCut
	}
	return a.Authority.Put(ctx, key, t, rev)
}

const (
	rateKey  = "tenant:acme:rate"
	rateKind = "tenant_rate"
)

func globalRates(kind string) bool { return kind == rateKind }

// gateway is one gateway's Region of region on store and auth, its rounds
// driven by the test; it closes with the test.
func gateway(t *testing.T, c *slicetest.Clock, store RegionStore, auth Authority, region, holder string, reg prometheus.Registerer) *Region {
	t.Helper()
	r, err := NewRegion(store, auth, RegionOptions{Region: region, Holder: holder, Lease: twoRegions(),
		Global: globalRates, Now: c.Now, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// run advances the clock by d in quarter intervals (500 ms), each
// gateway wanting perRound units of key and doing its round in turn.
func run(c *slicetest.Clock, d time.Duration, perRound float64, gateways ...*Region) {
	for end := c.Now().Add(d); c.Now().Before(end); {
		c.Advance(DefaultInterval / 4)
		for _, g := range gateways {
			g.Want(rateKey, rateKind, perRound)
			g.Round(context.Background())
		}
	}
}

func grant(t *testing.T, auth Authority, region string) Grant {
	t.Helper()
	tb, _, err := auth.Get(context.Background(), rateKey)
	if err != nil {
		t.Fatal(err)
	}
	return tb.Grants[region]
}

func counter(t *testing.T, r *Region, result string) float64 {
	t.Helper()
	var m dto.Metric
	if err := r.renewals.WithLabelValues(r.opts.Region, result).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestNewRegionRefusesOptionsThatCannotHold(t *testing.T) {
	store, auth := NewMemoryRegion(nil), NewMemory()
	valid := RegionOptions{Region: "east", Lease: twoRegions(), Global: globalRates}
	tests := []struct {
		name  string
		store RegionStore
		auth  Authority
		mod   func(*RegionOptions)
	}{
		{"no store", nil, auth, func(*RegionOptions) {}},
		{"no authority", store, nil, func(*RegionOptions) {}},
		{"a region not among the lease's regions", store, auth, func(o *RegionOptions) { o.Region = "south" }},
		{"no region", store, auth, func(o *RegionOptions) { o.Region = "" }},
		{"lease options that cannot hold", store, auth, func(o *RegionOptions) { o.Lease.Skew = 6 * time.Second }},
		{"a negative interval", store, auth, func(o *RegionOptions) { o.Interval = -time.Second }},
		{"an interval of which two do not fit in a validity less the skew", store, auth, func(o *RegionOptions) { o.Interval = 5 * time.Second }},
		{"no rule of which kinds are global", store, auth, func(o *RegionOptions) { o.Global = nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := valid
			tt.mod(&o)
			if _, err := NewRegion(tt.store, tt.auth, o); !errors.Is(err, ErrInvalid) {
				t.Fatalf("NewRegion = %v; want an error wrapping ErrInvalid", err)
			}
		})
	}
	r, err := NewRegion(store, auth, valid)
	if err != nil {
		t.Fatalf("NewRegion of valid options: %v", err)
	}
	r.Close()
	if r.opts.Interval != DefaultInterval || r.opts.Holder == "" {
		t.Fatalf("defaults: interval %v, holder %q; want %v and a random name", r.opts.Interval, r.opts.Holder, DefaultInterval)
	}
}

func TestShareIsOneForALocalKindElseTheLeaseThenTheSafeShare(t *testing.T) {
	c := slicetest.NewClock() // nothing here sleeps
	store := NewMemoryRegion(c.Now)
	r := gateway(t, c, store, NewMemory(), "east", "gw", nil)
	ctx := context.Background()
	start := c.Now()
	lease := Held{Share: 0.8, Expires: start.Add(10 * time.Second)}
	small := Held{Share: 0.1, Expires: start.Add(10 * time.Second)}
	for key, h := range map[string]Held{"big": lease, "small": small} {
		if err := store.SetHeld(ctx, key, h); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name      string
		key, kind string
		at        time.Duration
		want      float64
	}{
		{"a kind that is not global is spent whole", "big", "route_local", 0, 1},
		{"a kind that is not global is spent whole, even with no lease", "none", "route_local", 0, 1},
		{"a global key with no lease spends the fallback", "none", rateKind, 0, 0.5},
		{"a global key spends its lease", "big", rateKind, 0, 0.8},
		{"a global key spends its lease until the skew before its expiry", "big", rateKind, 9*time.Second - 1, 0.8},
		{"from the skew before its expiry, the fallback when the lease was larger", "big", rateKind, 9 * time.Second, 0.5},
		{"from the skew before its expiry, the last share when it was smaller", "small", rateKind, time.Minute, 0.1},
	}
	r.Round(ctx) // reads the leases from the store
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := r.Share(tt.key, tt.kind, start.Add(tt.at)); got != tt.want {
				t.Fatalf("Share(%s, %s) at +%v = %v; want %v", tt.key, tt.kind, tt.at, got, tt.want)
			}
		})
	}
}

func TestOnlyTheLockHolderRenewsAndAnotherTakesOverWhenItCloses(t *testing.T) {
	c := slicetest.NewClock() // nothing here sleeps
	store, auth := NewMemoryRegion(c.Now), NewMemory()
	a := gateway(t, c, store, auth, "east", "gw-a", nil)
	b := gateway(t, c, store, auth, "east", "gw-b", nil)
	run(c, 20*time.Second, 5, a, b)
	if counter(t, a, "ok") == 0 || counter(t, b, "ok") != 0 {
		t.Fatalf("renewals: a %v, b %v; want only a, the gateway that took the lock first", counter(t, a, "ok"), counter(t, b, "ok"))
	}
	if !grant(t, auth, "east").Expires.After(c.Now()) {
		t.Fatal("the region holds no live lease after 20 s of renewals")
	}
	a.Close()
	before := grant(t, auth, "east").Expires
	run(c, DefaultInterval/4, 5, b) // b takes the lock and measures a round of demand
	run(c, DefaultInterval/4, 5, b) // and renews
	if counter(t, b, "ok") == 0 || !grant(t, auth, "east").Expires.After(before) {
		t.Fatalf("b renewed %v times within two rounds of a closing; want it to take over", counter(t, b, "ok"))
	}
}

func TestARenewalFailureLeavesTheLeaseInForceUntilItsExpiryThenTheSafeShare(t *testing.T) {
	c := slicetest.NewClock() // nothing here sleeps
	mem := NewMemory()
	cut := &flakyAuthority{Authority: mem}
	east := gateway(t, c, NewMemoryRegion(c.Now), mem, "east", "gw-east", nil)
	west := gateway(t, c, NewMemoryRegion(c.Now), cut, "west", "gw-west", nil)
	for range 160 { // 80 s: past the table's learning, shares sized 1:9
		c.Advance(DefaultInterval / 4)
		east.Want(rateKey, rateKind, 5)
		west.Want(rateKey, rateKind, 45)
		east.Round(context.Background())
		west.Round(context.Background())
	}
	held := west.held[rateKey]
	if held.Share < 0.8 {
		t.Fatalf("west's share after 80 s of 9 in 10 of the demand = %v; want at least 0.8", held.Share)
	}
	cut.cut.Store(true)
	errorsBefore := counter(t, west, "error")
	for c.Now().Before(held.Expires.Add(time.Second)) {
		now := c.Now()
		want := held.Share
		if !now.Before(held.Expires.Add(-time.Second)) {
			want = 0.5 // the skew before its expiry: the safe share, the fallback
		}
		if got := west.Share(rateKey, rateKind, now); got != want {
			t.Fatalf("cut off for %v: west spends %v; want %v", now.Sub(held.Expires.Add(-10*time.Second)), got, want)
		}
		c.Advance(DefaultInterval / 4)
		west.Want(rateKey, rateKind, 45)
		west.Round(context.Background())
		east.Round(context.Background())
	}
	if counter(t, west, "error") <= errorsBefore {
		t.Fatal("west's failed renewals were not counted")
	}
	if e := grant(t, mem, "east"); e.Share+0.5 > 1+1e-9 {
		t.Fatalf("east was granted %v while west may spend its safe share 0.5", e.Share)
	}
}

// A region whose store lost its leases (a Redis restarted empty) goes on
// spending the lease its gateways last knew, not the fallback: a region
// with a small share that spent the fallback would pass what the table
// reserves for it.
func TestAStoreThatLostItsLeasesLeavesTheLastKnownLeaseInForce(t *testing.T) {
	c := slicetest.NewClock() // nothing here sleeps
	mem := NewMemory()
	east := gateway(t, c, NewMemoryRegion(c.Now), mem, "east", "gw-east", nil)
	westStore := NewMemoryRegion(c.Now)
	west := gateway(t, c, westStore, mem, "west", "gw-west", nil)
	follower := gateway(t, c, westStore, mem, "west", "gw-west-2", nil) // not the renewer
	// 80 s: past the table's learning, shares sized 9:1.
	for range 160 {
		c.Advance(DefaultInterval / 4)
		east.Want(rateKey, rateKind, 45)
		west.Want(rateKey, rateKind, 5)
		for _, g := range []*Region{east, west, follower} {
			g.Round(context.Background())
		}
	}
	known := follower.held[rateKey]
	if known.Share >= 0.5 {
		t.Fatalf("west's share after 80 s of 1 in 10 of the demand = %v; want below the fallback 0.5", known.Share)
	}
	follower.store = NewMemoryRegion(c.Now) // the region's Redis restarted empty
	c.Advance(DefaultInterval / 4)
	follower.Round(context.Background())
	if got := follower.Share(rateKey, rateKind, c.Now()); got > known.Share {
		t.Fatalf("after its store lost the leases a gateway of west spends %v; want at most the %v it last knew", got, known.Share)
	}
}

// A gateway that starts in a region holding a lease spends that lease
// from its first request, not the fallback: the table reserves a region
// holding a grant only that grant, so a gateway spending the fallback
// until its loop's first round (a quarter interval later) would let the
// regions spend past the ceiling (hedgerow simulate --regions, its
// renewers' handover). Start reads the region's leases first.
func TestAGatewayStartingInARegionThatHoldsALeaseSpendsItFromItsFirstRequest(t *testing.T) {
	c := slicetest.NewClock() // nothing here sleeps; the started loop's first tick is a second of wall time away
	mem := NewMemory()
	east := gateway(t, c, NewMemoryRegion(c.Now), mem, "east", "gw-east", nil)
	westStore := NewMemoryRegion(c.Now)
	west := gateway(t, c, westStore, mem, "west", "gw-west", nil)
	// 80 s: past the table's learning, shares sized 9:1.
	for range 160 {
		c.Advance(DefaultInterval / 4)
		east.Want(rateKey, rateKind, 45)
		west.Want(rateKey, rateKind, 5)
		east.Round(context.Background())
		west.Round(context.Background())
	}
	held := west.Share(rateKey, rateKind, c.Now())
	if held >= 0.5 {
		t.Fatalf("west's share after 80 s of 1 in 10 of the demand = %v; want below the fallback 0.5", held)
	}
	late, err := NewRegion(westStore, mem, RegionOptions{Region: "west", Holder: "gw-west-2", Lease: twoRegions(),
		Interval: 4 * time.Second, Global: globalRates, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(late.Close)
	late.Start()
	got := late.Share(rateKey, rateKind, c.Now())
	if got != held {
		t.Errorf("a gateway of west just started spends %v; want west's lease, %v", got, held)
	}
	if sum := east.Share(rateKey, rateKind, c.Now()) + got; sum > 1+1e-9 {
		t.Errorf("the regions may spend %v of the ceiling together; want at most 1", sum)
	}
}

// A region's first requests come before its first renewer: the keys they
// wanted are renewed when a gateway takes the lock, not forgotten with the
// demand whose span is unknown.
func TestAKeyWantedBeforeTheFirstRenewerTookOverIsRenewed(t *testing.T) {
	c := slicetest.NewClock() // nothing here sleeps
	auth := NewMemory()
	store := NewMemoryRegion(c.Now)
	east := gateway(t, c, store, auth, "east", "gw-east", nil)
	east.Want(rateKey, rateKind, 10)
	east.flush(context.Background()) // the demand reaches the store before any lock
	for range 3 {
		c.Advance(DefaultInterval / 4)
		east.Round(context.Background())
	}
	if g := grant(t, auth, "east"); g.Expires.IsZero() {
		t.Fatal("the key wanted before the renewer took over was never renewed")
	}
}

func TestDemandFlowsFromWantThroughTheStoreIntoTheAsk(t *testing.T) {
	c := slicetest.NewClock() // nothing here sleeps
	store, auth := NewMemoryRegion(c.Now), NewMemory()
	renewer := gateway(t, c, store, auth, "east", "gw-a", nil)
	other := gateway(t, c, store, auth, "east", "gw-b", nil)
	renewer.Round(context.Background()) // takes the lock
	// 20 units a round (40/s) wanted at the gateway that does not renew.
	run(c, 20*time.Second, 0, renewer)
	for range 40 {
		c.Advance(DefaultInterval / 4)
		other.Want(rateKey, rateKind, 20)
		other.Round(context.Background())
		renewer.Round(context.Background())
	}
	if d := grant(t, auth, "east").Demand; math.Abs(d-40) > 0.5 {
		t.Fatalf("the region asked with demand %v; want the 40/s wanted at its other gateway", d)
	}
	// Half the demand: the average follows within a few intervals.
	for range 16 {
		c.Advance(DefaultInterval / 4)
		other.Want(rateKey, rateKind, 10)
		other.Round(context.Background())
		renewer.Round(context.Background())
	}
	if d := grant(t, auth, "east").Demand; math.Abs(d-20) > 1 {
		t.Fatalf("after 8 s of 20/s the region asked with demand %v; want about 20", d)
	}
}

func TestAKeyWantedByNoOneForAValidityIsNoLongerRenewed(t *testing.T) {
	c := slicetest.NewClock() // nothing here sleeps
	store, auth := NewMemoryRegion(c.Now), NewMemory()
	r := gateway(t, c, store, auth, "east", "gw", nil)
	run(c, 10*time.Second, 5, r)
	last := grant(t, auth, "east").Expires
	run(c, 9*time.Second, 0, r)
	if !grant(t, auth, "east").Expires.After(last) {
		t.Fatal("a key wanted within the validity was not renewed")
	}
	run(c, 10*time.Second, 0, r)
	last = grant(t, auth, "east").Expires
	run(c, 10*time.Second, 0, r)
	if got := grant(t, auth, "east").Expires; !got.Equal(last) {
		t.Fatalf("a key wanted by no one for 20 s was renewed to %v", got)
	}
	if h := r.held[rateKey]; h.Share == 0 || c.Now().Before(h.Expires) {
		t.Fatalf("held %+v; want its last lease kept, expired (so the region spends its safe share)", h)
	}
}

func TestMetricsAreByKindAndRegionNeverByKey(t *testing.T) {
	c := slicetest.NewClock() // nothing here sleeps
	reg := prometheus.NewRegistry()
	r := gateway(t, c, NewMemoryRegion(c.Now), NewMemory(), "east", "gw", reg)
	gauge := func(name string) (float64, map[string]string) {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			if len(mf.GetMetric()) != 1 {
				t.Fatalf("%s: %d series; want one (the kind)", name, len(mf.GetMetric()))
			}
			m := mf.GetMetric()[0]
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			return m.GetGauge().GetValue(), labels
		}
		t.Fatalf("%s is not exported", name)
		return 0, nil
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]int{}
	for _, mf := range mfs {
		names[mf.GetName()] = len(mf.GetMetric())
	}
	if len(mfs) != 4 || names["hedgerow_lease_renewals_total"] != 2 {
		t.Fatalf("from the start: %v; want the renewals counter, ok and error, and the global kind's gauges", names)
	}
	// From the start, before any key is wanted, the global kind reads as
	// idle: the share a first key would spend, no lease, not on the safe
	// share (nothing is spent on it).
	for _, tt := range []struct {
		name string
		want float64
	}{{"hedgerow_lease_share", 0.5}, {"hedgerow_lease_expiry_seconds", 0}, {"hedgerow_lease_fallback", 0}} {
		if v, l := gauge(tt.name); v != tt.want || l["kind"] != rateKind || l["region"] != "east" {
			t.Errorf("%s from the start = %v %v; want %v of kind %s, region east", tt.name, v, l, tt.want, rateKind)
		}
	}
	r.Want(rateKey, rateKind, 1)
	r.Want("route:r1", "route_local", 1) // not global: not a lease
	if v, _ := gauge("hedgerow_lease_fallback"); v != 1 {
		t.Fatalf("fallback before any lease = %v; want 1", v)
	}
	run(c, 4*time.Second, 1, r)
	if v, l := gauge("hedgerow_lease_share"); v != 0.5 || l["kind"] != rateKind || l["region"] != "east" || len(l) != 2 {
		t.Fatalf("share = %v %v; want 0.5 (the learning table grants no more than the fallback) by kind and region only", v, l)
	}
	if v, _ := gauge("hedgerow_lease_expiry_seconds"); v <= 0 || v > 10 {
		t.Fatalf("expiry = %v s; want the soonest lease's, within the validity", v)
	}
	if v, _ := gauge("hedgerow_lease_fallback"); v != 0 {
		t.Fatalf("fallback with live leases of every key = %v; want 0", v)
	}
	r.Want("tenant:bravo:rate", rateKind, 1) // no lease yet
	if v, _ := gauge("hedgerow_lease_fallback"); v != 1 {
		t.Fatalf("fallback with a key of the kind on its safe share = %v; want 1", v)
	}
	if mfs, err = reg.Gather(); err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.Contains(l.GetValue(), "acme") {
					t.Fatalf("%s carries a ceiling's key: %v", mf.GetName(), l)
				}
			}
		}
	}
}

func TestStartRunsTheLoopAndCloseStopsItAndGivesTheLockBack(t *testing.T) {
	store := NewMemoryRegion(nil)
	r, err := NewRegion(store, NewMemory(), RegionOptions{Region: "east", Holder: "gw-a", Lease: twoRegions(), Global: globalRates})
	if err != nil {
		t.Fatal(err)
	}
	r.Start()
	r.Round(context.Background()) // as the loop would: takes the lock
	r.Close()
	r.Close() // twice is harmless
	if ok, err := store.Lock(context.Background(), "gw-b", time.Minute); err != nil || !ok {
		t.Fatalf("another gateway's Lock after Close = %v, %v; want the lock given back", ok, err)
	}
}

// recordingAuthority records when each table was written.
type recordingAuthority struct {
	Authority
	now    func() time.Time
	writes []time.Time
}

func (a *recordingAuthority) Put(ctx context.Context, key string, t Table, rev uint64) (uint64, error) {
	a.writes = append(a.writes, a.now())
	return a.Authority.Put(ctx, key, t, rev)
}

// An ask says the region holds the lease last recorded, which every
// gateway reads each round: so however fast demand moves, two renewals of
// a key are at least half an interval (two rounds) apart; a shift of
// demand is renewed early, a steady demand every interval.
func TestRenewalsOfAKeyAreHalfAnIntervalApartAtLeastAndAnIntervalWhenDemandIsSteady(t *testing.T) {
	tests := []struct {
		name     string
		demand   func(round int) float64
		min, max time.Duration // spacing of renewals
		early    bool          // some renewal comes before an interval
	}{
		{"steady demand: every interval", func(int) float64 { return 10 }, DefaultInterval, DefaultInterval, false},
		{"demand swinging each round: early, never within half an interval", func(i int) float64 { return float64(1 + 99*(i%2)) },
			DefaultInterval / 2, DefaultInterval, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := slicetest.NewClock() // nothing here sleeps
			auth := &recordingAuthority{Authority: NewMemory(), now: c.Now}
			r := gateway(t, c, NewMemoryRegion(c.Now), auth, "east", "gw", nil)
			for i := range 80 {
				c.Advance(DefaultInterval / 4)
				r.Want(rateKey, rateKind, tt.demand(i))
				r.Round(context.Background())
			}
			if len(auth.writes) < 10 {
				t.Fatalf("%d renewals in 20 s", len(auth.writes))
			}
			early := false
			for i := 2; i < len(auth.writes); i++ { // past the first, taken on a round of demand
				d := auth.writes[i].Sub(auth.writes[i-1])
				if d < tt.min || d > tt.max {
					t.Fatalf("renewals %v apart; want between %v and %v", d, tt.min, tt.max)
				}
				early = early || d < DefaultInterval
			}
			if early != tt.early {
				t.Fatalf("a renewal came early: %v; want %v", early, tt.early)
			}
		})
	}
}

// The lease gauges exist from the start for the kinds of RegionOptions.Kinds
// that hold across regions, CeilingKinds by default; a kind that is the
// region's own never has them.
func TestLeaseGaugesExistFromTheStartForEveryGlobalKind(t *testing.T) {
	tests := []struct {
		name   string
		kinds  []string
		global func(string) bool
		want   []string
	}{
		{"by default every ceiling kind a lease splits, of those that hold across regions", nil, globalRates, []string{rateKind}},
		{"every leasable kind when all hold across regions", nil, func(string) bool { return true }, CeilingKinds},
		{"the kinds named, of those that hold across regions", []string{rateKind, "route_requests"},
			func(k string) bool { return k == "route_requests" }, []string{"route_requests"}},
		{"none when no kind holds across regions", nil, func(string) bool { return false }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, reg := slicetest.NewClock(), prometheus.NewRegistry()
			r, err := NewRegion(NewMemoryRegion(c.Now), NewMemory(), RegionOptions{Region: "east", Lease: twoRegions(),
				Global: tt.global, Kinds: tt.kinds, Now: c.Now, Registerer: reg})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.Close)
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, mf := range mfs {
				if mf.GetName() == "hedgerow_lease_renewals_total" {
					continue
				}
				var got []string
				for _, m := range mf.GetMetric() {
					for _, l := range m.GetLabel() {
						if l.GetName() == "kind" {
							got = append(got, l.GetValue())
						}
					}
				}
				slices.Sort(got)
				if want := slices.Sorted(slices.Values(tt.want)); !slices.Equal(got, want) {
					t.Errorf("%s: kinds %v, want %v", mf.GetName(), got, want)
				}
			}
			if want := 1 + 3*min(1, len(tt.want)); len(mfs) != want {
				t.Errorf("%d metric families from the start, want %d", len(mfs), want)
			}
		})
	}
}
