package dispatcher

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/budgets/slice"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/schemas"
)

// RouteCapacity is what the dispatcher asks of the gateway's slices of
// its routes' published limits (docs/architecture.md §7, "Route
// capacity"): to spend units of a ceiling, in memory most of the time,
// and to give back what an attempt spent without reaching its provider.
// *slice.Slices is one.
type RouteCapacity interface {
	// TakeN spends n units of r at once (n at most its burst). Refused,
	// wait is how long until some are likely there.
	TakeN(ctx context.Context, r slice.Rate, n float64) (ok bool, wait time.Duration)
	// RetakeN is TakeN for an attempt that waited after a refusal, tried
	// again: the region's leases do not count its demand again (§14).
	RetakeN(ctx context.Context, r slice.Rate, n float64) (ok bool, wait time.Duration)
	// Adjust gives units (> 0) of r back to the gateway's slice.
	Adjust(r slice.Rate, units float64)
}

// RouteLimits are a provider key's published limits on a route (config's
// routes[].limits): requests, and input plus output tokens, per minute.
// Zero in a field is no limit there.
type RouteLimits struct {
	RequestsPerMinute int64
	TokensPerMinute   int64
}

// Kinds of the route capacity's ceilings (slice.Rate.Kind), which label
// the slices' metrics.
const (
	KindRouteRequests = "route_requests"
	KindRouteTokens   = "route_tokens"
)

// RouteRates are the ceilings a route's limits are spent from: one request
// token per attempt, of a bucket refilled at the limit and holding one
// second's worth (at least one); and the attempt's estimated tokens, of a
// bucket holding a minute's worth, the provider's own, so the largest
// request a provider's per-minute limit could ever admit fits whole. A
// zero Rate (no Key) is no limit. Every gateway of a region names a
// route's ceilings alike, so their slices split one ceiling.
func RouteRates(route string, l RouteLimits) (requests, tokens slice.Rate) {
	if l.RequestsPerMinute > 0 {
		perSecond := float64(l.RequestsPerMinute) / 60
		requests = slice.Rate{Key: "route:" + route + ":requests", Kind: KindRouteRequests,
			PerSecond: perSecond, Burst: max(1, math.Ceil(perSecond))}
	}
	if l.TokensPerMinute > 0 {
		tokens = slice.Rate{Key: "route:" + route + ":tokens", Kind: KindRouteTokens,
			PerSecond: float64(l.TokensPerMinute) / 60, Burst: float64(l.TokensPerMinute)}
	}
	return requests, tokens
}

// routeRates are one limited route's ceilings.
type routeRates struct{ requests, tokens slice.Rate }

// newRouteRates builds the ceilings of every route with limits; routes
// must name every known route.
func newRouteRates(limits map[string]RouteLimits, routes []string) (map[string]routeRates, error) {
	out := map[string]routeRates{}
	for _, name := range slices.Sorted(maps.Keys(limits)) {
		l := limits[name]
		switch {
		case !slices.Contains(routes, name):
			return nil, fmt.Errorf("dispatcher: limits of route %q, which is not a route", name)
		case l.RequestsPerMinute < 0 || l.TokensPerMinute < 0:
			return nil, fmt.Errorf("dispatcher: route %q: limits must not be negative (%+v)", name, l)
		case l == RouteLimits{}:
			continue
		}
		req, tok := RouteRates(name, l)
		for _, r := range []slice.Rate{req, tok} {
			if err := r.Validate(); r.Key != "" && err != nil {
				return nil, fmt.Errorf("dispatcher: route %q: %w", name, err)
			}
		}
		out[name] = routeRates{requests: req, tokens: tok}
	}
	return out, nil
}

// capacityRetryFloor is the least pause between two tries of an attempt
// waiting for a route's capacity: a slice's wait can be a millisecond
// (until one more token, when a large request needs many).
const capacityRetryFloor = 10 * time.Millisecond

// capacityCharge is what an attempt spent of a limited route's capacity:
// one request when the route has requests_per_minute, and tokens of its
// tokens_per_minute. The zero charge is none (a route without limits).
type capacityCharge struct {
	route  string
	tokens float64
}

// takeCapacity spends one request and the attempt's estimated tokens of
// route's limits, when it has limits: whether the route may take the
// attempt now and what it spent, or, when not, how long until it likely
// may. The request token is spent first, and given back when the tokens
// are refused.
func (g *group) takeCapacity(route string) (capacityCharge, bool, time.Duration) {
	d := g.d
	rates, limited := d.capRates[route]
	if d.capacity == nil || !limited {
		return capacityCharge{}, true, 0
	}
	ctx := context.Background() // the slices bound their granter calls
	take := d.capacity.TakeN
	if g.waiting != nil {
		take = d.capacity.RetakeN // its demand was counted at its first try
	}
	if rates.requests.Key != "" {
		if ok, wait := take(ctx, rates.requests, 1); !ok {
			d.metrics.capacityRefused.WithLabelValues(route, "requests").Inc()
			return capacityCharge{}, false, wait
		}
	}
	charge := capacityCharge{route: route}
	if rates.tokens.Key != "" {
		// A request estimated above the whole bucket is charged the whole
		// bucket, as a provider's own does: it waits for a full minute's
		// worth rather than being refused for ever.
		n := min(float64(max(g.estimatedTokens(), 1)), rates.tokens.Burst)
		if ok, wait := take(ctx, rates.tokens, n); !ok {
			d.metrics.capacityRefused.WithLabelValues(route, "tokens").Inc()
			d.giveBack(capacityCharge{route: route})
			return capacityCharge{}, false, wait
		}
		charge.tokens = n
	}
	return charge, true, 0
}

// giveBack returns a charge to the gateway's slices: spent on an attempt
// that never reached its provider (a worker refused it Busy, or none was
// there), or on a request whose tokens were refused.
func (d *Dispatcher) giveBack(c capacityCharge) {
	rates, limited := d.capRates[c.route]
	if d.capacity == nil || !limited {
		return
	}
	if rates.requests.Key != "" {
		d.capacity.Adjust(rates.requests, 1)
	}
	if rates.tokens.Key != "" && c.tokens > 0 {
		d.capacity.Adjust(rates.tokens, c.tokens)
	}
}

// charged keeps what the attempt the engine launches on reservation res
// spent, until its Launch (or the Release of a grant it did not launch).
func (g *group) charged(res hedge.ReservationID, c capacityCharge) {
	if c.route == "" {
		return
	}
	if g.charges == nil {
		g.charges = map[hedge.ReservationID]capacityCharge{}
	}
	g.charges[res] = c
}

// launchCharge hands the charge of a launched attempt's reservation to
// the attempt.
func (g *group) launchCharge(a *attemptRun, res hedge.ReservationID) {
	if c, ok := g.charges[res]; ok {
		delete(g.charges, res)
		a.charge = c
	}
}

// releaseCharge gives back the charge of a grant the engine released
// without launching it (granted after the group was decided, or after
// its reason went away).
func (g *group) releaseCharge(res hedge.ReservationID) {
	if c, ok := g.charges[res]; ok {
		delete(g.charges, res)
		g.d.giveBack(c)
	}
}

// endCharge settles the charge of an attempt that ended: given back when
// its provider was never called (it ended Busy past the queue wait, or
// found no worker); otherwise it stands, at the estimate, as a provider's
// limiter counts a request (OpenAI's: input and max_tokens, at its start).
func (g *group) endCharge(a *attemptRun, status schemas.StatusClass) {
	if status == schemas.StatusBusy || status == schemas.StatusNoResponders {
		g.d.giveBack(a.charge)
	}
	a.charge = capacityCharge{}
}

// estimatedTokens is what an attempt of the group may cost the provider's
// tokens-per-minute limit: the estimate its spend reservation takes
// (input, and max_tokens or the cohort's output estimate, §7).
func (g *group) estimatedTokens() int64 {
	s := g.spend()
	return s.InputUnits + s.OutputUnits
}

// place finds a route with capacity for an attempt: first when it has
// some (pick's first offer when first is empty), else the next route pick
// offers without the routes refused so far, each tried once. It answers
// the route that took the attempt, or, when none could, the shortest wait
// a refusal named.
func (g *group) place(first string, pick func(refused []string) (string, bool)) (string, capacityCharge, bool, time.Duration) {
	var refused []string
	var wait time.Duration
	route := first
	if route == "" {
		var ok bool
		if route, ok = pick(nil); !ok {
			return "", capacityCharge{}, false, 0
		}
	}
	for !slices.Contains(refused, route) {
		charge, ok, w := g.takeCapacity(route)
		if ok {
			return route, charge, true, 0
		}
		refused = append(refused, route)
		if wait == 0 || w < wait {
			wait = w
		}
		next, found := pick(refused)
		if !found {
			break
		}
		route = next
	}
	return "", capacityCharge{}, false, wait
}

// capacityWait is an attempt waiting for a route's capacity within its
// pool's queue wait: the engine's question — the Admit of a primary, the
// AskHedgeBudget of a replacement — stays unanswered, with its
// reservation held, until a route of the pool has capacity or the wait
// ends. The group's loop goes on meanwhile; a timer posts capacityRetry.
type capacityWait struct {
	seq         int                  // its retries' (capacityRetry.seq): a retry of an earlier wait is stale
	until       time.Time            // the queue wait's end, never past the deadline
	primary     bool                 // an Admit waits; else ask's AskHedgeBudget
	ask         hedge.AskHedgeBudget // the replacement's question
	reservation hedge.ReservationID  // granted, and held while it waits
}

// capacityRetry asks the group's loop to try its waiting attempt again:
// the one of wait seq, and no later one.
type capacityRetry struct{ seq int }

func (capacityRetry) isGroupInput() {}

// placePrimary sends an admitted primary to a route with capacity: the
// route picked as the group started, else another of the pool
// (PickPrimaryExcept); with none it waits within the pool's queue wait,
// else the group fails overloaded (Retry-After: the slices' wait). It
// answers the Admit, or nil while it waits.
func (g *group) placePrimary(res hedge.ReservationID) hedge.Event {
	d := g.d
	first := g.primary
	if g.waiting != nil {
		first = "" // a retry: the pick decides again
	}
	route, charge, ok, wait := g.place(first, func(refused []string) (string, bool) {
		d.rngMu.Lock()
		defer d.rngMu.Unlock()
		return d.picker.PickPrimaryExcept(g.routes, refused, d.now(), d.rng)
	})
	if ok {
		g.waiting = nil
		g.primary = route
		g.charged(res, charge)
		g.countPrimary()
		return hedge.Admitted{Allowed: true, Route: route, Reservation: res}
	}
	if g.waitForCapacity(wait, capacityWait{primary: true, reservation: res}) {
		return nil
	}
	g.releaseReservation(res)
	return hedge.Admitted{Allowed: false, Reason: hedge.ReasonRouteCapacity, Error: schemas.ErrOverloaded}
}

// placeExtra sends a granted hedge or replacement to a route with
// capacity: target (empty on a retry), else another the hedge pick offers.
// A hedge with none is suppressed route_capacity at once; a replacement
// behaves as a primary: it waits within the pool's queue wait, else is
// refused route_capacity (and a group left with nothing fails
// overloaded). It answers the AskHedgeBudget, or nil while it waits.
func (g *group) placeExtra(a hedge.AskHedgeBudget, target string, res hedge.ReservationID) hedge.Event {
	d := g.d
	route, charge, ok, wait := g.place(target, func(refused []string) (string, bool) {
		d.rngMu.Lock()
		defer d.rngMu.Unlock()
		return d.picker.PickHedge(g.candidates(a.Role), append(slices.Clone(a.Exclude), refused...), d.now(), d.rng, a.SameRoute)
	})
	if ok {
		g.waiting = nil
		g.charged(res, charge)
		g.countExtra(a.Role)
		return hedge.HedgeBudgetDecided{Allowed: true, Route: route, Reservation: res}
	}
	if a.Role == schemas.RoleReplacement && g.waitForCapacity(wait, capacityWait{ask: a, reservation: res}) {
		return nil
	}
	g.releaseReservation(res)
	return hedge.HedgeBudgetDecided{Allowed: false, Reason: hedge.ReasonRouteCapacity}
}

// waitForCapacity arms a retry of the waiting attempt w after wait (at
// least capacityRetryFloor) when that is within the queue wait, which
// runs from the attempt's first refusal and never past the deadline. It
// reports false, and keeps wait as the group's Retry-After, when the
// attempt must give up instead, or the group was decided meanwhile.
func (g *group) waitForCapacity(wait time.Duration, w capacityWait) bool {
	d := g.d
	now := d.now()
	if g.waiting == nil {
		g.capacitySeq++
		w.seq, w.until = g.capacitySeq, now.Add(g.queueWait)
		if dl := g.eng.Deadline(); dl.Before(w.until) {
			w.until = dl
		}
	} else {
		w.seq, w.until = g.waiting.seq, g.waiting.until
	}
	at := now.Add(max(wait, capacityRetryFloor))
	if g.decided || at.After(w.until) {
		g.waiting = nil
		g.capacityAfter = wait
		return false
	}
	g.armInput(at, capacityRetry{seq: w.seq})
	g.waiting = &w
	return true
}

// retryCapacity tries the waiting attempt again: the engine's answer,
// or nil while it waits on. A group decided meanwhile (its caller left,
// its deadline passed, another attempt won) gives the attempt up at once.
func (g *group) retryCapacity(r capacityRetry) hedge.Event {
	w := g.waiting
	if w == nil || w.seq != r.seq {
		return nil // stale: that wait ended
	}
	if g.decided {
		g.waiting = nil
		g.releaseReservation(w.reservation)
		if w.primary {
			return hedge.Admitted{Allowed: false, Reason: hedge.ReasonRouteCapacity, Error: schemas.ErrOverloaded}
		}
		return hedge.HedgeBudgetDecided{Allowed: false, Reason: hedge.ReasonRouteCapacity}
	}
	if w.primary {
		return g.placePrimary(w.reservation)
	}
	return g.placeExtra(w.ask, "", w.reservation)
}

// releaseReservation gives back a reservation the engine never launched
// an attempt on, as its Release action does.
func (g *group) releaseReservation(res hedge.ReservationID) {
	if res == "" || strings.HasPrefix(string(res), localReservation) {
		return
	}
	g.d.books.end(g.id, budgets.Ending{Reservation: budgets.ReservationID(res), Release: true})
}
