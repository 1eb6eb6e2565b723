package delay

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/DataDog/sketches-go/ddsketch"
)

// ErrInvalidOptions is wrapped by every configuration error of this package.
var ErrInvalidOptions = errors.New("delay: invalid options")

// ErrNegativeLatency is returned for an observation with a negative duration,
// which can only come from a clock error in the caller.
var ErrNegativeLatency = errors.New("delay: negative latency")

// Options sets how an Estimator turns a cohort's latencies into a hedge delay.
type Options struct {
	// Quantile of the cohort's primary latencies used as the delay (0.95:
	// about one group in twenty hedges).
	Quantile float64
	// Min and Max clamp the delay: Min keeps a noisy fast cohort from hedging
	// almost at once, Max keeps a slow one from never hedging at all.
	Min, Max time.Duration
	// Initial is the delay until the window holds WarmupSamples samples.
	Initial time.Duration
	// WarmupSamples is how many samples the window needs before its quantile
	// is trusted; 0 trusts the first sample.
	WarmupSamples int
	// Window is how far back samples count; it is split into Slots time
	// slots, and a whole slot rolls out at a time.
	Window time.Duration
	Slots  int
	// RelativeAccuracy of the DDSketch (0.01: every quantile within 1%).
	RelativeAccuracy float64
	// MaxBins bounds each slot's sketch; 2048 bins at 1% span 1 ms to
	// beyond a day, so collapsing never touches latencies that matter.
	MaxBins int
	// ScaleBorrowed says a cold cohort's delay borrowed from a sibling of
	// another max_tokens bucket is scaled by the ratio of the buckets: set
	// for the total trigger, where the time to a result grows with the
	// output; left off for first_byte, where it does not (see Delay).
	ScaleBorrowed bool
	// RouteMargin is how far apart, relatively, a route's confidence
	// interval for the Quantile must lie from its cohort's for the route to
	// get a delay of its own (0.1); RouteZ is the intervals' normal
	// quantile (1.96: 95%).
	RouteMargin float64
	RouteZ      float64
	// MaxRoutes bounds the routes of one cohort that get a window of their
	// own (8), so memory stays routes × cohorts; further routes take the
	// cohort's delay.
	MaxRoutes int
}

// DefaultOptions is the delay configuration used when a policy sets nothing.
func DefaultOptions() Options {
	return Options{
		Quantile:         0.95,
		Min:              100 * time.Millisecond,
		Max:              10 * time.Second,
		Initial:          time.Second,
		WarmupSamples:    200,
		Window:           5 * time.Minute,
		Slots:            10,
		RelativeAccuracy: 0.01,
		MaxBins:          2048,
		RouteMargin:      0.1,
		RouteZ:           1.96,
		MaxRoutes:        8,
	}
}

// withDefaults fills zero fields from DefaultOptions. Min and WarmupSamples
// are left alone: zero is a meaningful setting for both.
func (c Options) withDefaults() Options {
	d := DefaultOptions()
	c.Quantile = cmp.Or(c.Quantile, d.Quantile)
	c.Max = cmp.Or(c.Max, d.Max)
	c.Initial = cmp.Or(c.Initial, d.Initial)
	c.Window = cmp.Or(c.Window, d.Window)
	c.Slots = cmp.Or(c.Slots, d.Slots)
	c.RelativeAccuracy = cmp.Or(c.RelativeAccuracy, d.RelativeAccuracy)
	c.MaxBins = cmp.Or(c.MaxBins, d.MaxBins)
	c.RouteMargin = cmp.Or(c.RouteMargin, d.RouteMargin)
	c.RouteZ = cmp.Or(c.RouteZ, d.RouteZ)
	c.MaxRoutes = cmp.Or(c.MaxRoutes, d.MaxRoutes)
	return c
}

// validate reports every problem of a defaulted config at once.
func (c Options) validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...))
	}
	if !(c.Quantile > 0 && c.Quantile < 1) {
		bad("quantile %v not in (0, 1)", c.Quantile)
	}
	if c.Min < 0 {
		bad("min delay %v is negative", c.Min)
	}
	if c.Max < c.Min {
		bad("max delay %v below min delay %v", c.Max, c.Min)
	}
	if c.Initial < c.Min || c.Initial > c.Max {
		bad("initial delay %v outside [min %v, max %v]", c.Initial, c.Min, c.Max)
	}
	if c.WarmupSamples < 0 {
		bad("warm-up samples %d is negative", c.WarmupSamples)
	}
	if !(c.RouteMargin > 0 && c.RouteMargin < 1) {
		bad("route margin %v not in (0, 1)", c.RouteMargin)
	}
	if !(c.RouteZ > 0) {
		bad("route z %v is not positive", c.RouteZ)
	}
	if c.MaxRoutes < 1 {
		bad("max routes %d, need at least 1", c.MaxRoutes)
	}
	errs = append(errs, validateWindow(c.Window, c.Slots, c.RelativeAccuracy, c.MaxBins)...)
	return errors.Join(errs...)
}

func validateWindow(window time.Duration, slots int, accuracy float64, maxBins int) []error {
	var errs []error
	if slots < 1 {
		errs = append(errs, fmt.Errorf("%w: slots %d, need at least 1", ErrInvalidOptions, slots))
	} else if window < time.Millisecond*time.Duration(slots) {
		errs = append(errs, fmt.Errorf("%w: window %v too short for %d slots of at least 1ms", ErrInvalidOptions, window, slots))
	}
	if !(accuracy > 0 && accuracy < 1) {
		errs = append(errs, fmt.Errorf("%w: relative accuracy %v not in (0, 1)", ErrInvalidOptions, accuracy))
	}
	if maxBins < 16 {
		errs = append(errs, fmt.Errorf("%w: max bins %d, need at least 16", ErrInvalidOptions, maxBins))
	}
	return errs
}

// Clamp names the bound that set a delay, for records and metrics.
type Clamp string

const (
	// ClampNone: the delay is the window quantile (or Initial) as is.
	ClampNone Clamp = ""
	// ClampMin: the quantile was below Options.Min.
	ClampMin Clamp = "min"
	// ClampMax: the quantile was above Options.Max.
	ClampMax Clamp = "max"
	// ClampDeadline: the delay would have fired after the deadline, so it was
	// cut to the remaining time; the hedge gates will then refuse for lack of
	// useful time.
	ClampDeadline Clamp = "deadline"
)

// Delay is the hedge delay chosen for one group, with what it came from.
type Delay struct {
	// Value is the delay to arm the hedge timer with, from the group's start.
	Value time.Duration
	// Warm is true when Value comes from a window's quantile — the cohort's,
	// its route's or, Borrowed, its siblings' — and false while it is
	// Options.Initial.
	Warm bool
	// Borrowed: the cohort is still warming up and Value comes from its warm
	// sibling cohorts (same operation, pool, stream and kind, another
	// max_tokens bucket).
	Borrowed bool
	// Route: Value is the primary's route's own quantile, whose
	// distribution differs from its cohort's (Estimator.RouteDelay).
	Route bool
	// Cohort is the cohort's delay over its whole pool, Value unless Route:
	// what a primary's stall is judged by (route.PrimaryState), so that a
	// route given its own, longer delay still counts the stalls its
	// siblings would not have had (docs/architecture.md §5, "Route choice").
	Cohort time.Duration
	// Samples is the number of samples in the cohort's window.
	Samples int
	// Estimate is the quantile before clamping (0 while cold).
	Estimate time.Duration
	// Clamp names the bound that changed the value, if any.
	Clamp Clamp
}

// Estimator keeps a rolling window of primary latencies per cohort, and per
// route inside each cohort, and turns them into hedge delays. It is pure —
// no goroutines, no clock: every method takes now — so the simulator drives
// it on virtual time and the live runtime on real time, with the same
// results. It is safe for concurrent use.
type Estimator struct {
	cfg  Options
	spec sketchSpec

	mu      sync.Mutex
	cohorts map[Cohort]*cohortWindow
	// families lists the cohorts of each family — a cohort with its
	// MaxTokens zeroed: same operation, pool, stream and kind — in the
	// order they were seen, for a cold cohort to borrow from its siblings.
	families map[Cohort][]Cohort
	scratch  *ddsketch.DDSketch // reused to merge slots; guarded by mu
	union    *ddsketch.DDSketch // a family's union while borrowing; guarded by mu
}

// cohortWindow separates this replica's own samples from those merged in
// from peers, so that merging the peers' latest snapshots again replaces
// them instead of counting them twice. routes holds the own samples again,
// split by the primary's route (at most Options.MaxRoutes of them).
type cohortWindow struct {
	own    ring
	peers  ring
	routes map[string]*ring
}

// NewEstimator returns an Estimator for cfg. Zero fields of cfg take
// DefaultOptions's values, except Min and WarmupSamples.
func NewEstimator(cfg Options) (*Estimator, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	spec, err := newSketchSpec(cfg.RelativeAccuracy, cfg.MaxBins)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	return &Estimator{cfg: cfg, spec: spec, cohorts: make(map[Cohort]*cohortWindow),
		families: make(map[Cohort][]Cohort), scratch: spec.newSketch(), union: spec.newSketch()}, nil
}

// Options returns the estimator's configuration with defaults filled in.
func (e *Estimator) Options() Options { return e.cfg }

func family(c Cohort) Cohort {
	c.MaxTokens = 0
	return c
}

func (e *Estimator) window(c Cohort) *cohortWindow {
	w, ok := e.cohorts[c]
	if !ok {
		w = &cohortWindow{
			own:   newRing(e.spec, e.cfg.Window, e.cfg.Slots),
			peers: newRing(e.spec, e.cfg.Window, e.cfg.Slots),
		}
		e.cohorts[c] = w
		f := family(c)
		e.families[f] = append(e.families[f], c)
	}
	return w
}

// route returns the window of a route of w, creating it while the cohort
// has fewer than MaxRoutes; nil for the empty route or beyond the bound.
func (e *Estimator) route(w *cohortWindow, route string) *ring {
	if route == "" {
		return nil
	}
	if r, ok := w.routes[route]; ok {
		return r
	}
	if len(w.routes) >= e.cfg.MaxRoutes {
		return nil
	}
	if w.routes == nil {
		w.routes = make(map[string]*ring)
	}
	r := newRing(e.spec, e.cfg.Window, e.cfg.Slots)
	w.routes[route] = &r
	return &r
}

// Delay returns the hedge delay for a group of cohort c starting at now with
// remaining time left before its deadline: the Quantile of the cohort's
// window, clamped to [Min, Max] and then to remaining. Until the window holds
// WarmupSamples samples the cohort borrows from its family (the cohorts of
// the same operation, pool, stream and kind in other max_tokens buckets):
//
//   - without ScaleBorrowed (trigger first_byte: the time to a first token
//     does not grow with max_tokens) the family is one distribution, and the
//     delay is the Quantile of the union of its windows, once that union
//     holds WarmupSamples;
//   - with ScaleBorrowed (trigger total) the delay is the nearest warm
//     sibling's Quantile (nearest bucket on a log scale; of two as near, the
//     larger) times max(1, bucket / sibling's bucket): a larger bucket may
//     take up to proportionally longer, a smaller one never takes longer.
//     The unset bucket 0 neither lends nor borrows: its output has no bound
//     to scale by.
//
// With no warm sibling it is Initial.
func (e *Estimator) Delay(c Cohort, now time.Time, remaining time.Duration) Delay {
	e.mu.Lock()
	defer e.mu.Unlock()
	return clampRemaining(e.delayLocked(c, now), remaining)
}

// RouteDelay is Delay for a group whose primary runs on route: the route's
// own Quantile when its distribution differs from its pool's, else the
// cohort's delay. The pool is the cohort's other routes: the union of their
// windows. They differ when the cohort is warm, the route's window and the
// union each hold WarmupSamples, and the distribution-free confidence
// intervals for the Quantile (RouteZ, as the guardrail's) lie apart by
// RouteMargin: the route's lower bound above (1 + RouteMargin) × the
// pool's upper bound, or its upper bound below (1 − RouteMargin) × the
// pool's lower bound. Route windows hold this replica's own primaries
// only; the cohort's holds the peers' too.
func (e *Estimator) RouteDelay(c Cohort, route string, now time.Time, remaining time.Duration) Delay {
	e.mu.Lock()
	defer e.mu.Unlock()
	return clampRemaining(e.routeDelayLocked(c, route, now), remaining)
}

func clampRemaining(d Delay, remaining time.Duration) Delay {
	if remaining < 0 {
		remaining = 0
	}
	if !d.Route {
		d.Cohort = d.Value
	}
	if d.Value > remaining {
		d.Value, d.Clamp = remaining, ClampDeadline
	}
	d.Cohort = min(d.Cohort, remaining)
	return d
}

// view is the cohort's window, own and peers' samples merged; it may be
// e.scratch, valid until the next view.
func (e *Estimator) view(w *cohortWindow, now time.Time) *ddsketch.DDSketch {
	view, _ := w.own.merged(now)
	if peers, _ := w.peers.merged(now); !peers.IsEmpty() {
		e.scratch.Clear()
		// Both views share the estimator's index mapping: MergeWith cannot fail.
		_ = e.scratch.MergeWith(view)
		_ = e.scratch.MergeWith(peers)
		view = e.scratch
	}
	return view
}

func (e *Estimator) warm(n float64) bool {
	return n > 0 && int(math.Round(n)) >= e.cfg.WarmupSamples
}

// fromQuantile is a warm delay of estimate q seconds, clamped to [Min, Max].
func (e *Estimator) fromQuantile(d Delay, q float64) Delay {
	d.Warm = true
	d.Estimate = secondsToDuration(q)
	d.Value = d.Estimate
	switch {
	case d.Value < e.cfg.Min:
		d.Value, d.Clamp = e.cfg.Min, ClampMin
	case d.Value > e.cfg.Max:
		d.Value, d.Clamp = e.cfg.Max, ClampMax
	}
	return d
}

func (e *Estimator) delayLocked(c Cohort, now time.Time) Delay {
	d := Delay{Value: e.cfg.Initial}
	if w, ok := e.cohorts[c]; ok {
		view := e.view(w, now)
		n := view.GetCount()
		d.Samples = int(math.Round(n))
		if e.warm(n) {
			if q, err := view.GetValueAtQuantile(e.cfg.Quantile); err == nil {
				return e.fromQuantile(d, q)
			}
		}
	}
	return e.borrowLocked(c, now, d)
}

// borrowLocked is the delay of a cold cohort taken from its family (see
// Delay), or d as it is.
func (e *Estimator) borrowLocked(c Cohort, now time.Time, d Delay) Delay {
	members := e.families[family(c)]
	if !e.cfg.ScaleBorrowed {
		e.union.Clear()
		for _, m := range members {
			// Same mapping everywhere: MergeWith cannot fail.
			_ = e.union.MergeWith(e.view(e.cohorts[m], now))
		}
		if !e.warm(e.union.GetCount()) {
			return d
		}
		q, err := e.union.GetValueAtQuantile(e.cfg.Quantile)
		if err != nil {
			return d
		}
		d = e.fromQuantile(d, q)
		d.Borrowed = true
		return d
	}
	if c.MaxTokens == 0 {
		return d
	}
	best, bestQ := 0, 0.0
	for _, m := range members {
		if m.MaxTokens == 0 || m.MaxTokens == c.MaxTokens || !nearer(c.MaxTokens, m.MaxTokens, best) {
			continue
		}
		view := e.view(e.cohorts[m], now)
		if !e.warm(view.GetCount()) {
			continue
		}
		if q, err := view.GetValueAtQuantile(e.cfg.Quantile); err == nil {
			best, bestQ = m.MaxTokens, q
		}
	}
	if best == 0 {
		return d
	}
	d = e.fromQuantile(d, bestQ*math.Max(1, float64(c.MaxTokens)/float64(best)))
	d.Borrowed = true
	return d
}

// nearer reports whether bucket b is nearer to bucket c than best (0: none
// yet) on a log scale, the larger winning a tie.
func nearer(c, b, best int) bool {
	if best == 0 {
		return true
	}
	db, dbest := math.Abs(math.Log(float64(b)/float64(c))), math.Abs(math.Log(float64(best)/float64(c)))
	const eps = 1e-9
	return db < dbest-eps || math.Abs(db-dbest) <= eps && b > best
}

func (e *Estimator) routeDelayLocked(c Cohort, route string, now time.Time) Delay {
	d := e.delayLocked(c, now)
	w, ok := e.cohorts[c]
	if !ok || !d.Warm || d.Borrowed {
		return d
	}
	r, ok := w.routes[route]
	if !ok {
		return d
	}
	rv, _ := r.merged(now)
	if !e.warm(rv.GetCount()) {
		return d
	}
	// The pool the route is judged against: its sibling routes' samples.
	// The cohort's window would hold the route's own too, and a route that
	// carries much of the traffic would hide its own difference.
	e.union.Clear()
	for name, sib := range w.routes {
		if name != route {
			sv, _ := sib.merged(now)
			_ = e.union.MergeWith(sv) // same mapping: cannot fail
		}
	}
	if !e.warm(e.union.GetCount()) {
		return d
	}
	q, z := e.cfg.Quantile, e.cfg.RouteZ
	_, pLo, pHi := quantileInterval(e.union, q, z)
	rq, rLo, rHi := quantileInterval(rv, q, z)
	m := e.cfg.RouteMargin
	if float64(rLo) <= (1+m)*float64(pHi) && float64(rHi) >= (1-m)*float64(pLo) {
		return d
	}
	rd := e.fromQuantile(Delay{Samples: d.Samples}, rq.Seconds())
	rd.Route, rd.Cohort = true, d.Value
	return rd
}

// ObservePrimary records the exact latency of a primary attempt that ended on
// its own: time to first byte for the first_byte trigger, total time for the
// total trigger (the caller picks, consistently per cohort).
//
// Primaries ended by CallerGone or by a fast error must not be recorded at
// all — the caller simply does not call: their elapsed time says nothing
// about how long the answer would have taken, and recording it would pull
// the delay down.
func (e *Estimator) ObservePrimary(c Cohort, now time.Time, latency time.Duration) error {
	return e.ObservePrimaryOn(c, "", now, latency)
}

// ObservePrimaryOn is ObservePrimary for a primary that ran on route: the
// sample joins the cohort's window and the route's (none for route "").
func (e *Estimator) ObservePrimaryOn(c Cohort, route string, now time.Time, latency time.Duration) error {
	if latency < 0 {
		return fmt.Errorf("%w: primary of %s observed at %v", ErrNegativeLatency, c, latency)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	w := e.window(c)
	w.own.add(now, latency.Seconds(), false)
	if r := e.route(w, route); r != nil {
		r.add(now, latency.Seconds(), false)
	}
	return nil
}

// ObserveSuperseded records a primary that was cancelled because another
// attempt won, at the time it had run (elapsed), and reports whether it was
// recorded. Its true latency is unknown but at least elapsed. Dropping it
// would remove exactly the slow primaries from the window and bias the delay
// low — lower delay, more hedges, more dropped primaries, a spiral. So it is
// recorded when elapsed ≥ the current delay: it then counts on the correct
// side of every quantile up to the delay's, which stay exact, while it is a
// lower bound for the tail above. A primary superseded earlier than the
// current delay (the delay has since grown) would land below the delay on
// possibly the wrong side, so it is skipped.
func (e *Estimator) ObserveSuperseded(c Cohort, now time.Time, elapsed time.Duration) (bool, error) {
	return e.ObserveSupersededOn(c, "", now, elapsed)
}

// ObserveSupersededOn is ObserveSuperseded for a primary that ran on route,
// with the rule applied to each window on its own: the sample joins the
// cohort's window when elapsed ≥ the cohort's delay and the route's when
// elapsed ≥ the delay the route's primaries get (RouteDelay), so a route
// with a delay of its own keeps its quantile exact too. It reports whether
// either recorded it.
func (e *Estimator) ObserveSupersededOn(c Cohort, route string, now time.Time, elapsed time.Duration) (bool, error) {
	if elapsed < 0 {
		return false, fmt.Errorf("%w: superseded primary of %s at %v", ErrNegativeLatency, c, elapsed)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	toCohort := elapsed >= e.delayLocked(c, now).Value
	toRoute := route != "" && elapsed >= e.routeDelayLocked(c, route, now).Value
	if !toCohort && !toRoute {
		return false, nil
	}
	w := e.window(c)
	if toCohort {
		w.own.add(now, elapsed.Seconds(), false)
	}
	if r := e.route(w, route); toRoute && r != nil {
		r.add(now, elapsed.Seconds(), false)
	}
	return true, nil
}

// Snapshot returns this replica's own samples of cohort c as the live slots
// of the window ending at now, oldest first, for publishing to peers. Merged
// peer samples are not included, so publishing never echoes them back.
func (e *Estimator) Snapshot(c Cohort, now time.Time) []SlotSnapshot {
	e.mu.Lock()
	defer e.mu.Unlock()
	w, ok := e.cohorts[c]
	if !ok {
		return nil
	}
	return w.own.snapshot(now)
}

// Merge sets the peer samples of cohort c to the union of snaps — the latest
// Snapshot of every other replica — replacing those of the previous Merge, so
// merging the same snapshots twice counts them once. When every replica
// merges every other's latest snapshots, all compute the same delay.
// Snapshots whose slot has rolled out of the window are ignored. On error the
// previous peer samples are kept.
func (e *Estimator) Merge(c Cohort, now time.Time, snaps []SlotSnapshot) error {
	peers := newRing(e.spec, e.cfg.Window, e.cfg.Slots)
	for i, s := range snaps {
		if err := peers.mergeSnapshot(now, s); err != nil {
			return fmt.Errorf("delay: merge snapshot %d of %s: %w", i, c, err)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.window(c).peers = peers
	return nil
}

// Cohorts returns the cohorts the estimator has seen, sorted by Key, so a
// sync loop can publish each one's Snapshot in a stable order.
func (e *Estimator) Cohorts() []Cohort {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]Cohort, 0, len(e.cohorts))
	for c := range e.cohorts {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out
}

func secondsToDuration(s float64) time.Duration {
	if s >= float64(math.MaxInt64)/1e9 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s * 1e9)
}
