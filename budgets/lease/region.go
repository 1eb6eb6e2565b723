package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// CeilingKinds are the kinds of ceiling a regional lease can split: rates,
// concurrency and budgets (docs/architecture.md §14): the kinds a
// configuration's global.ceilings may name.
var CeilingKinds = []string{"tenant_rate", "tenant_concurrency", "tenant_spend", "route_requests", "route_tokens", "pool_reserve"}

// BudgetKinds are the kinds of CeilingKinds that are budgets, consumed over
// a window and never refilled, leased as allowances (Ask.Budget): their
// demand is in parts of the budget per second.
var BudgetKinds = []string{"tenant_spend"}

// demandField names key's demand, of kind, in the region's store, so that
// the renewer learns each key's kind from any gateway's demand.
func demandField(key, kind string) string { return kind + "|" + key }

// splitDemandField is the key and kind a demandField names (no kind for a
// field without one).
func splitDemandField(field string) (key, kind string) {
	kind, key, ok := strings.Cut(field, "|")
	if !ok {
		return field, ""
	}
	return key, kind
}

// DefaultInterval is a region's rebalance interval: how often its renewer
// renews every lease it holds (docs/architecture.md §14).
const DefaultInterval = 2 * time.Second

// RegionOptions configure a Region.
type RegionOptions struct {
	// Region names this gateway's region: one of Lease.Regions.
	Region string
	// Holder names this gateway to the region's renewal lock; empty means
	// a random name, unique across the region.
	Holder string
	// Lease are the rules of every region's leases; every region and every
	// gateway must use the same.
	Lease Options
	// Interval is the rebalance interval (default 2 s): the renewer renews
	// every lease this often, and every gateway reads the region's leases
	// and hands on its demand four times as often. Two intervals must fit
	// in a lease's validity less the skew, so one lost renewal does not
	// drop the region to its safe share.
	Interval time.Duration
	// Global reports whether ceilings of a kind hold across regions (a
	// tenant's rate: yes; a region's own Redis' limits: no). Required. A
	// kind's answer must not change while the Region lives.
	Global func(kind string) bool
	// Kinds are the ceiling kinds whose lease gauges exist from the start,
	// before any ceiling of them is wanted, so a dashboard and alerts read
	// them at once (docs/architecture.md §9); those of them Global says
	// hold across regions are exported. Nil means CeilingKinds. A kind
	// not among them is exported from its first ceiling wanted.
	Kinds []string
	// Now is the clock of the leases' expiries; nil means time.Now.
	Now        func() time.Time
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Region is one gateway's side of its region's leases (docs/architecture.md
// §14, "The region's side"): what it may spend of every global ceiling
// (Share), the demand it saw (Want), and, on the one gateway of the region
// that holds the renewal lock, the renewals at the authority. It is safe
// for concurrent use; Share and Want do no I/O, Round does it all.
//
// Demand: every round the renewer takes the region's demand from the store
// and folds it into a rate per key, an exponentially weighted moving
// average of units per second with time constant τ = demandTau × Interval:
// rate += (units/dt − rate) × (1 − e^(−dt/τ)), dt the time since its last
// take (a key's first take is its rate). A key is renewed while it had
// demand within a lease's validity: every Interval, sooner when its demand
// moved (renewDue).
type Region struct {
	store RegionStore
	auth  Authority
	opts  RegionOptions
	lease Options // opts.Lease with its defaults
	now   func() time.Time
	log   *slog.Logger

	mu     sync.RWMutex
	held   map[string]Held    // the region's leases as last read from the store (or granted here)
	local  map[string]float64 // demand seen here since the last flush
	kinds  map[string]kindSeen
	failed bool // the last renewal failed: a run of failures is logged once

	// The renewer's state, touched by Round alone (under round).
	round     sync.Mutex
	renewer   bool
	lockUntil time.Time // when this gateway's hold of the lock lapses, by its clock
	stepped   time.Time // when it last claimed or extended the lock
	takenAt   time.Time // the last TakeDemand
	rate      map[string]float64
	budget    map[string]bool      // the keys its demand named as budgets
	wantedAt  map[string]time.Time // the last take in which key had demand
	asked     map[string]asked     // key's last renewal

	renewals  *prometheus.CounterVec // region, result
	stop      chan struct{}
	done      chan struct{}
	started   bool
	startOnce sync.Once
	closeOnce sync.Once
}

// asked is a key's last renewal: the demand it asked with, and when.
type asked struct {
	demand float64
	at     time.Time
	// shrank: the grant came back smaller than the lease held when it
	// asked, which the table keeps reserved until the region's next ask.
	shrank bool
}

// kindSeen is a key's ceiling kind and when this gateway last wanted it.
type kindSeen struct {
	kind string
	at   time.Time
}

// demandTau is the demand average's time constant, in intervals: a
// quarter, one round, so a shift of demand shows within a round or two.
// Shares follow it two renewals later (a shrinking region's last lease
// stays reserved until its next renewal; then the growing region renews):
// with the early renewals of renewDue, within three intervals. A longer
// average smooths more and rebalances later: at two rebalance intervals
// about six, at one about four, at half of one up to four,
// in TestSharesFollowAShiftOfDemandAndTheCeilingHoldsAcrossRegions. The
// price of a short one is a noisier demand for a sparse key, renewed
// early (once a second) more often.
const demandTau = 0.25

// demandShift is how far a key's demand moves, as a part of the larger of
// its last ask's and its rate now, before it is renewed early.
const demandShift = 0.25

// lockTTL is the renewal lock's hold, in intervals: a renewer that dies is
// replaced within it.
const lockTTL = 3

// NewRegion returns this gateway's side of its region's leases over store
// and auth. Its background loop runs once Start is called; Close stops it.
func NewRegion(store RegionStore, auth Authority, opts RegionOptions) (*Region, error) {
	if store == nil || auth == nil {
		return nil, fmt.Errorf("%w: region: a region store and an authority are required", ErrInvalid)
	}
	lease, err := opts.Lease.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("lease: region %q: %w", opts.Region, err)
	}
	if opts.Interval == 0 {
		opts.Interval = DefaultInterval
	}
	switch {
	case !slices.Contains(lease.Regions, opts.Region):
		return nil, fmt.Errorf("%w: region: %q is not one of %v", ErrInvalid, opts.Region, lease.Regions)
	case opts.Interval < 0 || 2*opts.Interval > lease.Validity-lease.Skew:
		return nil, fmt.Errorf("%w: region: interval %v must be > 0 and two of them fit in the validity %v less the skew %v",
			ErrInvalid, opts.Interval, lease.Validity, lease.Skew)
	case opts.Global == nil:
		return nil, fmt.Errorf("%w: region: Global must say which ceiling kinds hold across regions", ErrInvalid)
	}
	if opts.Kinds == nil {
		opts.Kinds = CeilingKinds
	}
	opts.Kinds = slices.DeleteFunc(slices.Clone(opts.Kinds), func(kind string) bool { return !opts.Global(kind) })
	if opts.Holder == "" {
		var b [12]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
		opts.Holder = hex.EncodeToString(b[:])
	}
	r := &Region{store: store, auth: auth, opts: opts, lease: lease, now: opts.Now, log: opts.Logger,
		held: map[string]Held{}, local: map[string]float64{}, kinds: map[string]kindSeen{},
		rate: map[string]float64{}, budget: map[string]bool{}, wantedAt: map[string]time.Time{}, asked: map[string]asked{},
		stop: make(chan struct{}), done: make(chan struct{})}
	if r.now == nil {
		r.now = time.Now
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	r.log = r.log.With("region", opts.Region)
	r.renewals = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_lease_renewals_total",
		Help: "Renewals of the region's leases by this gateway as its renewer, by result (ok, error)."},
		[]string{"region", "result"})
	for _, result := range []string{"ok", "error"} {
		r.renewals.WithLabelValues(opts.Region, result)
	}
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{r.renewals, (*regionGauges)(r)} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("lease: region %q: register metrics: %w", opts.Region, err)
			}
		}
	}
	return r, nil
}

// Share is the part of ceiling key, of kind, this region may spend at now:
// 1 for a kind that does not hold across regions; else the lease it holds
// while it lasts, then its safe share (Spending), and the fallback before
// its first lease; of a budget, its allowance (SpendingBudget).
func (r *Region) Share(key, kind string, now time.Time) float64 {
	if !r.opts.Global(kind) {
		return 1
	}
	r.mu.RLock()
	h := r.held[key]
	r.mu.RUnlock()
	return r.spends(h, kind, now)
}

// spends is what the region spends holding h of a ceiling of kind at now.
func (r *Region) spends(h Held, kind string, now time.Time) float64 {
	if slices.Contains(BudgetKinds, kind) {
		return allowance(h, r.lease)
	}
	return spends(h, now, -r.lease.Skew, r.lease)
}

// Want records units of global ceiling key, of kind, asked for at this
// gateway: the demand its region's shares are sized by. It does no I/O;
// the next Round hands it to the region's store.
func (r *Region) Want(key, kind string, units float64) {
	if !(units > 0) || math.IsInf(units, 0) || !r.opts.Global(kind) {
		return
	}
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.local[demandField(key, kind)] += units
	r.kinds[key] = kindSeen{kind: kind, at: now}
}

// Load reads the region's leases from its store, as every Round does
// first. A gateway that has not read them spends the fallback, which the
// table does not reserve for a region holding a grant (only the grant):
// Start loads before it returns, so a gateway that starts in a region
// holding leases spends them from its first request, not the fallback
// until its first round. When the store cannot be read, the gateway
// spends the fallback until a round reads it (logged), as a region whose
// store and gateways all lost its leases does (docs/architecture.md §14).
func (r *Region) Load(ctx context.Context) {
	r.round.Lock()
	defer r.round.Unlock()
	r.refresh(ctx, r.now())
}

// Start loads the region's leases (within a quarter Interval), then runs
// Round every quarter Interval in the background until Close.
func (r *Region) Start() {
	r.startOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), r.opts.Interval/4)
		r.Load(ctx)
		cancel()
		r.mu.Lock()
		r.started = true
		r.mu.Unlock()
		go r.loop()
	})
}

// Close stops the background loop, hands on the demand not yet flushed and
// gives the renewal lock back, so another gateway of the region renews at
// its next round instead of after the lock's hold. A nil Region (no global
// ceilings) closes as a no-op.
func (r *Region) Close() {
	if r == nil {
		return
	}
	r.closeOnce.Do(func() {
		close(r.stop)
		r.mu.RLock()
		started := r.started
		r.mu.RUnlock()
		if started {
			<-r.done
		}
		r.round.Lock()
		defer r.round.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), r.opts.Interval/2)
		defer cancel()
		r.flush(ctx)
		if err := r.store.Unlock(ctx, r.opts.Holder); err != nil {
			r.log.Warn("lease: give back the renewal lock", "err", err)
		}
	})
}

func (r *Region) loop() {
	defer close(r.done)
	t := time.NewTicker(r.opts.Interval / 4)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.opts.Interval)
		r.Round(ctx)
		cancel()
	}
}

// Round is one step of the region's side, done every quarter Interval:
// read the region's leases from its store, hand on this gateway's demand
// and try for the renewal lock unless it holds it (the renewer extends
// its hold every Interval); the renewer then takes the region's demand and
// renews each lease due (renewDue). Nothing that fails here is fatal: a
// lease not renewed is spent until its expiry, then its safe share
// (Spending).
func (r *Region) Round(ctx context.Context) {
	r.round.Lock()
	defer r.round.Unlock()
	now := r.now()
	r.refresh(ctx, now)
	r.flush(ctx)
	if !r.renewer || now.Sub(r.stepped) >= r.opts.Interval {
		// The others try every round, so one takes over at its next round
		// when the renewer gives the lock back (within the hold when it
		// dies).
		ok, err := r.store.Lock(ctx, r.opts.Holder, lockTTL*r.opts.Interval)
		if err != nil {
			r.log.Warn("lease: claim the renewal lock", "err", err)
		}
		if !ok {
			if r.renewer {
				r.log.Info("lease: another gateway renews the region's leases")
			}
			r.renewer = false
			clear(r.rate)
			clear(r.budget)
			clear(r.wantedAt)
			clear(r.asked)
			return
		}
		r.stepped, r.lockUntil = now, now.Add(lockTTL*r.opts.Interval)
		if !r.renewer {
			r.takeOver(ctx, now)
			return
		}
	}
	if now.Before(r.lockUntil) {
		r.takeDemand(ctx, now)
		r.renewDue(ctx, now)
	}
}

// takeOver starts this gateway's renewals. The demand in the store piled
// up since the last renewer's last take, an unknown time ago, so it is no
// rate: taking it starts this renewer's clock, and the first renewals wait
// for a round of demand measured here (the next round, well within every
// lease's validity). Every lease held, and every key the taken demand
// names (a region's first requests come before its first renewer), is
// renewed for a validity, unless wanted again — a held lease once its kind
// is known (renewDue).
func (r *Region) takeOver(ctx context.Context, now time.Time) {
	r.renewer = true
	r.log.Info("lease: this gateway renews the region's leases", "holder", r.opts.Holder)
	units, err := r.store.TakeDemand(ctx)
	if err != nil {
		r.log.Warn("lease: take the region's demand", "err", err)
	}
	for field, u := range units {
		if key, kind := splitDemandField(field); u > 0 {
			r.wantedAt[key] = now
			r.budget[key] = slices.Contains(BudgetKinds, kind)
		}
	}
	r.takenAt = now
	r.mu.RLock()
	defer r.mu.RUnlock()
	for key := range r.held {
		r.wantedAt[key] = now
	}
}

// refresh reads the region's leases from its store; when it cannot, the
// last read stands (each lease lapses by its expiry). Of a key's lease in
// the store and the one this gateway last knew, the later-expiring stands,
// as a region takes grants: a store that lost its data (a Redis restarted
// empty) must not make the region spend the fallback, which may be more
// than the table reserves for it. It also forgets the kinds of keys
// neither wanted nor held any more.
func (r *Region) refresh(ctx context.Context, now time.Time) {
	held, err := r.store.Held(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.log.Warn("lease: read the region's leases", "err", err)
	} else {
		for key, known := range r.held {
			if stored, ok := held[key]; !ok || known.Expires.After(stored.Expires) {
				held[key] = known
			}
		}
		r.held = held
	}
	for key, k := range r.kinds {
		if now.Sub(k.at) >= r.lease.Validity && !now.Before(r.held[key].Expires) {
			delete(r.kinds, key)
		}
	}
}

// flush hands the demand seen here to the region's store; what it cannot
// hand on is kept for the next round.
func (r *Region) flush(ctx context.Context) {
	r.mu.Lock()
	units := r.local
	if len(units) == 0 {
		r.mu.Unlock()
		return
	}
	r.local = map[string]float64{}
	r.mu.Unlock()
	if err := r.store.AddDemand(ctx, units); err != nil {
		r.log.Warn("lease: hand on demand", "err", err)
		r.mu.Lock()
		for key, u := range units {
			r.local[key] += u
		}
		r.mu.Unlock()
	}
}

// takeDemand takes the region's demand and folds it into each key's rate.
// Called under round.
func (r *Region) takeDemand(ctx context.Context, now time.Time) {
	dt := now.Sub(r.takenAt).Seconds()
	if dt <= 0 {
		return // no time to make a rate of: the demand waits in the store
	}
	units, err := r.store.TakeDemand(ctx)
	if err != nil {
		r.log.Warn("lease: take the region's demand", "err", err)
		return
	}
	r.takenAt = now
	alpha := 1 - math.Exp(-dt/(demandTau*r.opts.Interval.Seconds()))
	seeded, byKey := map[string]bool{}, map[string]float64{}
	for field, u := range units {
		if !(u > 0) {
			continue
		}
		key, kind := splitDemandField(field)
		byKey[key] += u
		r.wantedAt[key] = now
		r.budget[key] = slices.Contains(BudgetKinds, kind)
	}
	for key, u := range byKey {
		if _, ok := r.rate[key]; !ok {
			r.rate[key], seeded[key] = u/dt, true // a key's first measure is its rate
		}
	}
	for key, rate := range r.rate {
		if !seeded[key] {
			r.rate[key] = rate + (byKey[key]/dt-rate)*alpha
		}
	}
}

// renewDue renews, at the authority, each lease the region wanted within
// a validity that is due, and records each grant in the region's store. A
// lease is due an Interval after its last ask (to the round: at least
// seven eighths of one), or half an Interval after it when its demand has
// moved by more than demandShift since — a shift of demand is answered
// within about a round of being measured instead of up to an interval
// later — or when its grant came back smaller than the lease it held,
// which the table reserves until the region's next ask: the region
// growing in its place gets the room a round or two sooner. Never
// sooner: an ask says the region holds the lease last recorded, and every
// gateway of the region reads the leases each round, so two asks of a key
// are at least two rounds apart. Called under round.
func (r *Region) renewDue(ctx context.Context, now time.Time) {
	for key, at := range r.wantedAt {
		if now.Sub(at) >= r.lease.Validity {
			delete(r.wantedAt, key) // wanted by no one for a validity: let it lapse
			delete(r.rate, key)
			delete(r.budget, key)
			delete(r.asked, key)
		}
	}
	r.mu.RLock()
	held := maps.Clone(r.held)
	for key, k := range r.kinds {
		if _, known := r.budget[key]; !known {
			r.budget[key] = slices.Contains(BudgetKinds, k.kind)
		}
	}
	r.mu.RUnlock()
	for _, key := range slices.Sorted(maps.Keys(r.wantedAt)) {
		budget, known := r.budget[key]
		if !known {
			// A lease held when this gateway took the renewals over, of a
			// kind no demand has named yet: renewed as a rate, a budget's
			// table the authority lost would be made a rate's, and the
			// region's allowance shrink below what it spent. Demand names
			// the kind within a round of its next use.
			continue
		}
		last, ok := r.asked[key]
		since, demand := now.Sub(last.at), r.rate[key]
		moved := math.Abs(demand-last.demand) > demandShift*max(demand, last.demand)
		early := moved || last.shrank
		if ok && since < r.opts.Interval-r.opts.Interval/8 && (!early || since < r.opts.Interval/2) {
			continue
		}
		r.asked[key] = asked{demand: demand, at: now}
		g, err := RenewAt(ctx, r.auth, key, Ask{Region: r.opts.Region, Demand: demand, Held: held[key], Budget: budget}, now, r.lease)
		if err == nil {
			r.asked[key] = asked{demand: demand, at: now, shrank: g.Share < held[key].Share}
			h := Held{Share: g.Share, Expires: g.Expires}
			if err = r.store.SetHeld(ctx, key, h); err == nil {
				r.mu.Lock()
				r.held[key] = h
				r.mu.Unlock()
			} else {
				err = fmt.Errorf("lease: record the lease of %q: %w", key, err)
			}
		}
		r.renewed(err)
	}
}

// renewed counts a renewal and logs the first failure of a run.
func (r *Region) renewed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		r.renewals.WithLabelValues(r.opts.Region, "ok").Inc()
		if r.failed {
			r.log.Info("lease: renewals succeed again")
		}
		r.failed = false
		return
	}
	r.renewals.WithLabelValues(r.opts.Region, "error").Inc()
	if !r.failed {
		r.log.Warn("lease: renewal failed: the region spends its leases until they expire, then its safe shares", "err", err)
	}
	r.failed = true
}

// regionGauges is the Region's collector of its leases now, by ceiling
// kind, over the keys this gateway wanted within a validity or whose
// lease has not expired. A kind of RegionOptions.Kinds with no such key
// reads as idle: the share a first key of it would spend (the fallback,
// or a budget's floor, before its first lease), no expiry, and 0 on the
// safe share — nothing is spent on it, so nothing pages.
type regionGauges Region

var (
	shareDesc = prometheus.NewDesc("hedgerow_lease_share",
		"The smallest share of a global ceiling the region may spend now among the ceilings of a kind: its lease, or its safe share.",
		[]string{"kind", "region"}, nil)
	leaseExpiryDesc = prometheus.NewDesc("hedgerow_lease_expiry_seconds",
		"Seconds until the soonest of the region's leases of a ceiling kind expires (0: one has, or was never granted).",
		[]string{"kind", "region"}, nil)
	fallbackDesc = prometheus.NewDesc("hedgerow_lease_fallback",
		"1 while the region spends its safe share of some ceiling of a kind (no live lease), else 0.",
		[]string{"kind", "region"}, nil)
)

func (g *regionGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- shareDesc
	ch <- leaseExpiryDesc
	ch <- fallbackDesc
}

func (g *regionGauges) Collect(ch chan<- prometheus.Metric) {
	r := (*Region)(g)
	now := r.now()
	type agg struct{ share, expiry, fallback float64 }
	kinds := map[string]*agg{}
	r.mu.RLock()
	for key, k := range r.kinds {
		h := r.held[key]
		share := r.spends(h, k.kind, now)
		expiry := max(0, h.Expires.Sub(now).Seconds())
		onSafe := 0.0
		// A budget's allowance does not lapse: only one never granted is
		// its floor, the safe share's like.
		lapsed := !now.Before(h.Expires.Add(-r.lease.Skew)) && !slices.Contains(BudgetKinds, k.kind)
		if h == (Held{}) || lapsed {
			onSafe = 1
		}
		a := kinds[k.kind]
		if a == nil {
			kinds[k.kind] = &agg{share, expiry, onSafe}
			continue
		}
		a.share, a.expiry, a.fallback = min(a.share, share), min(a.expiry, expiry), max(a.fallback, onSafe)
	}
	r.mu.RUnlock()
	for _, kind := range r.opts.Kinds {
		if kinds[kind] == nil {
			kinds[kind] = &agg{share: r.spends(Held{}, kind, now)}
		}
	}
	for kind, a := range kinds {
		ch <- prometheus.MustNewConstMetric(shareDesc, prometheus.GaugeValue, a.share, kind, r.opts.Region)
		ch <- prometheus.MustNewConstMetric(leaseExpiryDesc, prometheus.GaugeValue, a.expiry, kind, r.opts.Region)
		ch <- prometheus.MustNewConstMetric(fallbackDesc, prometheus.GaugeValue, a.fallback, kind, r.opts.Region)
	}
}
