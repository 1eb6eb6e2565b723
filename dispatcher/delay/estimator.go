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

// ErrInvalidConfig is wrapped by every configuration error of this package.
var ErrInvalidConfig = errors.New("delay: invalid config")

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
	return c
}

// validate reports every problem of a defaulted config at once.
func (c Options) validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
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
	errs = append(errs, validateWindow(c.Window, c.Slots, c.RelativeAccuracy, c.MaxBins)...)
	return errors.Join(errs...)
}

func validateWindow(window time.Duration, slots int, accuracy float64, maxBins int) []error {
	var errs []error
	if slots < 1 {
		errs = append(errs, fmt.Errorf("%w: slots %d, need at least 1", ErrInvalidConfig, slots))
	} else if window < time.Millisecond*time.Duration(slots) {
		errs = append(errs, fmt.Errorf("%w: window %v too short for %d slots of at least 1ms", ErrInvalidConfig, window, slots))
	}
	if !(accuracy > 0 && accuracy < 1) {
		errs = append(errs, fmt.Errorf("%w: relative accuracy %v not in (0, 1)", ErrInvalidConfig, accuracy))
	}
	if maxBins < 16 {
		errs = append(errs, fmt.Errorf("%w: max bins %d, need at least 16", ErrInvalidConfig, maxBins))
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
	// Warm is true when Value comes from the window's quantile, false while
	// the cohort is still warming up and Value comes from Options.Initial.
	Warm bool
	// Samples is the number of samples in the cohort's window.
	Samples int
	// Estimate is the window quantile before clamping (0 while cold).
	Estimate time.Duration
	// Clamp names the bound that changed the value, if any.
	Clamp Clamp
}

// Estimator keeps a rolling window of primary latencies per cohort and turns
// it into hedge delays. It is pure — no goroutines, no clock: every method
// takes now — so the simulator drives it on virtual time and the live
// runtime on real time, with the same results. It is safe for concurrent use.
type Estimator struct {
	cfg  Options
	spec sketchSpec

	mu      sync.Mutex
	cohorts map[Cohort]*cohortWindow
	scratch *ddsketch.DDSketch // reused to merge slots; guarded by mu
}

// cohortWindow separates this replica's own samples from those merged in
// from peers, so that merging the peers' latest snapshots again replaces
// them instead of counting them twice.
type cohortWindow struct {
	own   ring
	peers ring
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
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return &Estimator{cfg: cfg, spec: spec, cohorts: make(map[Cohort]*cohortWindow), scratch: spec.newSketch()}, nil
}

// Options returns the estimator's configuration with defaults filled in.
func (e *Estimator) Options() Options { return e.cfg }

func (e *Estimator) window(c Cohort) *cohortWindow {
	w, ok := e.cohorts[c]
	if !ok {
		w = &cohortWindow{
			own:   newRing(e.spec, e.cfg.Window, e.cfg.Slots),
			peers: newRing(e.spec, e.cfg.Window, e.cfg.Slots),
		}
		e.cohorts[c] = w
	}
	return w
}

// Delay returns the hedge delay for a group of cohort c starting at now with
// remaining time left before its deadline: the Quantile of the cohort's
// window, clamped to [Min, Max] and then to remaining; Initial until the
// window holds WarmupSamples samples.
func (e *Estimator) Delay(c Cohort, now time.Time, remaining time.Duration) Delay {
	e.mu.Lock()
	defer e.mu.Unlock()
	d := e.delayLocked(c, now)
	if remaining < 0 {
		remaining = 0
	}
	if d.Value > remaining {
		d.Value, d.Clamp = remaining, ClampDeadline
	}
	return d
}

func (e *Estimator) delayLocked(c Cohort, now time.Time) Delay {
	d := Delay{Value: e.cfg.Initial}
	w, ok := e.cohorts[c]
	if !ok {
		return d
	}
	view, _ := w.own.merged(now)
	if peers, _ := w.peers.merged(now); !peers.IsEmpty() {
		e.scratch.Clear()
		// Both views share the estimator's index mapping: MergeWith cannot fail.
		_ = e.scratch.MergeWith(view)
		_ = e.scratch.MergeWith(peers)
		view = e.scratch
	}
	n := view.GetCount()
	d.Samples = int(math.Round(n))
	if n == 0 || d.Samples < e.cfg.WarmupSamples {
		return d
	}
	q, err := view.GetValueAtQuantile(e.cfg.Quantile)
	if err != nil { // empty or bad quantile: both excluded above
		return d
	}
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

// ObservePrimary records the exact latency of a primary attempt that ended on
// its own: time to first byte for the first_byte trigger, total time for the
// total trigger (the caller picks, consistently per cohort).
//
// Primaries ended by CallerGone or by a fast error must not be recorded at
// all — the caller simply does not call: their elapsed time says nothing
// about how long the answer would have taken, and recording it would pull
// the delay down.
func (e *Estimator) ObservePrimary(c Cohort, now time.Time, latency time.Duration) error {
	if latency < 0 {
		return fmt.Errorf("%w: primary of %s observed at %v", ErrNegativeLatency, c, latency)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.window(c).own.add(now, latency.Seconds(), false)
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
	if elapsed < 0 {
		return false, fmt.Errorf("%w: superseded primary of %s at %v", ErrNegativeLatency, c, elapsed)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if elapsed < e.delayLocked(c, now).Value {
		return false, nil
	}
	e.window(c).own.add(now, elapsed.Seconds(), false)
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
