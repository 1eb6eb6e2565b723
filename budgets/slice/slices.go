package slice

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Options.
const (
	// DefaultLead is how much of its recent use a rate slice keeps ahead:
	// it asks for more when it holds less than a Lead's worth, in a grant of
	// two Leads' worth, as CockroachDB's tenant buckets ask about a second
	// before they run dry.
	DefaultLead = time.Second
	// DefaultTTL is how long a slice lives without renewal: the time a
	// gateway that lost its granter keeps spending its slice before its
	// safe share, and a dead gateway's slots stay held.
	DefaultTTL = 10 * time.Second
	// DefaultLinger is how long a freed slot is kept for the next request
	// before it is given back.
	DefaultLinger = time.Second
	// DefaultTimeout bounds each call to the granter on a request's path.
	DefaultTimeout = 100 * time.Millisecond
	// useHalfLife is the half-life of the decayed use that sizes grants.
	useHalfLife = 2 * time.Second
)

// Options configure Slices.
type Options struct {
	// Holder names this gateway to the granter; empty means a random name,
	// unique across the region.
	Holder string
	// Lead, TTL, Linger and Timeout: zero means their defaults.
	Lead, TTL, Linger, Timeout time.Duration
	// SafeShareReplicas divides a ceiling into the safe share spent while
	// the granter cannot be reached; zero means the gateways last seen
	// alive (at least 1).
	SafeShareReplicas int
	// Now is the clock of expiries and use; nil means time.Now.
	Now func() time.Time
	// Leases is the region's part of the global ceilings (lease.Region,
	// docs/architecture.md §14); nil, a gateway of the only region, spends
	// every ceiling whole.
	Leases     Leases
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Leases is what the slices need of the region's leases of the global
// ceilings, those that hold across regions (lease.Region implements it).
type Leases interface {
	// Share is the part of ceiling key, of kind, the region may spend at
	// now: 1 for a ceiling that is only the region's.
	Share(key, kind string, now time.Time) float64
	// Want records units of ceiling key asked for in the region, the
	// demand its share is sized by; it must not block.
	Want(key, kind string, units float64)
}

// Slices is one gateway's slices of the region's ceilings. Requests spend
// from them in memory; a background loop refills, renews and gives back.
// It is safe for concurrent use.
type Slices struct {
	granter Granter
	opts    Options
	now     func() time.Time
	log     *slog.Logger

	mu     sync.Mutex
	rates  map[string]*rateSlice
	concs  map[string]*concSlice
	alive  int    // gateways last counted alive, at least 1
	epoch  string // the granter's state last seen
	failed bool

	refills   *prometheus.CounterVec // kind, result
	refusals  *prometheus.CounterVec // kind
	stop      chan struct{}
	done      chan struct{}
	looping   bool
	closeOnce sync.Once
}

// rateSlice is a gateway's tokens of one rate ceiling.
type rateSlice struct {
	ceiling  Rate
	tokens   float64    // granted and not spent
	expires  time.Time  // when unspent tokens lapse if the granter stays away
	use      float64    // decayed takes per second
	usedAt   time.Time  // when use was last decayed
	takenAt  time.Time  // the last take
	dryUntil time.Time  // the granter said its bucket is empty until then
	left     float64    // what the granter's bucket held at its last answer
	answered bool       // the granter has answered for this slice
	call     sync.Mutex // held across a call to the granter for this slice
	// owed is what the gateway spent without the granter (its safe
	// share), charged with its next call that reaches it.
	owed float64
	// consumed is what a budget that never refills has cost the gateway
	// (granted less given back, owed charges included): charged again if
	// the granter's state is lost, so a window is not forgotten.
	consumed float64
	// safe is the safe share's own bucket, spent once the slice is empty
	// or lapsed while the granter fails (onSafe). It outlives a flap of
	// the granter, so each flap does not bring a fresh burst.
	safe   *bucket
	onSafe bool
}

// concSlice is a gateway's slots of one concurrency ceiling.
type concSlice struct {
	ceiling     Concurrency
	held        int
	inUse       int
	expires     time.Time // when the hold lapses unless renewed
	renewed     time.Time
	lingerUntil time.Time  // freed slots are kept until then
	safe        bool       // on its safe share: the hold lapsed while the granter fails
	call        sync.Mutex // held across a call to the granter for this slice
}

// New returns Slices over g and starts its background loop; Close stops it.
func New(g Granter, opts Options) (*Slices, error) {
	s, err := newSlices(g, opts)
	if err != nil {
		return nil, err
	}
	// The safe share's divisor from the start: a gateway whose granter is
	// away from its first request does not spend the whole ceiling.
	s.countAlive(context.Background())
	s.looping = true
	go s.loop()
	return s, nil
}

// newSlices is New without the background loop, whose work a caller (a
// test on a settable clock) does by calling renew and countAlive; its
// Close only gives back.
func newSlices(g Granter, opts Options) (*Slices, error) {
	if g == nil {
		return nil, errors.New("slice: a granter is required")
	}
	if opts.Lead < 0 || opts.TTL < 0 || opts.Linger < 0 || opts.Timeout < 0 || opts.SafeShareReplicas < 0 {
		return nil, fmt.Errorf("%w: durations and safe share replicas must not be negative", ErrInvalidRequest)
	}
	opts.Lead = cmp.Or(opts.Lead, DefaultLead)
	opts.TTL = cmp.Or(opts.TTL, DefaultTTL)
	opts.Linger = cmp.Or(opts.Linger, DefaultLinger)
	opts.Timeout = cmp.Or(opts.Timeout, DefaultTimeout)
	if opts.TTL < 2*opts.Lead {
		return nil, fmt.Errorf("%w: TTL %v must be at least twice the lead %v: a slice is refilled a lead before it runs dry", ErrInvalidRequest, opts.TTL, opts.Lead)
	}
	if opts.Holder == "" {
		var b [12]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
		opts.Holder = hex.EncodeToString(b[:])
	}
	s := &Slices{granter: g, opts: opts, now: opts.Now, log: opts.Logger,
		rates: map[string]*rateSlice{}, concs: map[string]*concSlice{}, alive: 1,
		stop: make(chan struct{}), done: make(chan struct{})}
	if opts.Now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.refills = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_slice_refills_total",
		Help: "Calls to the region's granter for a slice, by ceiling kind and result (granted, empty, error)."},
		[]string{"kind", "result"})
	s.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_slice_refusals_total",
		Help: "Requests a gateway's slices refused, by ceiling kind."}, []string{"kind"})
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{s.refills, s.refusals, (*gauges)(s)} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("slice: register metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Close stops the background loop and gives back what the slices hold, so
// other gateways need not wait for the holds to lapse.
func (s *Slices) Close() {
	s.closeOnce.Do(func() {
		close(s.stop)
		if s.looping {
			<-s.done
		}
		s.mu.Lock()
		type giveBack struct {
			r      Rate
			adjust float64
		}
		rates := make([]giveBack, 0, len(s.rates))
		for _, r := range s.rates {
			back := math.Floor(r.tokens)
			r.tokens -= back
			if back > 0 || r.owed > 0 {
				rates = append(rates, giveBack{r.ceiling, back - r.owed})
			}
		}
		concs := make([]Concurrency, 0, len(s.concs))
		for _, c := range s.concs {
			concs = append(concs, c.ceiling)
		}
		s.mu.Unlock()
		// Each give-back has a call's time of its own: a slow first one
		// does not starve the rest.
		for _, g := range rates {
			ctx, cancel := context.WithTimeout(context.Background(), s.opts.Timeout)
			_, _, _, _ = s.granter.Take(ctx, g.r, s.opts.Holder, 0, g.adjust)
			cancel()
		}
		for _, c := range concs {
			ctx, cancel := context.WithTimeout(context.Background(), s.opts.Timeout)
			_, _ = s.granter.Hold(ctx, c, s.opts.Holder, 0, s.opts.TTL)
			cancel()
		}
	})
}

// Take spends one token of r: from the slice in memory when it holds one,
// else from a grant asked for now (one round trip, on a cold slice or a
// burst past its lead), else, while the granter fails, from the safe share.
// Refused, it says how long until a token is likely there.
func (s *Slices) Take(ctx context.Context, r Rate) (bool, time.Duration) {
	return s.TakeN(ctx, r, 1)
}

// TakeN spends n tokens of r at once (n at least 1, at most the burst), as
// Take does one. Of a budget (PerSecond 0), n past the region's allowance
// is refused, not capped.
func (s *Slices) TakeN(ctx context.Context, r Rate, n float64) (bool, time.Duration) {
	return s.takeN(ctx, r, n, true)
}

// RetakeN is TakeN of units asked for before and refused, tried again:
// they are not reported to the region's leases as demand again. Counted at
// every try, a waiting request's demand would be its retries', and a
// region whose small share makes it wait longer between tries would ask
// for less and get less (a share that starves itself).
func (s *Slices) RetakeN(ctx context.Context, r Rate, n float64) (bool, time.Duration) {
	return s.takeN(ctx, r, n, false)
}

// takeN is TakeN, reporting n as demand when report is set.
func (s *Slices) takeN(ctx context.Context, r Rate, n float64, report bool) (bool, time.Duration) {
	now := s.now()
	r = s.regionalRate(r, now, n, report)
	if r.PerSecond == 0 && n > r.Burst {
		// More than the region's allowance of a budget holds: charging only
		// the allowance would let the region spend past it. Refused; its
		// demand, reported above, grows the allowance (§14, "Budgets").
		return s.counted(r.Kind, false, 0)
	}
	s.mu.Lock()
	sl := s.rates[r.Key]
	if sl == nil {
		sl = &rateSlice{ceiling: r, usedAt: now}
		s.rates[r.Key] = sl
	}
	if sl.ceiling != r {
		// A reload changed the ceiling (its key stays): what the granter
		// said of the old one no longer holds.
		sl.ceiling, sl.dryUntil = r, time.Time{}
	}
	n = math.Min(math.Max(n, 1), r.Burst)
	sl.decay(now)
	sl.use += n * math.Ln2 / useHalfLife.Seconds()
	sl.takenAt = now
	ok, wait, decided := s.takeLocally(sl, now, n)
	s.mu.Unlock()
	if decided {
		return s.counted(r.Kind, ok, wait)
	}

	// One call per slice at a time: a request that waited for another's
	// grant spends from it instead of asking again.
	sl.call.Lock()
	defer sl.call.Unlock()
	s.mu.Lock()
	ok, wait, decided = s.takeLocally(sl, now, n)
	want := sl.target(s.opts.Lead, n)
	s.mu.Unlock()
	if decided {
		return s.counted(r.Kind, ok, wait)
	}
	wait, err := s.take(ctx, sl, want, 0)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err != nil:
		ok, wait = s.spendSafe(sl, s.now(), n)
	default:
		ok = sl.spend(s.now(), n, s.failed)
	}
	return s.counted(r.Kind, ok, wait)
}

// regionalRate is r as the region may spend it, the one place a rate
// ceiling's numbers are read: PerSecond and Burst times the region's share
// (Options.Leases), the n units wanted reported as its demand (when
// report is set). Burst stays
// at least 1 (a rate's least, so a token can be granted at all): with k
// regions, their bursts may sum past the ceiling's by up to k−1 tokens.
// A budget that never refills (PerSecond 0) is leased as an allowance, the
// part of it the region may have spent in all (§14): its demand is in
// parts of the budget, and its bucket gains each growth of the allowance
// as a raised limit (Rebudget).
func (s *Slices) regionalRate(r Rate, now time.Time, n float64, report bool) Rate {
	if s.opts.Leases == nil {
		return r
	}
	units := math.Max(n, 1)
	if r.PerSecond == 0 {
		units = n / r.Burst
	}
	if report {
		s.opts.Leases.Want(r.Key, r.Kind, units)
	}
	if share := s.opts.Leases.Share(r.Key, r.Kind, now); share < 1 {
		r.PerSecond *= share
		r.Burst = math.Max(math.Min(1, r.Burst), r.Burst*share)
	}
	return r
}

// regionalConcurrency is c as the region may hold it: Max times the
// region's share, rounded down (so the regions' slots never sum past Max;
// a region whose share is under one slot holds none), one slot reported
// as its demand. some is false when the share holds no slot: the acquire
// is refused without asking the granter, which takes a Max under 1 for a
// malformed ceiling.
func (s *Slices) regionalConcurrency(c Concurrency, now time.Time) (_ Concurrency, some bool) {
	if s.opts.Leases == nil || c.Max < 1 {
		return c, true
	}
	s.opts.Leases.Want(c.Key, c.Kind, 1)
	if share := s.opts.Leases.Share(c.Key, c.Kind, now); share < 1 {
		c.Max = int(math.Floor(float64(c.Max)*share + 1e-9)) // 1e-9: a share of exactly k slots is not k−1
	}
	return c, c.Max >= 1
}

// takeLocally decides a take without the granter when it can: spent from
// the slice, refused while the granter's bucket is known dry, or spent
// from the safe share while the granter fails. Called with s.mu held.
func (s *Slices) takeLocally(sl *rateSlice, now time.Time, n float64) (ok bool, wait time.Duration, decided bool) {
	switch {
	case sl.spend(now, n, s.failed):
		return true, 0, true
	case now.Before(sl.dryUntil):
		return false, sl.dryUntil.Sub(now), true
	case s.failed:
		ok, wait = s.spendSafe(sl, now, n)
		return ok, wait, true
	}
	return false, 0, false
}

// counted counts a refusal of kind and passes the decision on.
func (s *Slices) counted(kind string, ok bool, wait time.Duration) (bool, time.Duration) {
	if !ok {
		s.refusals.WithLabelValues(kind).Inc()
		return false, max(wait, time.Millisecond)
	}
	return true, 0
}

// take asks the granter for want tokens of sl's ceiling, adjusting its
// bucket by adjust and charging what the slice owes, and adds what it
// grants to the slice. The caller holds sl.call.
func (s *Slices) take(ctx context.Context, sl *rateSlice, want, adjust float64) (time.Duration, error) {
	s.mu.Lock()
	owed, ceiling := sl.owed, sl.ceiling
	s.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	took, left, wait, err := s.granter.Take(cctx, ceiling, s.opts.Holder, want, adjust-owed)
	cancel()
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.failedCall(sl.ceiling.Kind, "take", err)
		return 0, err
	}
	s.failed = false
	sl.onSafe = false
	sl.owed -= owed
	sl.tokens += took
	sl.left, sl.answered = left, true
	sl.expires = now.Add(s.opts.TTL) // the granter answered: what the slice holds lives on
	if sl.ceiling.PerSecond == 0 {
		sl.consumed += took - adjust + owed
	}
	if took > 0 {
		s.refills.WithLabelValues(sl.ceiling.Kind, "granted").Inc()
	}
	if want > 0 && took < want && sl.tokens < 1 {
		// The bucket is contended: ask again when it holds a token — a
		// window's budget, which never refills, after a lead —, not on
		// every request until then.
		if sl.ceiling.PerSecond == 0 {
			wait = s.opts.Lead
		}
		sl.dryUntil = now.Add(wait)
		s.refills.WithLabelValues(sl.ceiling.Kind, "empty").Inc()
	}
	return wait, nil
}

// Adjust corrects what the gateway spent of r once the true cost is known:
// units > 0 gives back to its slice what a take over-estimated; units < 0
// charges what it under-estimated, which may leave the slice in debt for
// the next grant to pay.
func (s *Slices) Adjust(r Rate, units float64) {
	if units == 0 || math.IsNaN(units) || math.IsInf(units, 0) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := s.rates[r.Key]
	if sl == nil {
		sl = &rateSlice{ceiling: r, usedAt: s.now()}
		s.rates[r.Key] = sl
	}
	if units < 0 && sl.onSafe {
		sl.owed -= units // spent on the safe share: charged once the granter answers
		return
	}
	sl.tokens += units
}

// spendSafe spends n tokens of the safe share of sl's ceiling: a bucket of
// its own, the ceiling's rate and burst divided by the gateways last seen
// alive, full when the gateway falls to it. Called with s.mu held.
func (s *Slices) spendSafe(sl *rateSlice, now time.Time, n float64) (bool, time.Duration) {
	share := float64(s.replicas())
	perSecond := sl.ceiling.PerSecond / share
	burst := math.Max(1, sl.ceiling.Burst/share)
	if sl.safe == nil {
		start := burst
		if perSecond == 0 {
			// A budget that never refills: a share of what the granter
			// had left at its last answer, not of the whole window, so
			// the gateways together spend about what was left (all of
			// it, for a slice the granter never answered).
			left := sl.ceiling.Burst
			if sl.answered {
				left = math.Max(0, sl.left)
			}
			start = left / share
		}
		sl.safe = &bucket{tokens: start, at: now}
	}
	sl.onSafe = true
	if now.After(sl.safe.at) {
		sl.safe.tokens = math.Min(burst, sl.safe.tokens+now.Sub(sl.safe.at).Seconds()*perSecond)
		sl.safe.at = now
	}
	if sl.safe.tokens >= n {
		sl.safe.tokens -= n
		sl.owed += n
		return true, 0
	}
	return false, UntilToken(sl.safe.tokens-n+1, perSecond)
}

// replicas is the safe share's divisor. Called with s.mu held.
func (s *Slices) replicas() int {
	if s.opts.SafeShareReplicas > 0 {
		return s.opts.SafeShareReplicas
	}
	return max(1, s.alive)
}

// decay ages the slice's use to now.
func (sl *rateSlice) decay(now time.Time) {
	if dt := now.Sub(sl.usedAt); dt > 0 {
		sl.use *= math.Exp2(-dt.Seconds() / useHalfLife.Seconds())
		sl.usedAt = now
	}
}

// spend takes n tokens from the slice if it holds them. They lapse only
// while the granter fails (failed), a TTL after it last answered: while
// it answers, an idle slice gives its tokens back instead.
func (sl *rateSlice) spend(now time.Time, n float64, failed bool) bool {
	if sl.tokens >= n && (!failed || now.Before(sl.expires)) {
		sl.tokens -= n
		return true
	}
	return false
}

// target is how many tokens to ask for: two leads of recent use, at least
// need, at most the burst, less what the slice holds.
func (sl *rateSlice) target(lead time.Duration, need float64) float64 {
	want := math.Max(need, math.Ceil(sl.use*2*lead.Seconds()))
	return math.Max(0, math.Min(want, sl.ceiling.Burst)-math.Floor(sl.tokens))
}

// Acquire takes one slot of c: from the slots this gateway holds when one
// is free, else by holding one more (one round trip), else, while the
// granter fails and the hold has lapsed, within the safe share. An
// acquired slot is given back with Release.
func (s *Slices) Acquire(ctx context.Context, c Concurrency) bool {
	c, some := s.regionalConcurrency(c, s.now())
	if !some {
		s.refusals.WithLabelValues(c.Kind).Inc()
		return false
	}
	s.mu.Lock()
	sl := s.concs[c.Key]
	if sl == nil {
		sl = &concSlice{ceiling: c}
		s.concs[c.Key] = sl
	}
	sl.ceiling = c
	// Keeps the background round from forgetting the slice while this
	// acquire may still ask the granter for it.
	sl.lingerUntil = later(sl.lingerUntil, s.now().Add(s.opts.Linger))
	ok, decided := s.acquireLocally(sl)
	s.mu.Unlock()
	if !decided {
		sl.call.Lock()
		s.mu.Lock()
		ok, decided = s.acquireLocally(sl)
		want := sl.inUse + 1
		s.mu.Unlock()
		if !decided {
			_ = s.hold(ctx, sl, want)
			s.mu.Lock()
			ok, _ = s.acquireLocally(sl)
			s.mu.Unlock()
		}
		sl.call.Unlock()
	}
	if !ok {
		s.refusals.WithLabelValues(c.Kind).Inc()
	}
	return ok
}

// acquireLocally decides an acquire without the granter when it can: a
// slot the gateway holds, or, while the granter fails, the held slots
// until their hold lapses and then the safe share. Called with s.mu held.
func (s *Slices) acquireLocally(sl *concSlice) (ok, decided bool) {
	now := s.now()
	limit, live := sl.held, now.Before(sl.expires)
	switch {
	case s.failed && !live:
		sl.safe = true
		limit = sl.ceiling.Max / s.replicas()
	case !live:
		limit = 0
	}
	if sl.inUse < limit {
		sl.inUse++
		return true, true
	}
	return false, s.failed
}

// Release gives back one slot of c acquired with Acquire. The slot stays
// held by the gateway for the linger, for its next request.
func (s *Slices) Release(c Concurrency) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl := s.concs[c.Key]; sl != nil && sl.inUse > 0 {
		sl.inUse--
		sl.lingerUntil = s.now().Add(s.opts.Linger)
	}
}

// hold asks the granter to set the gateway's slots of sl's ceiling to
// want. The caller holds sl.call, so the answers of two holds of one slice
// cannot cross: what the gateway believes it holds is what the granter
// last set. A hold that shrinks takes effect here before it is asked for,
// so the gateway never uses a slot the granter has freed.
func (s *Slices) hold(ctx context.Context, sl *concSlice, want int) error {
	s.mu.Lock()
	sl.held = min(sl.held, want)
	ceiling := sl.ceiling
	s.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	held, err := s.granter.Hold(cctx, ceiling, s.opts.Holder, want, s.opts.TTL)
	cancel()
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.failedCall(sl.ceiling.Kind, "hold", err)
		return err
	}
	s.failed = false
	sl.safe = false
	sl.held, sl.expires, sl.renewed = held, now.Add(s.opts.TTL), now
	if held >= want {
		s.refills.WithLabelValues(sl.ceiling.Kind, "granted").Inc()
	} else {
		s.refills.WithLabelValues(sl.ceiling.Kind, "empty").Inc()
	}
	return nil
}

// failedCall counts a failed granter call and logs the first of a run of
// failures. Called with s.mu held.
func (s *Slices) failedCall(kind, op string, err error) {
	s.refills.WithLabelValues(kind, "error").Inc()
	if !s.failed {
		s.log.Warn("slice granter failed: spending slices, then safe shares", "op", op, "err", err)
	}
	s.failed = true
}

// loop renews, refills and gives back in the background.
func (s *Slices) loop() {
	defer close(s.done)
	t := time.NewTicker(s.opts.Lead / 4)
	defer t.Stop()
	var lastAlive time.Time
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ctx := context.Background()
		if now := s.now(); now.Sub(lastAlive) >= s.opts.TTL/3 {
			lastAlive = now
			s.countAlive(ctx)
		}
		s.renew(ctx)
	}
}

// countAlive marks the gateway alive and learns how many are. When the
// granter's epoch changed, its state was lost: the budgets that never
// refill are charged again with what the gateway consumed of them, and
// every hold is renewed at once.
func (s *Slices) countAlive(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	n, epoch, err := s.granter.Alive(cctx, s.opts.Holder, s.opts.TTL)
	cancel()
	if err != nil {
		return // the last count stands: it is the safe share's divisor
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.alive = max(1, n)
	if s.epoch != "" && epoch != s.epoch {
		s.log.Warn("slice granter lost its state: charging again what this gateway consumed")
		for _, sl := range s.rates {
			sl.owed += sl.consumed
			sl.consumed = 0
		}
		for _, sl := range s.concs {
			sl.renewed = time.Time{}
		}
	}
	s.epoch = epoch
}

// renew does one round of the background work: a rate slice running low
// is refilled before it runs dry and an idle one gives its tokens back;
// holds are renewed every third of the TTL, and slots freed longer than
// the linger ago are given back. While the granter fails, these calls are
// its probes: the first that succeeds ends the safe shares.
func (s *Slices) renew(ctx context.Context) {
	now := s.now()
	s.mu.Lock()
	rates := make([]*rateSlice, 0, len(s.rates))
	for key, sl := range s.rates {
		sl.decay(now)
		if sl.idle(now, s.opts.Lead) && sl.tokens >= 0 && sl.tokens < 1 && sl.owed == 0 && !sl.onSafe {
			delete(s.rates, key) // nothing held, owed or used: forget it
			continue
		}
		rates = append(rates, sl)
	}
	concs := make([]*concSlice, 0, len(s.concs))
	for key, sl := range s.concs {
		if sl.inUse == 0 && sl.held == 0 && !sl.safe && !now.Before(sl.lingerUntil) {
			delete(s.concs, key)
			continue
		}
		concs = append(concs, sl)
	}
	s.mu.Unlock()
	for _, sl := range rates {
		sl.call.Lock()
		s.mu.Lock()
		var want, adjust float64
		switch {
		case sl.idle(now, s.opts.Lead) && sl.tokens >= 1:
			adjust = math.Floor(sl.tokens) // give back what an idle slice holds
		case sl.idle(now, s.opts.Lead) && sl.tokens < 0:
			adjust = sl.tokens // charge its debt
		case sl.prefetch(s.opts.Lead) && !now.Before(sl.dryUntil):
			want = sl.target(s.opts.Lead, 1)
		}
		sl.tokens -= adjust
		due := want > 0 || adjust != 0 || sl.owed > 0
		s.mu.Unlock()
		if due {
			if _, err := s.take(ctx, sl, want, adjust); err != nil {
				s.mu.Lock()
				sl.tokens += adjust // not given back, nor charged: still the slice's
				s.mu.Unlock()
			}
		}
		sl.call.Unlock()
	}
	for _, sl := range concs {
		sl.call.Lock()
		s.mu.Lock()
		want := sl.inUse
		if now.Before(sl.lingerUntil) {
			want = max(want, sl.held)
		}
		due := want != sl.held || now.Sub(sl.renewed) >= s.opts.TTL/3
		s.mu.Unlock()
		if due {
			_ = s.hold(ctx, sl, want)
		}
		sl.call.Unlock()
	}
}

// prefetch reports whether the slice should be refilled ahead: it holds
// less than a lead of its use, and that use is at least a token a lead.
// A slice used more rarely asks on the request's path instead: a token
// taken ahead would sit in this gateway's slice while another gateway's
// request is refused for it (a tenant of 2 requests a burst, one through
// each gateway).
func (sl *rateSlice) prefetch(lead time.Duration) bool {
	ahead := sl.use * lead.Seconds()
	return ahead >= 1 && sl.tokens < ahead
}

// idle reports whether the slice has not been taken from for two leads:
// what it holds goes back to the region's other gateways.
func (sl *rateSlice) idle(now time.Time, lead time.Duration) bool {
	return now.Sub(sl.takenAt) >= 2*lead
}

// gauges is the Slices' collector of what they hold now.
type gauges Slices

var (
	unitsDesc = prometheus.NewDesc("hedgerow_slice_units",
		"Units a gateway holds in its slices (rate tokens, concurrency slots), by ceiling kind.", []string{"kind"}, nil)
	expiryDesc = prometheus.NewDesc("hedgerow_slice_expiry_seconds",
		"Seconds until the soonest of a gateway's slices of a ceiling kind lapses unless renewed.", []string{"kind"}, nil)
	safeShareDesc = prometheus.NewDesc("hedgerow_slice_safe_share",
		"1 while a gateway spends a safe share of some ceiling because the region's granter cannot be reached, else 0.", nil, nil)
	aliveDesc = prometheus.NewDesc("hedgerow_slice_gateways_alive",
		"The region's gateways this gateway last saw alive: the divisor of its safe shares.", nil, nil)
)

func (g *gauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- unitsDesc
	ch <- expiryDesc
	ch <- safeShareDesc
	ch <- aliveDesc
}

func (g *gauges) Collect(ch chan<- prometheus.Metric) {
	s := (*Slices)(g)
	now := s.now()
	units := map[string]float64{}
	expiry := map[string]float64{}
	soonest := func(kind string, at time.Time) {
		left := math.Max(0, at.Sub(now).Seconds())
		if e, ok := expiry[kind]; !ok || left < e {
			expiry[kind] = left
		}
	}
	safe := 0.0
	s.mu.Lock()
	alive := float64(s.replicas())
	for _, sl := range s.rates {
		units[sl.ceiling.Kind] += sl.tokens
		soonest(sl.ceiling.Kind, sl.expires)
		if sl.onSafe {
			safe = 1
		}
	}
	for _, sl := range s.concs {
		units[sl.ceiling.Kind] += float64(sl.held)
		soonest(sl.ceiling.Kind, sl.expires)
		if sl.safe {
			safe = 1
		}
	}
	s.mu.Unlock()
	for kind, u := range units {
		ch <- prometheus.MustNewConstMetric(unitsDesc, prometheus.GaugeValue, u, kind)
		ch <- prometheus.MustNewConstMetric(expiryDesc, prometheus.GaugeValue, expiry[kind], kind)
	}
	ch <- prometheus.MustNewConstMetric(safeShareDesc, prometheus.GaugeValue, safe)
	ch <- prometheus.MustNewConstMetric(aliveDesc, prometheus.GaugeValue, alive)
}

// TakeRate is Take of the rate ceiling {key, kind, perSecond, burst}, in
// plain types for a consumer that takes none of this package's (the
// doors' tenant limits, docs/architecture.md §3).
func (s *Slices) TakeRate(ctx context.Context, key, kind string, perSecond, burst float64) (bool, time.Duration) {
	return s.Take(ctx, Rate{Key: key, Kind: kind, PerSecond: perSecond, Burst: burst})
}

// AcquireSlot is Acquire of the concurrency ceiling {key, kind, max}, in
// plain types.
func (s *Slices) AcquireSlot(ctx context.Context, key, kind string, max int) bool {
	return s.Acquire(ctx, Concurrency{Key: key, Kind: kind, Max: max})
}

// ReleaseSlot is Release of a slot AcquireSlot took under key.
func (s *Slices) ReleaseSlot(key string) { s.Release(Concurrency{Key: key}) }

// later is the later of two times.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
