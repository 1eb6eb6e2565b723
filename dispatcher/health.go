package dispatcher

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/dispatcher/route"
	"github.com/hedgerow/hedgerow/schemas"
)

// Route health (docs/architecture.md §5, "Route health"): how each attempt
// on a route ends feeds the picker's success ratio and the route's pool's
// outlier detection, which ejects a route that keeps failing, for every
// replica, through the shared route flags.

// newHealth builds the outlier detection of every pool whose configuration
// enables it.
func newHealth(pools map[string]Pool) (map[string]*route.Health, error) {
	out := make(map[string]*route.Health, len(pools))
	for name, p := range pools {
		if !p.Health.Enabled() {
			continue
		}
		h, err := route.NewHealth(p.Health)
		if err != nil {
			return nil, fmt.Errorf("dispatcher: pool %s: %w", name, err)
		}
		out[name] = h
	}
	return out, nil
}

// routeVerdict says what an ended attempt tells of its route's health, by
// the rule both drivers share (route.Verdict): failed for a transient
// failure of the route, ok for an answer; neither (counted false) for what
// says nothing of the route.
func routeVerdict(e hedge.AttemptEnded) (failed, counted bool) {
	cancelled := e.Outcome == hedge.OutcomeLoserCanceled || e.Outcome == hedge.OutcomeCanceled
	return route.Verdict(e.Status, e.Scope, e.ContractValid, cancelled)
}

// observeRoute feeds an ended attempt into its route's success ratio and its
// pool's outlier detection, and ejects the route when the detection says
// so and the pools it serves can spare it.
func (d *Dispatcher) observeRoute(pool string, e hedge.AttemptEnded) {
	failed, counted := routeVerdict(e)
	if !counted {
		return
	}
	now := d.now()
	_ = d.picker.ObserveOutcome(e.Route, !failed, now)
	h := d.health[pool]
	if h == nil {
		return
	}
	// One decision at a time: two groups seeing a route's third failure
	// together must not eject it twice (doubling its backoff), nor eject two
	// routes of a pool that can spare only one.
	d.ejectMu.Lock()
	defer d.ejectMu.Unlock()
	reason := h.Observe(e.Route, failed, now)
	if reason == "" {
		return
	}
	if !d.mayEject(e.Route, now) {
		d.metrics.ejectionsSkipped.WithLabelValues(e.Route).Inc()
		return
	}
	ttl := h.Eject(e.Route, now)
	for name, other := range d.health {
		if name != pool && slices.Contains(d.pools[name].Routes, e.Route) {
			other.Ejected(e.Route, now.Add(ttl))
		}
	}
	d.metrics.ejections.WithLabelValues(e.Route, reason).Inc()
	d.log.Warn("route ejected", "route", e.Route, "pool", pool, "reason", reason, "for", ttl)
	d.markRoute(e.Route, budgets.RouteEjected, ttl)
}

// judgeStall feeds the primary's stall verdict into its route's stall share
// the first time it is known (route.PrimaryState.Stalled, docs/architecture.md
// §5 "Route choice"): at its first byte, at a hedge's launch (hedged) and at
// its end, after which it is never judged again — a primary that ended
// before the delay without a first byte is a failure, not a stall. The
// simulator judges at the same three moments.
func (g *group) judgeStall(hedged, ended bool) {
	p := g.attempt(1)
	if p == nil || p.role != schemas.RolePrimary || p.stallJudged {
		return
	}
	now := g.d.now()
	stalled, known := route.PrimaryState{Delay: g.stallDelay, Elapsed: now.Sub(p.launchedAt), FirstByte: p.firstByte, Hedged: hedged}.Stalled()
	if known {
		_ = g.d.picker.ObserveStall(p.route, stalled, now)
	}
	p.stallJudged = known || ended
}

// mayEject reports whether every pool holding the route can spare it: none
// is left without a healthy route or past its max ejected percent.
func (d *Dispatcher) mayEject(name string, now time.Time) bool {
	for _, p := range d.pools {
		if slices.Contains(p.Routes, name) && !d.picker.MayEject(p.Routes, name, p.Health.MaxEjectedPercent, now) {
			return false
		}
	}
	return true
}

// routeStates maps the shared flags onto the picker's states.
var routeStates = map[budgets.RouteState]route.State{
	budgets.RouteHealthy:     route.Healthy,
	budgets.RoutePushback:    route.Pushback,
	budgets.RouteQuarantined: route.Quarantined,
	budgets.RouteEjected:     route.Ejected,
}

// markRoute flags a route for ttl: in this replica's picker at once, and for
// every replica through the store, off the request path.
func (d *Dispatcher) markRoute(name string, state budgets.RouteState, ttl time.Duration) {
	d.books.later(func(ctx context.Context) {
		if err := d.store.MarkRoute(ctx, name, state, ttl); err != nil {
			d.log.Warn("route mark failed", "route", name, "state", state, "err", err)
		}
	})
	_ = d.picker.SetState(name, routeStates[state], d.now().Add(ttl))
	d.metrics.routeMarks.WithLabelValues(name, string(state)).Inc()
	d.exportRouteState(name, d.now())
}

// exportRouteState sets the route-state gauge of a route to the state in
// force at now: 1 for it, 0 for the others.
func (d *Dispatcher) exportRouteState(name string, now time.Time) {
	st, err := d.picker.Stats(name, now)
	if err != nil {
		return
	}
	for bs, rs := range routeStates {
		v := 0.0
		if rs == st.State {
			v = 1
		}
		d.metrics.routeState.WithLabelValues(name, string(bs)).Set(v)
	}
}

// reasonCohortPushback is the suppression reason of a hedge refused because
// a route of its pool went into pushback after its group started (scope
// cohort, docs/architecture.md §4 rule 4); a group that started during the
// pushback is not eligible at all (guardrail decision pushback).
const reasonCohortPushback = "cohort_pushback"
