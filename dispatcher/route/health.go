package route

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Outlier-ejection defaults (docs/architecture.md §5, "Route health"):
// three transient failures in a row, or half of at least ten attempts over
// 10 s, eject a route for 10 s, doubling with each ejection that follows
// within MaxEjection of the last, up to 5 min; at most half of a pool's
// routes (at least one, never its last healthy one) are out at once.
const (
	DefaultConsecutiveFailures = 3
	DefaultFailureRate         = 0.5
	DefaultMinRequests         = 10
	DefaultFailureWindow       = 10 * time.Second
	DefaultBaseEjection        = 10 * time.Second
	DefaultMaxEjection         = 5 * time.Minute
	DefaultMaxEjectedPercent   = 50
)

// healthSlots is how many slots the failure-rate window is kept in: the
// window slides by a tenth of its span.
const healthSlots = 10

// Ejection reasons, as Health.Observe reports them and the ejection metric
// counts them.
const (
	EjectConsecutive = "consecutive_failures" // ConsecutiveFailures transient failures in a row
	EjectFailureRate = "failure_rate"         // FailureRate of at least MinRequests attempts in Window
	EjectProbe       = "probe_failed"         // the first result after an ejection was a failure
)

// HealthOptions tunes outlier ejection. A zero ConsecutiveFailures or
// FailureRate turns that trigger off; both zero turn ejection off.
type HealthOptions struct {
	// ConsecutiveFailures transient failures in a row eject a route.
	ConsecutiveFailures int
	// FailureRate, a share in (0,1], of the route's attempts that failed
	// transiently within Window ejects it once it saw MinRequests of them.
	FailureRate float64
	MinRequests int
	Window      time.Duration
	// BaseEjection is how long a first ejection lasts; each ejection that
	// follows within MaxEjection of the previous one's end lasts twice as
	// long as that one, never more than MaxEjection.
	BaseEjection time.Duration
	MaxEjection  time.Duration
	// MaxEjectedPercent bounds the share of a pool's routes ejected at once
	// (at least one may be, never the last healthy one). Health does not
	// use it: the caller passes it to Picker.MayEject.
	MaxEjectedPercent int
}

// DefaultHealthOptions returns the defaults above.
func DefaultHealthOptions() HealthOptions {
	return HealthOptions{
		ConsecutiveFailures: DefaultConsecutiveFailures,
		FailureRate:         DefaultFailureRate,
		MinRequests:         DefaultMinRequests,
		Window:              DefaultFailureWindow,
		BaseEjection:        DefaultBaseEjection,
		MaxEjection:         DefaultMaxEjection,
		MaxEjectedPercent:   DefaultMaxEjectedPercent,
	}
}

// Validate reports a configuration Health cannot run.
func (c HealthOptions) Validate() error {
	var errs []error
	if c.ConsecutiveFailures < 0 {
		errs = append(errs, fmt.Errorf("consecutive failures %d is negative", c.ConsecutiveFailures))
	}
	if c.FailureRate < 0 || c.FailureRate > 1 {
		errs = append(errs, fmt.Errorf("failure rate %v is outside [0,1]", c.FailureRate))
	}
	if c.FailureRate > 0 && (c.MinRequests < 1 || c.Window <= 0) {
		errs = append(errs, fmt.Errorf("a failure rate needs a positive min requests (%d) and window (%v)", c.MinRequests, c.Window))
	}
	if c.MaxEjectedPercent < 0 || c.MaxEjectedPercent > 100 {
		errs = append(errs, fmt.Errorf("max ejected percent %d is outside [0,100]", c.MaxEjectedPercent))
	}
	if c.Enabled() && (c.BaseEjection <= 0 || c.MaxEjection < c.BaseEjection) {
		errs = append(errs, fmt.Errorf("ejection %v..%v: base must be positive and max at least base", c.BaseEjection, c.MaxEjection))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("route: health: %w", err)
	}
	return nil
}

// Enabled reports whether any trigger can eject a route.
func (c HealthOptions) Enabled() bool { return c.ConsecutiveFailures > 0 || c.FailureRate > 0 }

// Health is outlier ejection, as Envoy's outlier detection: it watches how
// each route's attempts end and says when a route should be ejected. It is
// pure (the caller passes the time) and safe for concurrent use. It
// decides nothing about the pool: the caller checks Picker.MayEject, then
// records the ejection with Eject and shares it through the route flags.
//
// While a route is ejected its results (attempts still in flight when it
// went out) are ignored. When the ejection ends the route is probed back
// in: its first result decides — a failure ejects it again at once, for
// twice as long; a success returns it to normal watch.
type Health struct {
	cfg HealthOptions

	mu     sync.Mutex
	routes map[string]*routeHealth
}

type routeHealth struct {
	consecutive int
	slots       [healthSlots]healthSlot

	// ejections counts the ejections in a row (each within MaxEjection of
	// the previous one's end) and sizes the next one.
	ejections    int
	ejectedUntil time.Time
	// probing: the route is back from an ejection and its next result
	// decides whether it stays.
	probing bool
}

// healthSlot counts one slot's attempts; start identifies the slot.
type healthSlot struct {
	start      int64 // slot number since the Unix epoch, in slot spans
	ok, failed int
}

// NewHealth returns a Health running cfg.
func NewHealth(cfg HealthOptions) (*Health, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Health{cfg: cfg, routes: map[string]*routeHealth{}}, nil
}

func (h *Health) route(name string) *routeHealth {
	rh := h.routes[name]
	if rh == nil {
		rh = &routeHealth{}
		h.routes[name] = rh
	}
	return rh
}

// Observe records how one attempt on route name ended at now — failed for a
// transient failure, else a success — and returns why the route should be
// ejected now, or "" when it should not. Results while the route is
// ejected are ignored.
func (h *Health) Observe(name string, failed bool, now time.Time) string {
	if !h.cfg.Enabled() {
		return ""
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	rh := h.route(name)
	if now.Before(rh.ejectedUntil) {
		return ""
	}
	if rh.probing {
		rh.probing = false
		if failed {
			return EjectProbe
		}
	}
	sl := h.slot(rh, now)
	if !failed {
		rh.consecutive = 0
		sl.ok++
		return ""
	}
	rh.consecutive++
	sl.failed++
	if c := h.cfg.ConsecutiveFailures; c > 0 && rh.consecutive >= c {
		return EjectConsecutive
	}
	if h.cfg.FailureRate > 0 {
		ok, bad := h.window(rh, now)
		if n := ok + bad; n >= h.cfg.MinRequests && float64(bad) >= h.cfg.FailureRate*float64(n) {
			return EjectFailureRate
		}
	}
	return ""
}

// slotSpan is the span of one slot of the failure-rate window.
func (h *Health) slotSpan() time.Duration {
	return max(h.cfg.Window/healthSlots, time.Millisecond)
}

// slot returns now's slot of rh's window, reset if it held an older one.
func (h *Health) slot(rh *routeHealth, now time.Time) *healthSlot {
	n := now.UnixNano() / int64(h.slotSpan())
	sl := &rh.slots[n%healthSlots]
	if sl.start != n {
		*sl = healthSlot{start: n}
	}
	return sl
}

// window sums the attempts of rh's slots within the window ending at now.
func (h *Health) window(rh *routeHealth, now time.Time) (ok, failed int) {
	n := now.UnixNano() / int64(h.slotSpan())
	for _, sl := range rh.slots {
		if sl.start > n-healthSlots && sl.start <= n {
			ok, failed = ok+sl.ok, failed+sl.failed
		}
	}
	return ok, failed
}

// Eject records that route name is ejected from now and returns for how
// long: BaseEjection for a first ejection, twice the previous one for an
// ejection that follows within MaxEjection of the previous one's end, at
// most MaxEjection. Its failure counts start afresh, and its results are
// ignored until the ejection ends; then it is probed back in.
func (h *Health) Eject(name string, now time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	rh := h.route(name)
	if rh.ejections > 0 && now.Sub(rh.ejectedUntil) >= h.cfg.MaxEjection {
		rh.ejections = 0 // it stayed in long enough: start again from the base
	}
	ttl := h.cfg.BaseEjection
	for i := 0; i < rh.ejections && ttl < h.cfg.MaxEjection; i++ {
		ttl *= 2
	}
	ttl = min(ttl, h.cfg.MaxEjection)
	rh.ejections++
	rh.ejectedUntil, rh.probing, rh.consecutive = now.Add(ttl), true, 0
	rh.slots = [healthSlots]healthSlot{}
	return ttl
}

// Ejected records an ejection of route name that another replica decided,
// seen through the shared route flags as lasting at least until until: the
// route's results are ignored until then, and it is probed back in after.
func (h *Health) Ejected(name string, until time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	rh := h.route(name)
	if until.After(rh.ejectedUntil) {
		rh.ejectedUntil = until
	}
	rh.probing, rh.consecutive = true, 0
}
