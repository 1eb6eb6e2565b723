package redisstore

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/budgets"
)

// MarkRoute implements budgets.Store: one script call on the route's flags.
func (s *Store) MarkRoute(ctx context.Context, route string, state budgets.RouteState, ttl time.Duration) error {
	field := "p"
	switch state {
	case budgets.RouteQuarantined:
		field = "q"
	case budgets.RouteEjected:
		field = "e"
	}
	return s.roundTrip(ctx, "mark route", budgets.ValidateRouteMark(route, state, ttl), func(ctx context.Context, b *batch) reply {
		now := s.now().UnixMilli()
		return b.eval(ctx, markScript, []string{s.keys.routeFlags(entityHash(route))},
			now, field, now+millisCeil(ttl), graceMs)
	})
}

// RouteStates implements budgets.Store, as RouteSnapshot.
func (s *Store) RouteStates(ctx context.Context, routes []string) (map[string]budgets.RouteState, error) {
	states, _, err := s.readRoutes(ctx, "route states", routes)
	return states, err
}

// RouteSnapshot implements budgets.Store in one round trip: one batch of an
// HMGET of the flags and a ZCOUNT of the live leases per route, whatever the
// number of routes, judged against one reading of the store's clock. Both
// keys sit in the route's hash tag, so even on a cluster each route's node
// is asked once.
func (s *Store) RouteSnapshot(ctx context.Context, routes []string) (map[string]budgets.RouteState, map[string]int, error) {
	return s.readRoutes(ctx, "route snapshot", routes)
}

func (s *Store) readRoutes(ctx context.Context, op string, routes []string) (map[string]budgets.RouteState, map[string]int, error) {
	if err := ended(ctx, op); err != nil {
		return nil, nil, err
	}
	states := make(map[string]budgets.RouteState, len(routes))
	counts := make(map[string]int, len(routes))
	if len(routes) == 0 {
		return states, counts, nil
	}
	parent := ctx
	ctx, cancel, err := s.start(ctx, op)
	if err != nil {
		return nil, nil, err
	}
	defer cancel()
	now := s.now().UnixMilli()
	after := "(" + strconv.FormatInt(now, 10)
	b := newBatch(s.client)
	flags := make([]*redis.SliceCmd, len(routes))
	leases := make([]*redis.IntCmd, len(routes))
	for i, r := range routes {
		h := entityHash(r)
		flags[i] = b.pipe.HMGet(ctx, s.keys.routeFlags(h), "q", "p", "e")
		leases[i] = b.pipe.ZCount(ctx, s.keys.routeLeases(h), after, "+inf")
	}
	s.send(parent, ctx, b)
	for i, r := range routes {
		vals, err := flags[i].Result()
		if err != nil {
			return nil, nil, failure(parent, op, err)
		}
		n, err := leases[i].Result()
		if err != nil {
			return nil, nil, failure(parent, op, err)
		}
		switch {
		case now < untilField(vals, 0):
			states[r] = budgets.RouteQuarantined
		case now < untilField(vals, 1):
			states[r] = budgets.RoutePushback
		case now < untilField(vals, 2):
			states[r] = budgets.RouteEjected
		default:
			states[r] = budgets.RouteHealthy
		}
		counts[r] = int(n)
	}
	return states, counts, nil
}

// AcquireLease implements budgets.Store: one script call on the route's
// leases.
func (s *Store) AcquireLease(ctx context.Context, route, holder string, ttl time.Duration) error {
	return s.roundTrip(ctx, "acquire lease", budgets.ValidateLease(route, holder, ttl), func(ctx context.Context, b *batch) reply {
		now := s.now().UnixMilli()
		return b.eval(ctx, leaseScript, []string{s.keys.routeLeases(entityHash(route))},
			now, holder, now+millisCeil(ttl), graceMs)
	})
}

// ReleaseLease implements budgets.Store: one ZREM.
func (s *Store) ReleaseLease(ctx context.Context, route, holder string) error {
	return s.roundTrip(ctx, "release lease", nil, func(ctx context.Context, b *batch) reply {
		return b.pipe.ZRem(ctx, s.keys.routeLeases(entityHash(route)), holder)
	})
}

// InFlight implements budgets.Store, as RouteSnapshot.
func (s *Store) InFlight(ctx context.Context, routes []string) (map[string]int, error) {
	_, counts, err := s.readRoutes(ctx, "in flight", routes)
	return counts, err
}
