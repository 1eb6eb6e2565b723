package simulator

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
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
	// issue 29's default rebalance_interval (lease.DefaultInterval).
	DefaultRebalanceInterval = lease.DefaultInterval
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
	// gatewaysPerRegion is how many gateways each region runs, each with
	// its lease.Region on the region's store: two, so that one holds the
	// renewal lock and the other tries for it every round, hands on its
	// demand and reads the leases the renewer recorded.
	gatewaysPerRegion = 2
	// roundJitter is the seeded jitter of each gateway's gap between
	// rounds (a quarter of the rebalance interval), ± this part of it.
	roundJitter = 0.1
	// minRTT and maxRTT bound one call's round trip to the authority,
	// drawn uniformly per call: a read sees the table, a write applies,
	// halfway. A renewal is a read and a write (and again on a conflict).
	minRTT, maxRTT = 50 * time.Millisecond, 150 * time.Millisecond
	// lostReplies is the part of the writes whose reply is lost: the
	// table changed, the renewer hears an error and keeps its old lease.
	lostReplies = 0.02
	// shareSample is how often the shares the regions spend are sampled
	// for the report.
	shareSample = time.Second
)

// A regionsCeiling is one global ceiling of the model: a rate in
// requests per second that every region's admissions count against.
type regionsCeiling struct {
	name  string  // the authority's key
	kind  string  // its ceiling kind (lease.CeilingKinds)
	about string  // what it bounds, for the table
	limit float64 // units (requests) per second
}

// regionsCeilings are the model's global ceilings: a tenant's request rate
// and a route's requests per minute, with different limits.
var regionsCeilings = []regionsCeiling{
	{name: "tenant:acme:rate", kind: "tenant_rate", about: "tenant acme, 200 requests/s", limit: 200},
	{name: "route:gpt4o:rpm", kind: "route_requests", about: "route gpt4o, 6,000 requests/min", limit: 100},
}

// RegionsOptions selects one regions simulation (issue 29): global
// ceilings split into regional leases by the production lease code — each
// gateway's lease.Region, the authority a lease.Memory — on virtual time.
type RegionsOptions struct {
	// Regions is how many regions share the ceilings, at least 2.
	Regions int
	// Requests is how many requests arrive in all, over every ceiling; it
	// sets the run's length (at least MinRegionsRun).
	Requests int
	// Seed seeds the arrivals, the clocks, the skew, the rounds, the round
	// trips and the lost replies.
	Seed uint64
	// Rebalance is the rebalance interval (lease.RegionOptions.Interval;
	// default DefaultRebalanceInterval).
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
}

// RegionsScenario is when things happen in a run, in seconds of true time
// from its start, and the demand skew before and after the shift.
type RegionsScenario struct {
	// DemandBefore and DemandAfter are each region's part of the arrivals,
	// by region, before and after the shift.
	DemandBefore []float64 `json:"demand_before"`
	DemandAfter  []float64 `json:"demand_after"`
	ShiftS       float64   `json:"shift_s"`
	// HandoverS is when every region's renewer leaves (lease.Region.Close
	// gives the renewal lock back) and starts again as a new gateway: the
	// region's other gateway takes the renewals over.
	HandoverS float64 `json:"handover_s"`
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
	// expiry of the last lease recorded in its store, by its own clock),
	// in seconds of true time; absent if the partition healed first.
	LeaseEndS *float64 `json:"lease_end_s,omitempty"`
	// SafeShare is the most it may spend then: the smaller of its last
	// share and the fallback (lease.Spending).
	SafeShare float64 `json:"safe_share"`
	// MaxShare is the largest share one of its gateways spent
	// (lease.Region.Share) from LeaseEndS to the heal, at its arrivals.
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

// ShareSample is what every region may spend of a ceiling at one instant
// (by region, as parts of the ceiling: the larger of its gateways'
// lease.Region.Share), and its demand-fair share then.
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
	// of the limit: what must stay at most 1 (+ the buckets' bursts).
	MaxWindowUse float64 `json:"max_window_use"`
	// MaxSpentShare is the largest sum, at any instant, over the regions
	// of the larger share one of its gateways may spend
	// (lease.Region.Share, by the region's clock): what the leases bound
	// by 1.
	MaxSpentShare float64 `json:"max_spent_share"`
	// RebalanceS is the time from the shift until every region has held
	// at least 90 % of its demand-fair share on both its gateways, each at
	// its first such instant (null: not before the partition); ConvergeS
	// the same from the partition's heal (null: not before the authority's
	// loss).
	RebalanceS *float64 `json:"rebalance_s"`
	ConvergeS  *float64 `json:"converge_s"`
	// Regions are the regions' admissions, in the order of Regions.
	Regions []RegionResult `json:"regions"`
	CutOff  CutOffResult   `json:"cut_off"`
	Windows []WindowUse    `json:"windows"`
	Shares  []ShareSample  `json:"shares"`
}

// AuthorityCalls counts the regions' calls to the authority over a run,
// as the simulator's link between them sees them.
type AuthorityCalls struct {
	// Reads and Writes reached the authority; Conflicts are the writes
	// it refused (lease.ErrConflict: another region renewed in between).
	Reads     int `json:"reads"`
	Writes    int `json:"writes"`
	Conflicts int `json:"conflicts"`
	// LostReplies are writes that applied whose reply was lost (drawn, or
	// the link cut on the way back); Cut the calls refused while a region
	// was cut off.
	LostReplies int `json:"lost_replies"`
	Cut         int `json:"cut"`
	// Renewers is, by region, how many of its gateways (each
	// lease.Region, by holder) wrote to the authority: two, the holder of
	// the renewal lock before the handover and the one after.
	Renewers []int `json:"renewers"`
}

// RegionsReport is the outcome of a regions simulation; its JSON form is
// what `hedgerow simulate --regions N --json` prints.
type RegionsReport struct {
	Regions            []string `json:"regions"`
	GatewaysPerRegion  int      `json:"gateways_per_region"`
	Requests           int      `json:"requests"`
	Seed               uint64   `json:"seed"`
	DurationS          float64  `json:"duration_s"`
	RebalanceIntervalS float64  `json:"rebalance_interval_s"`
	ValidityS          float64  `json:"validity_s"`
	SkewS              float64  `json:"skew_s"`
	FallbackShare      float64  `json:"fallback_share"`
	FloorShare         float64  `json:"floor_share"`
	// LostReplyShare is the part of the writes whose reply is dropped.
	LostReplyShare float64         `json:"lost_reply_share"`
	Scenario       RegionsScenario `json:"scenario"`
	Authority      AuthorityCalls  `json:"authority"`
	Ceilings       []CeilingResult `json:"ceilings"`
}

// Kinds of the regions model's events.
const (
	evArrival = iota
	evRound
	evWake
	evShift
	evHandover
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
	ceiling int            // evArrival
	gw      *regionGateway // evRound, evWake
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

// simRegion is one region: its store of leases, demand and the renewal
// lock (lease.MemoryRegion, on the region's clock), its gateways and its
// admission bucket of each ceiling.
type simRegion struct {
	name     string
	store    *lease.MemoryRegion
	gateways []*regionGateway
	buckets  []bucket // by ceiling
	// renewers are the holders that wrote to the authority; renewer the
	// gateway that wrote last, the lock's holder.
	renewers map[string]bool
	renewer  *regionGateway
}

// regionGateway is one gateway of a region: its side of the region's leases.
// Its rounds run on a goroutine of their own, which parks in virtual time
// while a call to the authority is on the wire (link).
type regionGateway struct {
	region int
	name   string // its lease.Region's holder
	leases *lease.Region
	link   *regionLink
	starts int  // how many lease.Regions it has run
	leave  bool // it leaves (and starts again) once its round ends
	// busy is set while a round is in flight; pending when its ticker
	// fired meanwhile (a time.Ticker keeps one tick), so the next round
	// starts as soon as this one ends.
	busy, pending bool
}

// roundStep is what a gateway's round goroutine hands back to the run: parked
// on a call to the authority, or done.
type roundStep struct {
	gw   *regionGateway
	done bool
}

// cutPoint is one arrival at the cut-off region during the partition.
type cutPoint struct {
	at       time.Duration
	admitted bool
	share    float64 // the larger share its gateways may spend then
}

// regionsRun is one regions simulation in progress. Its state is touched
// by the run's goroutine and by one gateway's round at a time, handed over
// through parked and each link's wake: never two at once.
type regionsRun struct {
	o       RegionsOptions
	lo      lease.Options // with the regions named and the defaults filled
	auth    *lease.Memory
	rng     *rand.Rand
	queue   regionsQueue
	seq     uint64
	now     time.Duration
	offsets []time.Duration
	regions []*simRegion
	parked  chan roundStep
	calls   AuthorityCalls
	skew    []float64 // the arrivals' current split, by region
	before  []float64
	after   []float64
	shifted bool
	cut     int // the region cut off (−1 before the scenario picks it)
	cutOff  bool
	healed  bool
	forgot  bool
	drain   bool  // the arrivals are over: finish the rounds in flight
	err     error // a gateway that could not start again
	// Per ceiling, by region: admissions; when each region first held
	// fairEnough of its demand-fair share (after the shift, after the
	// heal; −1: never).
	res     [][]RegionResult
	reached [][]time.Duration
	// Per ceiling: the shares' largest sum, the windows' admissions, when
	// the shares rebalanced and converged, the samples, the cut-off
	// region's arrivals during the partition.
	maxSum    []float64
	windows   []map[int64]int
	rebalance []*float64
	converge  []*float64
	samples   [][]ShareSample
	cutLog    [][]cutPoint
	cutHeld   []lease.Held // the cut-off region's leases in its store at the heal
	shiftAt   time.Duration
	handover  time.Duration
	healAt    time.Duration
	lastArr   time.Duration
}

// SimulateRegions runs the regions scenario: every ceiling of the model
// shared by o.Regions regions through leases, demand skewed then shifted,
// one region cut off for o.Partition, the authority's state lost once.
// Each region runs gatewaysPerRegion gateways, each with the production
// lease.Region on the region's clock; a request is admitted by its
// region's bucket at the share its gateway's lease.Region answers.
func SimulateRegions(o RegionsOptions) (*RegionsReport, error) {
	if o.Regions < 2 {
		return nil, fmt.Errorf("%w: regions must be at least 2, got %d", ErrInvalidOptions, o.Regions)
	}
	o.Rebalance = cmp.Or(o.Rebalance, DefaultRebalanceInterval)
	o.Overload = cmp.Or(o.Overload, DefaultRegionsOverload)
	o.Validity = cmp.Or(o.Validity, lease.DefaultValidity)
	o.Skew = cmp.Or(o.Skew, lease.DefaultSkew)
	o.Burst = cmp.Or(o.Burst, DefaultRegionsBurst)
	o.Partition = cmp.Or(o.Partition, DefaultPartition)
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
	r := &regionsRun{o: o, auth: lease.NewMemory(), rng: rand.New(rand.NewPCG(o.Seed, 0x29_1ea5e)), cut: -1, parked: make(chan roundStep)}
	r.lo = lease.Options{Validity: o.Validity, Skew: o.Skew}
	for i := range o.Regions {
		r.lo.Regions = append(r.lo.Regions, "region-"+strconv.Itoa(i))
	}
	// The lease's own checks of its options (validity past twice the
	// skew), then its defaults, which the report and the fair shares use.
	if err := r.lo.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	r.lo.Fallback = 1 / float64(o.Regions)
	r.lo.Floor = r.lo.Fallback * lease.DefaultFloorOfFallback

	// The scenario, on whole seconds: the renewers' handover at 15 % of
	// the run, the shift at a quarter, the partition from 45 %, the
	// authority's loss at 80 %.
	r.handover = (duration * 15 / 100).Truncate(time.Second)
	r.shiftAt = (duration / 4).Truncate(time.Second)
	partition := (duration * 45 / 100).Truncate(time.Second)
	r.healAt = partition + o.Partition
	forget := (duration * 80 / 100).Truncate(time.Second)
	if r.healAt+2*o.Validity > forget {
		return nil, fmt.Errorf("%w: a partition of %v from %v leaves no time to converge before %v: more requests or a shorter partition",
			ErrInvalidOptions, o.Partition, partition, forget)
	}

	for range o.Regions {
		r.offsets = append(r.offsets, time.Duration((r.rng.Float64()-0.5)*float64(o.Skew)))
	}
	r.before, r.after = demandSkew(o.Regions, r.rng)
	r.skew = r.before
	n := len(regionsCeilings)
	r.res, r.reached = make([][]RegionResult, n), make([][]time.Duration, n)
	r.maxSum, r.rebalance, r.converge = make([]float64, n), make([]*float64, n), make([]*float64, n)
	r.samples, r.cutLog, r.cutHeld = make([][]ShareSample, n), make([][]cutPoint, n), make([]lease.Held, n)
	for c := range regionsCeilings {
		for i, name := range r.lo.Regions {
			r.res[c] = append(r.res[c], RegionResult{Name: name, ClockOffsetMs: float64(r.offsets[i]) / float64(time.Millisecond)})
			r.reached[c] = append(r.reached[c], -1)
		}
		r.windows = append(r.windows, map[int64]int{})
	}
	if err := r.build(); err != nil {
		return nil, err
	}
	defer r.close()

	r.push(regionsEvent{at: r.handover, kind: evHandover})
	r.push(regionsEvent{at: r.shiftAt, kind: evShift})
	r.push(regionsEvent{at: partition, kind: evPartition})
	r.push(regionsEvent{at: r.healAt, kind: evHeal})
	if !o.KeepAuthority {
		r.push(regionsEvent{at: forget, kind: evForget})
	}
	r.push(regionsEvent{at: 0, kind: evSample})
	// Each gateway's first round at a seeded phase of its ticker.
	for _, reg := range r.regions {
		for _, g := range reg.gateways {
			r.push(regionsEvent{at: time.Duration(r.rng.Float64() * float64(o.Rebalance/4)), kind: evRound, gw: g})
		}
	}
	r.observe()
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
		r.handle(ev)
	}
	// The rounds still on the wire finish; no new one starts.
	r.drain = true
	for r.inFlight() {
		ev := heap.Pop(&r.queue).(regionsEvent)
		if ev.kind == evWake {
			r.now = ev.at
			r.handle(ev)
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	return r.report(partition, forget), nil
}

// build makes every region's store, buckets and gateways, each on the
// region's clock.
func (r *regionsRun) build() error {
	for i, name := range r.lo.Regions {
		clock := func() time.Time { return r.local(i) }
		reg := &simRegion{name: name, store: lease.NewMemoryRegion(clock), buckets: make([]bucket, len(regionsCeilings)),
			renewers: map[string]bool{}}
		for c := range reg.buckets {
			reg.buckets[c].burst = r.o.Burst.Seconds()
		}
		r.regions = append(r.regions, reg)
		for k := range gatewaysPerRegion {
			g := &regionGateway{region: i}
			g.link = &regionLink{run: r, gw: g, wake: make(chan struct{})}
			if err := r.start(g, k); err != nil {
				return err
			}
			reg.gateways = append(reg.gateways, g)
		}
	}
	return nil
}

// start runs a new lease.Region on gateway g, the k-th of its region,
// on the region's store and clock.
func (r *regionsRun) start(g *regionGateway, k int) error {
	reg := r.lo.Regions[g.region]
	g.starts++
	g.name = fmt.Sprintf("%s/gw-%d.%d", reg, k, g.starts)
	global := func(kind string) bool {
		return slices.ContainsFunc(regionsCeilings, func(c regionsCeiling) bool { return c.kind == kind })
	}
	kinds := make([]string, 0, len(regionsCeilings))
	for _, c := range regionsCeilings {
		kinds = append(kinds, c.kind)
	}
	var err error
	g.leases, err = lease.NewRegion(r.regions[g.region].store, g.link, lease.RegionOptions{Region: reg, Holder: g.name,
		Lease: r.lo, Interval: r.o.Rebalance, Global: global, Kinds: kinds, Now: func() time.Time { return r.local(g.region) }})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	// As Start does before its loop's first round; a MemoryRegion fails
	// only on a cancelled context.
	g.leases.Load(context.Background())
	return nil
}

// leave closes g's lease.Region (it hands on its demand and gives the
// renewal lock back) and starts a new one in its place, with its rounds.
func (r *regionsRun) leave(g *regionGateway) {
	g.leave = false
	g.leases.Close()
	k := slices.Index(r.regions[g.region].gateways, g)
	if err := r.start(g, k); err != nil && r.err == nil {
		r.err = err
	}
}

// close closes every gateway's leases (handing on its demand, giving the
// lock back). Every round has finished (or none started): no goroutine
// outlives a run.
func (r *regionsRun) close() {
	for _, reg := range r.regions {
		for _, g := range reg.gateways {
			if g.leases != nil && !g.busy {
				g.leases.Close()
			}
		}
	}
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
func (r *regionsRun) handle(ev regionsEvent) {
	switch ev.kind {
	case evRound:
		gap := time.Duration(float64(r.o.Rebalance/4) * (1 + roundJitter*(2*r.rng.Float64()-1)))
		r.push(regionsEvent{at: r.now + gap, kind: evRound, gw: ev.gw})
		r.startRound(ev.gw)
	case evWake:
		ev.gw.link.wake <- struct{}{}
		r.await()
	case evShift:
		r.skew, r.shifted = r.after, true
		r.observe()
	case evHandover:
		for _, reg := range r.regions {
			if g := reg.renewer; g != nil && g.busy {
				g.leave = true // once its round ends, as Close waits for it
			} else if g != nil {
				r.leave(g)
			}
		}
	case evPartition:
		r.cut, r.cutOff = slices.Index(r.after, slices.Max(r.after)), true
	case evHeal:
		// A MemoryRegion fails only on a cancelled context.
		held, _ := r.regions[r.cut].store.Held(context.Background())
		for c, ceil := range regionsCeilings {
			r.cutHeld[c] = held[ceil.name]
		}
		r.cutOff, r.healed = false, true
		r.observe()
	case evForget:
		r.auth.Forget()
		r.forgot = true
	case evSample:
		for c := range regionsCeilings {
			r.sample(c)
		}
		r.push(regionsEvent{at: r.now + shareSample, kind: evSample})
	}
}

// startRound runs one of g's rounds (lease.Region.Round, as its loop does
// every quarter interval) on a goroutine until it finishes or parks on the
// wire; a round still in flight when the next is due delays it instead.
func (r *regionsRun) startRound(g *regionGateway) {
	if g.busy {
		g.pending = true
		return
	}
	g.busy = true
	go func() {
		g.leases.Round(context.Background())
		r.parked <- roundStep{gw: g, done: true}
	}()
	r.await()
}

// await waits for the round that runs to park or finish, then takes the
// figures its step may have changed.
func (r *regionsRun) await() {
	s := <-r.parked
	if s.done {
		s.gw.busy = false
		if s.gw.leave {
			r.leave(s.gw)
		}
	}
	r.observe()
	if s.done && s.gw.pending && !r.drain {
		s.gw.pending = false
		r.startRound(s.gw)
	}
}

// inFlight reports whether some gateway's round is still on the wire.
func (r *regionsRun) inFlight() bool {
	for _, reg := range r.regions {
		for _, g := range reg.gateways {
			if g.busy {
				return true
			}
		}
	}
	return false
}

// arrive is one request at ceiling c, in a region drawn by the current
// skew and at one of its gateways: its demand handed to the gateway's
// lease.Region (Want), admitted if the region's bucket, refilled at the
// share the gateway may spend now (Share), holds a token.
func (r *regionsRun) arrive(c int) {
	x, i := r.rng.Float64(), 0
	for ; i < len(r.skew)-1 && x >= r.skew[i]; i++ {
		x -= r.skew[i]
	}
	ceil := regionsCeilings[c]
	g := r.regions[i].gateways[r.rng.IntN(gatewaysPerRegion)]
	g.leases.Want(ceil.name, ceil.kind, 1)
	ok := r.regions[i].buckets[c].take(r.now, ceil.limit, g.leases.Share(ceil.name, ceil.kind, r.local(i)))
	res := &r.res[c][i]
	res.Arrived++
	if ok {
		res.Admitted++
		r.windows[c][int64(r.now/regionsWindow)]++
	} else {
		res.Refused++
	}
	if r.cutOff && i == r.cut {
		most, _ := r.regionShare(c, i)
		r.cutLog[c] = append(r.cutLog[c], cutPoint{at: r.now, admitted: ok, share: most})
	}
}

// regionShare is the larger and the smaller share region i's gateways may
// spend of ceiling c now (lease.Region.Share): what the region may be
// spending, and what all of it holds.
func (r *regionsRun) regionShare(c, i int) (most, least float64) {
	least = math.Inf(1)
	for _, g := range r.regions[i].gateways {
		s := g.leases.Share(regionsCeilings[c].name, regionsCeilings[c].kind, r.local(i))
		most, least = max(most, s), min(least, s)
	}
	return most, least
}

// observe takes the figures a step may have changed: the sum of the
// shares the regions may spend and when every region first held its
// demand-fair share. A share grows only when a round records a grant, so
// looking after every step of a round (and at the start) finds the
// largest sum.
func (r *regionsRun) observe() {
	for c := range regionsCeilings {
		sum := 0.0
		held := make([]float64, len(r.regions))
		for i := range r.regions {
			most, least := r.regionShare(c, i)
			sum += most
			held[i] = least
		}
		r.maxSum[c] = max(r.maxSum[c], sum)
		r.checkFair(c, held)
	}
}

// fair is region i's demand-fair share of the current skew: the floor plus
// its part of what the floors leave.
func (r *regionsRun) fair(i int) float64 {
	return r.lo.Floor + (1-float64(len(r.skew))*r.lo.Floor)*r.skew[i]
}

// checkFair records, after the shift and after the heal, when every
// region has first held at least fairEnough of its demand-fair share on
// every gateway (held, by region): each region's first such instant, the
// latest of them.
func (r *regionsRun) checkFair(c int, held []float64) {
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
	for i, share := range held {
		if r.reached[c][i] < since && share >= fairEnough*r.fair(i) {
			r.reached[c][i] = r.now
		}
		done = done && r.reached[c][i] >= since
	}
	if done {
		s := (r.now - since).Seconds()
		*slot = &s
	}
}

func (r *regionsRun) sample(c int) {
	s := ShareSample{AtS: r.now.Seconds()}
	for i := range r.regions {
		most, _ := r.regionShare(c, i)
		s.Shares = append(s.Shares, most)
		s.Fair = append(s.Fair, r.fair(i))
	}
	r.samples[c] = append(r.samples[c], s)
}

// errCut is the link's answer while its region is cut off from the
// authority; errReplyLost a write that applied whose reply did not come
// back.
var (
	errCut       = errors.New("regions: cut off from the authority")
	errReplyLost = errors.New("regions: the reply was lost")
)

// regionLink is one gateway's way to the authority: the lease.Authority its
// lease.Region renews through, owned by the simulator. It forwards to
// the run's lease.Memory with a round trip of virtual time per call (the
// request lands halfway), refuses every call while its region is cut off
// (a call on the wire when the cut comes loses its reply, or its request
// if it had not landed), and drops the reply of a seeded part of the
// writes after they applied.
type regionLink struct {
	run  *regionsRun
	gw   *regionGateway
	wake chan struct{}
}

var _ lease.Authority = (*regionLink)(nil)

// Get implements lease.Authority.
func (l *regionLink) Get(ctx context.Context, key string) (lease.Table, uint64, error) {
	r := l.run
	rtt := l.rtt()
	if err := l.leg(rtt / 2); err != nil {
		return lease.Table{}, 0, err
	}
	r.calls.Reads++
	t, rev, err := r.auth.Get(ctx, key)
	if err != nil {
		return lease.Table{}, 0, fmt.Errorf("regions: read %q: %w", key, err)
	}
	if err := l.leg(rtt - rtt/2); err != nil {
		return lease.Table{}, 0, err
	}
	return t, rev, nil
}

// Put implements lease.Authority.
func (l *regionLink) Put(ctx context.Context, key string, t lease.Table, rev uint64) (uint64, error) {
	r := l.run
	rtt := l.rtt()
	lost := r.rng.Float64() < lostReplies
	if err := l.leg(rtt / 2); err != nil {
		return 0, err
	}
	r.calls.Writes++
	reg := r.regions[l.gw.region]
	reg.renewers[l.gw.name], reg.renewer = true, l.gw
	next, err := r.auth.Put(ctx, key, t, rev)
	switch {
	case errors.Is(err, lease.ErrConflict):
		r.calls.Conflicts++
	case err != nil:
		return 0, fmt.Errorf("regions: write %q: %w", key, err)
	}
	if err := l.leg(rtt - rtt/2); err != nil {
		if next != 0 {
			r.calls.LostReplies++
		}
		return 0, err
	}
	if lost && next != 0 {
		r.calls.LostReplies++
		return 0, fmt.Errorf("regions: write %q: %w", key, errReplyLost)
	}
	return next, err
}

// rtt draws one call's round trip.
func (l *regionLink) rtt() time.Duration {
	return minRTT + time.Duration(l.run.rng.Float64()*float64(maxRTT-minRTT))
}

// leg is one way of a call: refused at once while the region is cut off,
// else d of virtual time on the wire, and lost if the cut came meanwhile.
func (l *regionLink) leg(d time.Duration) error {
	if l.cutOff() {
		l.run.calls.Cut++
		return errCut
	}
	l.sleep(d)
	if l.cutOff() {
		l.run.calls.Cut++
		return errCut
	}
	return nil
}

func (l *regionLink) cutOff() bool { return l.run.cutOff && l.gw.region == l.run.cut }

// sleep parks the round that runs on this link for d of virtual time: the
// run goes on with its other events and wakes it at now + d.
func (l *regionLink) sleep(d time.Duration) {
	r := l.run
	r.push(regionsEvent{at: r.now + d, kind: evWake, gw: l.gw})
	r.parked <- roundStep{gw: l.gw}
	<-l.wake
}

func (r *regionsRun) report(partition, forget time.Duration) *RegionsReport {
	rep := &RegionsReport{
		Regions:            r.lo.Regions,
		GatewaysPerRegion:  gatewaysPerRegion,
		Requests:           r.o.Requests,
		Seed:               r.o.Seed,
		DurationS:          r.lastArr.Seconds(),
		RebalanceIntervalS: r.o.Rebalance.Seconds(),
		ValidityS:          r.o.Validity.Seconds(),
		SkewS:              r.o.Skew.Seconds(),
		FallbackShare:      r.lo.Fallback,
		FloorShare:         r.lo.Floor,
		LostReplyShare:     lostReplies,
		Authority:          r.calls,
		Scenario: RegionsScenario{
			DemandBefore: r.before,
			DemandAfter:  r.after,
			ShiftS:       r.shiftAt.Seconds(),
			HandoverS:    r.handover.Seconds(),
			CutOff:       r.lo.Regions[r.cut],
			PartitionS:   partition.Seconds(),
			HealS:        r.healAt.Seconds(),
		},
	}
	if !r.o.KeepAuthority {
		f := forget.Seconds()
		rep.Scenario.ForgetS = &f
	}
	for _, reg := range r.regions {
		rep.Authority.Renewers = append(rep.Authority.Renewers, len(reg.renewers))
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
		for _, rr := range r.res[c] {
			if rr.Arrived > 0 {
				rr.RefusedShare = float64(rr.Refused) / float64(rr.Arrived)
			}
			res.Regions = append(res.Regions, rr)
		}
		res.CutOff = r.cutOffResult(c, partition)
		rep.Ceilings = append(rep.Ceilings, res)
	}
	return rep
}

// cutOffResult is what the cut-off region spent of ceiling c once its
// last lease (the one its store held at the heal: no renewal reached it
// while cut off) ran out, until the heal.
func (r *regionsRun) cutOffResult(c int, partition time.Duration) CutOffResult {
	h := r.cutHeld[c]
	// After the expiry: the safe share, by the same rule the gateways use.
	safe, _ := lease.Spending(h, h.Expires.Add(r.lo.Validity), r.lo)
	co := CutOffResult{Region: r.lo.Regions[r.cut], SafeShare: safe}
	end := h.Expires.Add(-r.lo.Skew).Sub(epoch) - r.offsets[r.cut]
	if h == (lease.Held{}) || end >= r.healAt {
		return co
	}
	end = max(end, partition)
	endS := end.Seconds()
	co.LeaseEndS = &endS
	for _, p := range r.cutLog[c] {
		if p.at < end {
			continue
		}
		co.MaxShare = max(co.MaxShare, p.share)
		if p.admitted {
			co.Admitted++
		}
	}
	co.AdmittedShare = float64(co.Admitted) / (regionsCeilings[c].limit * (r.healAt - end).Seconds())
	return co
}

// maxTimelineRows bounds the rows of each ceiling's timeline in the table:
// longer runs put several 10 s windows in a row.
const maxTimelineRows = 24

// WriteTable prints, per ceiling, the headline figures, the regions'
// admissions and a timeline of global use and the shares spent.
func (rep *RegionsReport) WriteTable(w io.Writer) error {
	sc := rep.Scenario
	fmt.Fprintf(w, "%d regions of %d gateways (a lease.Region each), %d requests, seed %d, %.0f s; leases valid %.0f s, skew %.0f s, rebalance interval %.0f s (rounds every quarter, ± 10 %%); safe share %.3f, floor %.3f\n",
		len(rep.Regions), rep.GatewaysPerRegion, rep.Requests, rep.Seed, rep.DurationS, rep.ValidityS, rep.SkewS, rep.RebalanceIntervalS, rep.FallbackShare, rep.FloorShare)
	a := rep.Authority
	fmt.Fprintf(w, "authority calls (a round trip of 50–150 ms each): %d reads, %d writes, %d conflicts, %d replies lost (%.0f %% of writes drawn, and the cut), %d refused while cut off\n",
		a.Reads, a.Writes, a.Conflicts, a.LostReplies, 100*rep.LostReplyShare, a.Cut)
	fmt.Fprintf(w, "each region's renewer leaves at %.0f s (another gateway renews); demand %s shifts to %s at %.0f s; %s cut off from the authority %.0f–%.0f s",
		sc.HandoverS, percents(sc.DemandBefore), percents(sc.DemandAfter), sc.ShiftS, sc.CutOff, sc.PartitionS, sc.HealS)
	if sc.ForgetS != nil {
		fmt.Fprintf(w, "; the authority loses its tables at %.0f s", *sc.ForgetS)
	}
	fmt.Fprintln(w)
	for _, c := range rep.Ceilings {
		fmt.Fprintf(w, "\n%s (%s), %.0f arrivals/s\n", c.Name, c.About, c.ArrivalRate)
		fmt.Fprintf(w, "  worst 10 s window: %.4f of the limit; largest sum of the shares the regions may spend: %.4f\n", c.MaxWindowUse, c.MaxSpentShare)
		fmt.Fprintf(w, "  rebalanced after the shift (every region ≥ 90 %% of its demand-fair share on every gateway): %s\n", seconds(c.RebalanceS, rep.RebalanceIntervalS))
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
	mark(sc.HandoverS, "renewers hand over")
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

// bucket is one region's admission of one ceiling, standing for its
// granter and its gateways' slices (budgets/slice): a token bucket
// refilled at the share the region spends × the limit, holding at most
// burst seconds of that rate (fewer tokens at once when the share
// shrinks). The slices' own refills run in a background loop on a
// wall-clock ticker, which virtual time cannot drive.
type bucket struct {
	share, tokens float64
	burst         float64 // seconds of the rate it holds at most
	last          time.Duration
}

// take refills the bucket up to now at the share it had, sets the share
// the gateway now spends, and takes a token if it holds one.
func (b *bucket) take(now time.Duration, limit, share float64) bool {
	rate := b.share * limit
	b.tokens = min(rate*b.burst, b.tokens+rate*(now-b.last).Seconds())
	b.last = now
	b.share = share
	b.tokens = min(b.tokens, share*limit*b.burst)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
