package simulator

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hedgerow/hedgerow/budgets/lease"
)

// Defaults of RegionsOptions (issue 29).
const (
	// DefaultRebalanceInterval is how often a region renews its leases:
	// issue 29's default rebalance_interval.
	DefaultRebalanceInterval = 2 * time.Second
	// DefaultRegionsOverload is the total arrival rate as a multiple of
	// each ceiling, so that every ceiling binds.
	DefaultRegionsOverload = 1.5
	// DefaultRegionsBurst is how much of its rate a region's admission
	// bucket holds: a fifth of a second, so that the buckets together hold
	// at most 0.2 s of the ceiling and no 10 s window can pass the ceiling
	// by more than 2 % while the shares spent sum to at most 1. (With a
	// second, a window may pass it by up to 10 %, whatever the leases do.)
	DefaultRegionsBurst = 200 * time.Millisecond
	// DefaultPartition is how long one region is cut off from the authority.
	DefaultPartition = 60 * time.Second
)

// MinRegionsRun is the shortest run the regions scenario fits in: a start
// the tables learn through, the shift, the partition and the convergence
// after it, and the authority's loss.
const MinRegionsRun = 240 * time.Second

// Fixed parts of the regions model.
const (
	// regionsWindow is the width of the windows global use is taken over.
	regionsWindow = 10 * time.Second
	// fairEnough is the part of its demand-fair share a region must hold
	// for the shares to count as rebalanced (converged).
	fairEnough = 0.9
	// renewJitter is the seeded jitter of each renewal interval, ± this
	// part of it.
	renewJitter = 0.1
	// minReply and maxReply bound a renewal's round trip to the authority,
	// drawn uniformly: the region spends its old lease until the reply.
	minReply, maxReply = 50 * time.Millisecond, 150 * time.Millisecond
	// demandTimeConstant is the time constant of a region's estimate of
	// its demand, an exponentially weighted rate of its arrivals: half the
	// default rebalance interval.
	demandTimeConstant = time.Second
	// shareSample is how often the shares the regions spend are sampled
	// for the report.
	shareSample = time.Second
)

// A regionsCeiling is one global ceiling of the model: a rate in
// requests per second that every region's admissions count against.
type regionsCeiling struct {
	name  string  // the authority's key
	about string  // what it bounds, for the table
	limit float64 // units (requests) per second
}

// regionsCeilings are the model's global ceilings: a tenant's request rate
// and a route's requests per minute, with different limits.
var regionsCeilings = []regionsCeiling{
	{name: "tenant:acme:rate", about: "tenant acme, 200 requests/s", limit: 200},
	{name: "route:gpt4o:rpm", about: "route gpt4o, 6,000 requests/min", limit: 100},
}

// RegionsOptions selects one regions simulation (issue 29): global
// ceilings split into regional leases by the production lease code
// (budgets/lease) over an in-memory authority, on virtual time.
type RegionsOptions struct {
	// Regions is how many regions share the ceilings, at least 2.
	Regions int
	// Requests is how many requests arrive in all, over every ceiling; it
	// sets the run's length (at least MinRegionsRun).
	Requests int
	// Seed seeds the arrivals, the clocks, the skew and the renewals.
	Seed uint64
	// Rebalance is the renewal interval (default DefaultRebalanceInterval).
	Rebalance time.Duration
	// Validity and Skew are the leases' (lease.Options; zero: its defaults).
	Validity, Skew time.Duration
	// Overload is the arrival rate as a multiple of each ceiling (default
	// DefaultRegionsOverload).
	Overload float64
	// Burst is how much of its rate a region's admission bucket holds at
	// most (default DefaultRegionsBurst).
	Burst time.Duration
	// Partition is how long one region is cut off (default DefaultPartition).
	Partition time.Duration
	// KeepAuthority keeps the authority's state for the whole run; by
	// default it is lost once (lease.Memory.Forget), at 80 % of the run.
	KeepAuthority bool
	// LateRelease makes a region whose grant came back smaller than the
	// lease it held wait for its next interval to say so. By default it
	// renews again at once: the table reserves what a region held until
	// the region says it holds less, so a shrinking region otherwise
	// holds its old share back from the growing ones an interval longer.
	LateRelease bool
}

// RegionsScenario is when things happen in a run, in seconds of true time
// from its start, and the demand skew before and after the shift.
type RegionsScenario struct {
	// DemandBefore and DemandAfter are each region's part of the arrivals,
	// by region, before and after the shift.
	DemandBefore []float64 `json:"demand_before"`
	DemandAfter  []float64 `json:"demand_after"`
	ShiftS       float64   `json:"shift_s"`
	// CutOff is the region cut off from the authority from PartitionS to
	// HealS: the one with the most demand after the shift.
	CutOff     string  `json:"cut_off"`
	PartitionS float64 `json:"partition_s"`
	HealS      float64 `json:"heal_s"`
	// ForgetS is when the authority loses its tables (absent: never).
	ForgetS *float64 `json:"forget_s,omitempty"`
}

// RegionResult is one region's admissions under one ceiling.
type RegionResult struct {
	Name string `json:"name"`
	// ClockOffsetMs is how far the region's clock is from true time.
	ClockOffsetMs float64 `json:"clock_offset_ms"`
	Arrived       int     `json:"arrived"`
	Admitted      int     `json:"admitted"`
	Refused       int     `json:"refused"`
	RefusedShare  float64 `json:"refused_share"`
}

// CutOffResult is what the cut-off region spent of one ceiling once its
// lease had run out, until the partition healed.
type CutOffResult struct {
	Region string `json:"region"`
	// LeaseEndS is when it stopped spending its lease (Skew before the
	// lease's expiry by its own clock), in seconds of true time; absent if
	// the partition healed first.
	LeaseEndS *float64 `json:"lease_end_s,omitempty"`
	// SafeShare is the most it may spend then: the smaller of its last
	// share and the fallback (lease.Spending).
	SafeShare float64 `json:"safe_share"`
	// MaxShare is the largest share it spent from LeaseEndS to the heal.
	MaxShare float64 `json:"max_share"`
	// Admitted is how many requests it admitted then; AdmittedShare their
	// rate as a part of the ceiling.
	Admitted      int     `json:"admitted"`
	AdmittedShare float64 `json:"admitted_share"`
}

// WindowUse is the global admitted rate over one 10 s window, as a part
// of the ceiling.
type WindowUse struct {
	StartS float64 `json:"start_s"`
	Use    float64 `json:"use"`
}

// ShareSample is what every region spends of a ceiling at one instant (by
// region, as parts of the ceiling), and its demand-fair share then.
type ShareSample struct {
	AtS    float64   `json:"at_s"`
	Shares []float64 `json:"shares"`
	Fair   []float64 `json:"fair"`
}

// CeilingResult is one global ceiling's figures over a regions run.
type CeilingResult struct {
	Name        string  `json:"name"`
	About       string  `json:"about"`
	Limit       float64 `json:"limit_per_s"`
	ArrivalRate float64 `json:"arrival_rate_per_s"`
	// MaxWindowUse is the worst full 10 s window's admitted rate as a part
	// of the limit: what must stay at most 1 (+ the token buckets' bursts).
	MaxWindowUse float64 `json:"max_window_use"`
	// MaxSpentShare is the largest sum, at any instant, of the shares the
	// regions spent by their own clocks: what the leases bound by 1.
	MaxSpentShare float64 `json:"max_spent_share"`
	// RebalanceS is the time from the shift until every region has held
	// at least 90 % of its demand-fair share, each at its first such
	// instant (null: not before the partition); ConvergeS the same from
	// the partition's heal (null: not before the authority's loss).
	RebalanceS *float64 `json:"rebalance_s"`
	ConvergeS  *float64 `json:"converge_s"`
	// Regions are the regions' admissions, in the order of Regions.
	Regions []RegionResult `json:"regions"`
	CutOff  CutOffResult   `json:"cut_off"`
	Windows []WindowUse    `json:"windows"`
	Shares  []ShareSample  `json:"shares"`
}

// RegionsReport is the outcome of a regions simulation; its JSON form is
// what `hedgerow simulate --regions N --json` prints.
type RegionsReport struct {
	Regions            []string        `json:"regions"`
	Requests           int             `json:"requests"`
	Seed               uint64          `json:"seed"`
	DurationS          float64         `json:"duration_s"`
	RebalanceIntervalS float64         `json:"rebalance_interval_s"`
	ValidityS          float64         `json:"validity_s"`
	SkewS              float64         `json:"skew_s"`
	FallbackShare      float64         `json:"fallback_share"`
	FloorShare         float64         `json:"floor_share"`
	Scenario           RegionsScenario `json:"scenario"`
	Ceilings           []CeilingResult `json:"ceilings"`
}

// Kinds of the regions model's events.
const (
	evArrival = iota
	evRenew
	evReply
	evLeaseEnd
	evShift
	evPartition
	evHeal
	evForget
	evSample
)

// regionsEvent is one scheduled happening of a regions run.
type regionsEvent struct {
	at      time.Duration
	seq     uint64
	kind    int
	region  int
	ceiling int
	grant   lease.Grant // evReply
	gen     uint64      // evLeaseEnd: the grant it ends (stale when another came)
}

type regionsQueue []regionsEvent

func (q regionsQueue) Len() int { return len(q) }
func (q regionsQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q regionsQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *regionsQueue) Push(x any)   { *q = append(*q, x.(regionsEvent)) }
func (q *regionsQueue) Pop() any {
	old := *q
	ev := old[len(old)-1]
	*q = old[:len(old)-1]
	return ev
}

// bucket is one region's local admission of one ceiling: a token bucket
// refilled at the share it spends × the limit, holding at most burst
// seconds of that rate (fewer tokens at once when the share shrinks).
type bucket struct {
	share, tokens float64
	burst         float64 // seconds of the rate it holds at most
	last          time.Duration
}

// advance refills the bucket up to now at its current rate.
func (b *bucket) advance(now time.Duration, limit float64) {
	rate := b.share * limit
	b.tokens = min(rate*b.burst, b.tokens+rate*(now-b.last).Seconds())
	b.last = now
}

// regionLease is one region's state of one ceiling.
type regionLease struct {
	held   lease.Held
	gen    uint64 // counts the grants that reached the region
	bucket bucket
	demand float64 // what it asked at its last renewal, units/s
	// reached is when the region last first spent fairEnough of its
	// demand-fair share (after the shift, after the heal); −1: never.
	reached time.Duration
	rate    rateEstimate
	// asking is set while a renewal is in flight: a region asks once at a
	// time, for the table records one lease held per region, and a second
	// ask would replace the record of the grant the first brings back.
	asking bool
	res    RegionResult
	// The cut-off region's spending after its lease ran out.
	afterEnd bool
	leaseEnd time.Duration
	safe     float64
	maxAfter float64
	admitted int
}

// regionsRun is one regions simulation in progress.
type regionsRun struct {
	o       RegionsOptions
	lo      lease.Options // with the regions named; zero fields: lease defaults
	auth    *lease.Memory
	rng     *rand.Rand
	queue   regionsQueue
	seq     uint64
	now     time.Duration
	offsets []time.Duration
	skew    []float64 // the arrivals' current split, by region
	before  []float64
	after   []float64
	shifted bool
	cut     int // the region cut off (−1 before the scenario picks it)
	cutOff  bool
	healed  bool
	forgot  bool
	leases  [][]*regionLease // by ceiling, by region
	// Per ceiling: spending shares' largest sum, the windows' admissions,
	// when the shares rebalanced and converged, the samples.
	maxSum    []float64
	windows   []map[int64]int
	rebalance []*float64
	converge  []*float64
	samples   [][]ShareSample
	shiftAt   time.Duration
	healAt    time.Duration
	lastArr   time.Duration
}

// SimulateRegions runs the regions scenario: every ceiling of the model
// shared by o.Regions regions through leases, demand skewed then shifted,
// one region cut off for o.Partition, the authority's state lost once.
func SimulateRegions(o RegionsOptions) (*RegionsReport, error) {
	if o.Regions < 2 {
		return nil, fmt.Errorf("%w: regions must be at least 2, got %d", ErrInvalidOptions, o.Regions)
	}
	if o.Rebalance == 0 {
		o.Rebalance = DefaultRebalanceInterval
	}
	if o.Overload == 0 {
		o.Overload = DefaultRegionsOverload
	}
	if o.Validity == 0 {
		o.Validity = lease.DefaultValidity
	}
	if o.Skew == 0 {
		o.Skew = lease.DefaultSkew
	}
	if o.Burst == 0 {
		o.Burst = DefaultRegionsBurst
	}
	if o.Partition == 0 {
		o.Partition = DefaultPartition
	}
	if o.Rebalance < 0 || o.Overload < 0 || o.Burst < 0 || o.Partition < 0 {
		return nil, fmt.Errorf("%w: rebalance interval %v, overload %v, burst %v and partition %v must be > 0",
			ErrInvalidOptions, o.Rebalance, o.Overload, o.Burst, o.Partition)
	}
	rate := 0.0 // arrivals per second over every ceiling
	for _, c := range regionsCeilings {
		rate += c.limit * o.Overload
	}
	duration := time.Duration(float64(o.Requests) / rate * float64(time.Second))
	if duration < MinRegionsRun {
		return nil, fmt.Errorf("%w: %d requests at %.0f/s last %v; the regions scenario needs %v: at least %d requests",
			ErrInvalidOptions, o.Requests, rate, duration.Round(time.Second), MinRegionsRun, int(math.Ceil(MinRegionsRun.Seconds()*rate)))
	}
	r := &regionsRun{o: o, auth: lease.NewMemory(), rng: rand.New(rand.NewPCG(o.Seed, 0x29_1ea5e)), cut: -1}
	r.lo = lease.Options{Validity: o.Validity, Skew: o.Skew}
	for i := range o.Regions {
		r.lo.Regions = append(r.lo.Regions, "region-"+strconv.Itoa(i))
	}
	// The lease's own checks of its options (validity past twice the skew).
	if _, err := lease.Spending(lease.Held{}, epoch, r.lo); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	for range o.Regions {
		r.offsets = append(r.offsets, time.Duration((r.rng.Float64()-0.5)*float64(o.Skew)))
	}
	r.before, r.after = demandSkew(o.Regions, r.rng)
	r.skew = r.before
	r.leases = make([][]*regionLease, len(regionsCeilings))
	for c := range regionsCeilings {
		for i := range o.Regions {
			r.leases[c] = append(r.leases[c], &regionLease{reached: -1, bucket: bucket{burst: o.Burst.Seconds()}, res: RegionResult{Name: r.lo.Regions[i],
				ClockOffsetMs: float64(r.offsets[i]) / float64(time.Millisecond)}})
		}
		r.windows = append(r.windows, map[int64]int{})
	}
	r.maxSum = make([]float64, len(regionsCeilings))
	r.rebalance = make([]*float64, len(regionsCeilings))
	r.converge = make([]*float64, len(regionsCeilings))
	r.samples = make([][]ShareSample, len(regionsCeilings))
	for c := range regionsCeilings {
		for i := range o.Regions {
			if err := r.respend(c, i); err != nil {
				return nil, err
			}
		}
	}

	// The scenario, on whole seconds: the shift at a quarter of the run,
	// the partition from 45 %, the authority's loss at 80 %.
	r.shiftAt = (duration / 4).Truncate(time.Second)
	partition := (duration * 45 / 100).Truncate(time.Second)
	r.healAt = partition + o.Partition
	forget := (duration * 80 / 100).Truncate(time.Second)
	if r.healAt+2*o.Validity > forget {
		return nil, fmt.Errorf("%w: a partition of %v from %v leaves no time to converge before %v: more requests or a shorter partition",
			ErrInvalidOptions, o.Partition, partition, forget)
	}
	r.push(regionsEvent{at: r.shiftAt, kind: evShift})
	r.push(regionsEvent{at: partition, kind: evPartition})
	r.push(regionsEvent{at: r.healAt, kind: evHeal})
	if !o.KeepAuthority {
		r.push(regionsEvent{at: forget, kind: evForget})
	}
	r.push(regionsEvent{at: 0, kind: evSample})
	for i := range o.Regions {
		r.push(regionsEvent{at: time.Duration(r.rng.Float64() * float64(o.Rebalance)), kind: evRenew, region: i})
	}
	// Each ceiling's Poisson arrivals, one ahead; pending counts those
	// still to be drawn, the run ends with the last.
	pending, queued := o.Requests, 0
	for c, ceil := range regionsCeilings {
		if pending > 0 {
			pending--
			queued++
			r.push(regionsEvent{at: r.exp(ceil.limit * o.Overload), kind: evArrival, ceiling: c})
		}
	}
	for queued > 0 {
		ev := heap.Pop(&r.queue).(regionsEvent)
		r.now = ev.at
		if ev.kind == evArrival {
			queued--
			r.arrive(ev.ceiling)
			r.lastArr = r.now
			if pending > 0 {
				pending--
				queued++
				r.push(regionsEvent{at: r.exp(regionsCeilings[ev.ceiling].limit * o.Overload), kind: evArrival, ceiling: ev.ceiling})
			}
			continue
		}
		if err := r.handle(ev); err != nil {
			return nil, err
		}
	}
	return r.report(duration, partition, forget)
}

// demandSkew is each region's part of the arrivals before and after the
// shift: weights 4^(−k/(n−1)) for k = 0 … n−1 (80/20 for two regions) in a
// seeded order, and after the shift the same weights reversed, so the
// busiest region becomes the quietest.
func demandSkew(n int, rng *rand.Rand) (before, after []float64) {
	w := make([]float64, n)
	sum := 0.0
	for k := range n {
		w[k] = math.Pow(4, -float64(k)/float64(n-1))
		sum += w[k]
	}
	order := rng.Perm(n)
	before, after = make([]float64, n), make([]float64, n)
	for i, k := range order {
		before[i] = w[k] / sum
		after[i] = w[n-1-k] / sum
	}
	return before, after
}

func (r *regionsRun) push(ev regionsEvent) {
	r.seq++
	ev.seq = r.seq
	heap.Push(&r.queue, ev)
}

// exp draws the gap to the next arrival of a Poisson stream at rate per
// second, from now.
func (r *regionsRun) exp(rate float64) time.Duration {
	return r.now + time.Duration(r.rng.ExpFloat64()/rate*float64(time.Second))
}

// local is region i's clock at true time now.
func (r *regionsRun) local(i int) time.Time { return epoch.Add(r.now + r.offsets[i]) }

// handle is every event but an arrival.
func (r *regionsRun) handle(ev regionsEvent) error {
	switch ev.kind {
	case evRenew:
		gap := time.Duration(float64(r.o.Rebalance) * (1 + renewJitter*(2*r.rng.Float64()-1)))
		r.push(regionsEvent{at: r.now + gap, kind: evRenew, region: ev.region})
		if r.cutOff && ev.region == r.cut {
			return nil // it cannot reach the authority
		}
		for c := range regionsCeilings {
			if err := r.renew(c, ev.region); err != nil {
				return err
			}
		}
	case evReply:
		l := r.leases[ev.ceiling][ev.region]
		l.asking = false
		shrunk := ev.grant.Share < l.held.Share
		l.held = lease.Held{Share: ev.grant.Share, Expires: ev.grant.Expires}
		if shrunk && !r.o.LateRelease && !(r.cutOff && ev.region == r.cut) {
			if err := r.renew(ev.ceiling, ev.region); err != nil {
				return err
			}
		}
		l.gen++
		// It stops spending the lease Skew before its expiry by its own clock.
		end := ev.grant.Expires.Add(-r.o.Skew).Sub(epoch) - r.offsets[ev.region]
		r.push(regionsEvent{at: max(end, r.now), kind: evLeaseEnd, region: ev.region, ceiling: ev.ceiling, gen: l.gen})
		return r.respend(ev.ceiling, ev.region)
	case evLeaseEnd:
		l := r.leases[ev.ceiling][ev.region]
		if ev.gen != l.gen {
			return nil // a later grant reached the region first
		}
		if ev.region == r.cut && r.cutOff && !l.afterEnd {
			l.afterEnd, l.leaseEnd = true, r.now
			l.safe = min(l.held.Share, 1/float64(len(r.lo.Regions)))
		}
		return r.respend(ev.ceiling, ev.region)
	case evShift:
		r.skew, r.shifted = r.after, true
		for c := range regionsCeilings {
			r.checkFair(c)
		}
	case evPartition:
		r.cut, r.cutOff = slices.Index(r.after, slices.Max(r.after)), true
		for c := range regionsCeilings {
			r.leases[c][r.cut].admitted = 0
		}
	case evHeal:
		r.cutOff, r.healed = false, true
		for c := range regionsCeilings {
			r.checkFair(c)
		}
	case evForget:
		r.auth.Forget()
		r.forgot = true
	case evSample:
		for c := range regionsCeilings {
			r.sample(c)
		}
		r.push(regionsEvent{at: r.now + shareSample, kind: evSample})
	}
	return nil
}

// arrive is one request at ceiling c, in a region drawn by the current
// skew: admitted if the region's bucket holds a token.
func (r *regionsRun) arrive(c int) {
	x, i := r.rng.Float64(), 0
	for ; i < len(r.skew)-1 && x >= r.skew[i]; i++ {
		x -= r.skew[i]
	}
	l := r.leases[c][i]
	l.rate.arrive(r.now)
	l.res.Arrived++
	l.bucket.advance(r.now, regionsCeilings[c].limit)
	if l.bucket.tokens < 1 {
		l.res.Refused++
		return
	}
	l.bucket.tokens--
	l.res.Admitted++
	r.windows[c][int64(r.now/regionsWindow)]++
	if i == r.cut && r.cutOff && l.afterEnd {
		l.admitted++
	}
}

// renew is region i's renewal of ceiling c, unless one is in flight: its
// demand (an exponentially weighted rate of its arrivals, time constant
// demandTimeConstant) and the lease it spends, through lease.RenewAt; the
// reply reaches it after a round trip.
func (r *regionsRun) renew(c, i int) error {
	l := r.leases[c][i]
	if l.asking {
		return nil // its last renewal is still in flight
	}
	l.asking = true
	l.demand = l.rate.at(r.now)
	g, err := lease.RenewAt(context.Background(), r.auth, regionsCeilings[c].name,
		lease.Ask{Region: r.lo.Regions[i], Demand: l.demand, Held: l.held}, r.local(i), r.lo)
	if err != nil {
		return fmt.Errorf("regions: %s renews %s: %w", r.lo.Regions[i], regionsCeilings[c].name, err)
	}
	rtt := minReply + time.Duration(r.rng.Float64()*float64(maxReply-minReply))
	r.push(regionsEvent{at: r.now + rtt, kind: evReply, region: i, ceiling: c, grant: g})
	return nil
}

// respend sets region i's bucket of ceiling c to the share it spends now by
// its own clock (lease.Spending), and checks the global figures.
func (r *regionsRun) respend(c, i int) error {
	l := r.leases[c][i]
	share, err := lease.Spending(l.held, r.local(i), r.lo)
	if err != nil {
		return fmt.Errorf("regions: %s spends %s: %w", r.lo.Regions[i], regionsCeilings[c].name, err)
	}
	limit := regionsCeilings[c].limit
	l.bucket.advance(r.now, limit)
	l.bucket.share = share
	l.bucket.tokens = min(l.bucket.tokens, share*limit*l.bucket.burst)
	if l.afterEnd && r.cutOff {
		l.maxAfter = max(l.maxAfter, share)
	}
	sum := 0.0
	for _, o := range r.leases[c] {
		sum += o.bucket.share
	}
	r.maxSum[c] = max(r.maxSum[c], sum)
	r.checkFair(c)
	return nil
}

// fair is region i's demand-fair share of the current skew: the floor plus
// its part of what the floors leave.
func (r *regionsRun) fair(i int) float64 {
	floor := r.floor()
	return floor + (1-float64(len(r.skew))*floor)*r.skew[i]
}

func (r *regionsRun) floor() float64 {
	fallback := r.lo.Fallback
	if fallback == 0 {
		fallback = 1 / float64(len(r.lo.Regions))
	}
	if r.lo.Floor != 0 {
		return r.lo.Floor
	}
	return fallback * lease.DefaultFloorOfFallback
}

// checkFair records, after the shift and after the heal, when every
// region has first spent at least fairEnough of its demand-fair share:
// each region's first such instant, the latest of them.
func (r *regionsRun) checkFair(c int) {
	var slot **float64
	var since time.Duration
	switch {
	case r.healed && !r.forgot:
		slot, since = &r.converge[c], r.healAt
	case r.shifted && !r.cutOff && !r.healed:
		slot, since = &r.rebalance[c], r.shiftAt
	default:
		return
	}
	if *slot != nil {
		return
	}
	done := true
	for i, l := range r.leases[c] {
		if l.reached < since && l.bucket.share >= fairEnough*r.fair(i) {
			l.reached = r.now
		}
		done = done && l.reached >= since
	}
	if done {
		s := (r.now - since).Seconds()
		*slot = &s
	}
}

func (r *regionsRun) sample(c int) {
	s := ShareSample{AtS: r.now.Seconds()}
	for i, l := range r.leases[c] {
		s.Shares = append(s.Shares, l.bucket.share)
		s.Fair = append(s.Fair, r.fair(i))
	}
	r.samples[c] = append(r.samples[c], s)
}

func (r *regionsRun) report(duration, partition, forget time.Duration) (*RegionsReport, error) {
	fallback := 1 / float64(len(r.lo.Regions))
	rep := &RegionsReport{
		Regions:            r.lo.Regions,
		Requests:           r.o.Requests,
		Seed:               r.o.Seed,
		DurationS:          r.lastArr.Seconds(),
		RebalanceIntervalS: r.o.Rebalance.Seconds(),
		ValidityS:          r.o.Validity.Seconds(),
		SkewS:              r.o.Skew.Seconds(),
		FallbackShare:      fallback,
		FloorShare:         r.floor(),
		Scenario: RegionsScenario{
			DemandBefore: r.before,
			DemandAfter:  r.after,
			ShiftS:       r.shiftAt.Seconds(),
			CutOff:       r.lo.Regions[r.cut],
			PartitionS:   partition.Seconds(),
			HealS:        r.healAt.Seconds(),
		},
	}
	if !r.o.KeepAuthority {
		f := forget.Seconds()
		rep.Scenario.ForgetS = &f
	}
	last := int64(r.lastArr / regionsWindow) // the last window is cut short
	for c, ceil := range regionsCeilings {
		res := CeilingResult{Name: ceil.name, About: ceil.about, Limit: ceil.limit, ArrivalRate: ceil.limit * r.o.Overload,
			MaxSpentShare: r.maxSum[c], RebalanceS: r.rebalance[c], ConvergeS: r.converge[c], Shares: r.samples[c]}
		for w := range last {
			use := float64(r.windows[c][w]) / (ceil.limit * regionsWindow.Seconds())
			res.Windows = append(res.Windows, WindowUse{StartS: (time.Duration(w) * regionsWindow).Seconds(), Use: use})
			res.MaxWindowUse = max(res.MaxWindowUse, use)
		}
		for _, l := range r.leases[c] {
			l.res.RefusedShare = 0
			if l.res.Arrived > 0 {
				l.res.RefusedShare = float64(l.res.Refused) / float64(l.res.Arrived)
			}
			res.Regions = append(res.Regions, l.res)
		}
		cut := r.leases[c][r.cut]
		res.CutOff = CutOffResult{Region: r.lo.Regions[r.cut], SafeShare: cut.safe, MaxShare: cut.maxAfter}
		if cut.afterEnd {
			end := cut.leaseEnd.Seconds()
			res.CutOff.LeaseEndS = &end
			res.CutOff.Admitted = cut.admitted
			res.CutOff.AdmittedShare = float64(cut.admitted) / (ceil.limit * (r.healAt - cut.leaseEnd).Seconds())
		}
		rep.Ceilings = append(rep.Ceilings, res)
	}
	return rep, nil
}

// maxTimelineRows bounds the rows of each ceiling's timeline in the table:
// longer runs put several 10 s windows in a row.
const maxTimelineRows = 24

// WriteTable prints, per ceiling, the headline figures, the regions'
// admissions and a timeline of global use and the shares spent.
func (rep *RegionsReport) WriteTable(w io.Writer) error {
	sc := rep.Scenario
	fmt.Fprintf(w, "%d regions, %d requests, seed %d, %.0f s; leases valid %.0f s, skew %.0f s, renewed every %.0f s (± 10 %%); safe share %.3f, floor %.3f\n",
		len(rep.Regions), rep.Requests, rep.Seed, rep.DurationS, rep.ValidityS, rep.SkewS, rep.RebalanceIntervalS, rep.FallbackShare, rep.FloorShare)
	fmt.Fprintf(w, "demand %s shifts to %s at %.0f s; %s cut off from the authority %.0f–%.0f s",
		percents(sc.DemandBefore), percents(sc.DemandAfter), sc.ShiftS, sc.CutOff, sc.PartitionS, sc.HealS)
	if sc.ForgetS != nil {
		fmt.Fprintf(w, "; the authority loses its tables at %.0f s", *sc.ForgetS)
	}
	fmt.Fprintln(w)
	for _, c := range rep.Ceilings {
		fmt.Fprintf(w, "\n%s (%s), %.0f arrivals/s\n", c.Name, c.About, c.ArrivalRate)
		fmt.Fprintf(w, "  worst 10 s window: %.4f of the limit; largest sum of the shares spent: %.4f\n", c.MaxWindowUse, c.MaxSpentShare)
		fmt.Fprintf(w, "  rebalanced after the shift (every region ≥ 90 %% of its demand-fair share): %s\n", seconds(c.RebalanceS, rep.RebalanceIntervalS))
		fmt.Fprintf(w, "  converged after the partition healed: %s\n", seconds(c.ConvergeS, rep.RebalanceIntervalS))
		co := c.CutOff
		if co.LeaseEndS != nil {
			fmt.Fprintf(w, "  %s cut off: its lease ran out at %.1f s; then it spent at most %.4f (safe share %.4f), admitted %d = %.4f of the limit\n",
				co.Region, *co.LeaseEndS, co.MaxShare, co.SafeShare, co.Admitted, co.AdmittedShare)
		} else {
			fmt.Fprintf(w, "  %s cut off: the partition healed before its lease ran out\n", co.Region)
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "  region\tclock ms\tarrived\tadmitted\trefused\trefused share\t")
		for _, r := range c.Regions {
			fmt.Fprintf(tw, "  %s\t%+.0f\t%d\t%d\t%d\t%.4f\t\n", r.Name, r.ClockOffsetMs, r.Arrived, r.Admitted, r.Refused, r.RefusedShare)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if err := rep.writeTimeline(w, c); err != nil {
			return err
		}
	}
	return nil
}

// writeTimeline prints a ceiling's global use (the worst 10 s window of
// each row) and the shares spent at each row's end, with the scenario's
// events marked.
func (rep *RegionsReport) writeTimeline(w io.Writer, c CeilingResult) error {
	per := max(1, (len(c.Windows)+maxTimelineRows-1)/maxTimelineRows)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "  from s\tto s\tuse\t")
	for _, name := range rep.Regions {
		fmt.Fprintf(tw, "%s\t", name)
	}
	fmt.Fprintln(tw, "\t")
	for first := 0; first < len(c.Windows); first += per {
		rows := c.Windows[first:min(first+per, len(c.Windows))]
		from, to := rows[0].StartS, rows[len(rows)-1].StartS+regionsWindow.Seconds()
		use := 0.0
		for _, win := range rows {
			use = max(use, win.Use)
		}
		fmt.Fprintf(tw, "  %.0f\t%.0f\t%.3f\t", from, to, use)
		// The sample at the row's end, or the last before it.
		i, _ := slices.BinarySearchFunc(c.Shares, to, func(s ShareSample, t float64) int {
			return cmp.Compare(s.AtS, t)
		})
		if i == len(c.Shares) || c.Shares[i].AtS > to {
			i--
		}
		for _, s := range c.Shares[max(i, 0)].Shares {
			fmt.Fprintf(tw, "%.3f\t", s)
		}
		fmt.Fprintf(tw, "%s\t\n", rep.events(from, to))
	}
	return tw.Flush()
}

// events names the scenario's events in [from, to).
func (rep *RegionsReport) events(from, to float64) string {
	sc := rep.Scenario
	var out []string
	mark := func(at float64, what string) {
		if at >= from && at < to {
			out = append(out, what)
		}
	}
	mark(sc.ShiftS, "shift")
	mark(sc.PartitionS, sc.CutOff+" cut off")
	mark(sc.HealS, "healed")
	if sc.ForgetS != nil {
		mark(*sc.ForgetS, "authority lost")
	}
	return strings.Join(out, ", ")
}

// percents writes shares as whole percents joined by slashes: 80/20.
func percents(shares []float64) string {
	parts := make([]string, len(shares))
	for i, s := range shares {
		parts[i] = strconv.FormatFloat(100*s, 'f', 0, 64)
	}
	return strings.Join(parts, "/")
}

// seconds writes a time to rebalance with its rebalance intervals.
func seconds(s *float64, interval float64) string {
	if s == nil {
		return "not reached"
	}
	return fmt.Sprintf("%.1f s (%.1f rebalance intervals)", *s, *s/interval)
}

// rateEstimate is an exponentially weighted estimate of a Poisson
// stream's rate, time constant demandTau: each arrival adds 1/τ, and the
// sum decays by e^(−t/τ).
type rateEstimate struct {
	v    float64
	last time.Duration
}

func (e *rateEstimate) at(now time.Duration) float64 {
	return e.v * math.Exp(-(now-e.last).Seconds()/demandTimeConstant.Seconds())
}

func (e *rateEstimate) arrive(now time.Duration) {
	e.v = e.at(now) + 1/demandTimeConstant.Seconds()
	e.last = now
}
