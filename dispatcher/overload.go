package dispatcher

import (
	"slices"
	"sync"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/schemas"
)

// overloadLogEvery is the least time between two overload log lines of one
// pool: a saturated pool refuses many offers a second, and one line says it.
const overloadLogEvery = 10 * time.Second

// overload keeps, per pool, whether its last offer came back Busy: while it
// did, the dispatcher sends no hedge or replacement into it, from any group
// (docs/architecture.md §4 rule 4: never answer overload with more load).
// It is safe for concurrent use.
type overload struct {
	mu    sync.Mutex
	pools map[string]*poolLoad
}

// poolLoad is one pool's overload state.
type poolLoad struct {
	saturated bool      // the pool's last offer came back Busy
	lastBusy  time.Time // when
	logged    time.Time // when its overload was last logged
}

func (o *overload) pool(name string) *poolLoad {
	if o.pools == nil {
		o.pools = map[string]*poolLoad{}
	}
	p := o.pools[name]
	if p == nil {
		p = &poolLoad{}
		o.pools[name] = p
	}
	return p
}

// busy notes a Busy from pool at now. It reports whether the overload is
// to be logged: the first time, then at most once per overloadLogEvery.
func (o *overload) busy(pool string, now time.Time) (log bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	p := o.pool(pool)
	p.saturated, p.lastBusy = true, now
	if p.logged.IsZero() || now.Sub(p.logged) >= overloadLogEvery {
		p.logged = now
		return true
	}
	return false
}

// accepted notes that a worker of pool took an offer: it had room. It
// reports whether the pool was saturated until now.
func (o *overload) accepted(pool string) (was bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if p := o.pools[pool]; p != nil && p.saturated {
		p.saturated = false
		return true
	}
	return false
}

// saturated reports whether pool's last offer came back Busy, within
// fresh of now: a saturated pool keeps answering its waiting attempts Busy
// (every 80 ms at most), so an older Busy with nothing since says nothing
// of the pool now.
func (o *overload) saturated(pool string, now time.Time, fresh time.Duration) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	p := o.pools[pool]
	return p != nil && p.saturated && now.Sub(p.lastBusy) < fresh
}

// onBusy records a worker's Busy for attempt a: backpressure, not a
// failure (docs/architecture.md §4 rule 4).
func (g *group) onBusy(a *attemptRun) {
	d := g.d
	d.metrics.busy.WithLabelValues(g.sub.Pool).Inc()
	d.metrics.saturated.WithLabelValues(g.sub.Pool).Set(1)
	if d.overload.busy(g.sub.Pool, d.now()) {
		d.log.Warn("pool overloaded: workers at their in-flight limit; attempts wait for room, hedges and replacements are held back",
			"pool", g.sub.Pool, "route", a.route, "queue_wait", g.queueWait, "every", overloadLogEvery)
	}
}

// onAccepted records that a worker of route, of the group's pool, took an
// attempt: the pool has capacity, and the route a worker.
func (g *group) onAccepted(route string) {
	if g.d.overload.accepted(g.sub.Pool) {
		g.d.metrics.saturated.WithLabelValues(g.sub.Pool).Set(0)
	}
	_ = g.d.picker.MarkServed(route)
}

// unservedFor is how long a route NATS found no worker for is passed over
// by the picker (route.Picker.MarkUnserved), unless an Accept from it comes
// first. Short: a worker that restarts is found again within it, and
// looking costs one no-responders, not a failed request.
const unservedFor = time.Second

// reoffer publishes a refused attempt again, under its own number and
// inbox, to the least-loaded other route of the pool (the refusing route
// when no other is healthy), and tells the engine where it went. An
// attempt that found no worker (Reoffer.Unserved) marks its route so the
// next picks pass it over, and goes only to a route not so marked: with
// none left it ends no_responders, a transient failure.
func (g *group) reoffer(r hedge.Reoffer) hedge.Event {
	d := g.d
	a := g.attempt(r.Attempt)
	if a == nil {
		return nil
	}
	if r.Unserved {
		d.metrics.unserved.WithLabelValues(r.Busy).Inc()
		_ = d.picker.MarkUnserved(r.Busy, d.now().Add(d.unservedFor))
	}
	pick := func(refused []string) (string, bool) {
		pool := g.routes
		if len(refused) > 0 {
			pool = slices.DeleteFunc(slices.Clone(pool), func(name string) bool { return slices.Contains(refused, name) })
		}
		return d.picker.PickLeastLoaded(pool, r.Busy, d.now())
	}
	target, ok := pick(nil)
	if ok {
		// Another route takes the offer only with capacity to spare (a
		// provider key's limits, capacity.go). The refusing route's was
		// spent as the attempt went to it, and its provider was not
		// called: it is given back when the offer moves.
		var charge capacityCharge
		if target, charge, ok, _ = g.place(target, pick); ok {
			d.giveBack(a.charge)
			a.charge = charge
		}
	}
	switch {
	case !ok && r.Unserved:
		return hedge.Result{Attempt: a.n, Status: schemas.StatusNoResponders, Scope: schemas.ScopeTransient}
	case !ok:
		target = r.Busy
	}
	_ = d.picker.Release(a.route)
	_ = d.picker.Acquire(target)
	a.route = target
	d.metrics.reoffers.WithLabelValues(g.sub.Pool).Inc()
	deadline := g.eng.Deadline()
	g.publishAttempt(a, deadline, deadline.Sub(d.now()))
	return hedge.Reoffered{Attempt: r.Attempt, Route: target}
}

// refuseIntoSaturation is why no hedge or replacement may go to the
// group's pool now ("" when it may).
func (g *group) refuseIntoSaturation() string {
	if g.d.overload.saturated(g.sub.Pool, g.d.now(), max(g.queueWait, time.Second)) {
		return "overloaded"
	}
	return ""
}

// overloadedRetryAfter is the Retry-After of a group that failed
// overloaded: the pool's queue wait, at least a second.
func (g *group) overloadedRetryAfter() time.Duration {
	return max(g.queueWait, time.Second)
}
