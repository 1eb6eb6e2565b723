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
	if err := ended(ctx, "mark route"); err != nil {
		return err
	}
	if err := budgets.ValidateRouteMark(route, state, ttl); err != nil {
		return err
	}
	field := "p"
	if state == budgets.RouteQuarantined {
		field = "q"
	}
	parent := ctx
	ctx, cancel, err := s.start(ctx, "mark route")
	if err != nil {
		return err
	}
	defer cancel()
	now := s.now().UnixMilli()
	b := newBatch(s.client)
	call := b.eval(ctx, markScript, []string{s.keys.routeFlags(entityHash(route))},
		now, field, now+millisCeil(ttl), graceMs)
	s.send(parent, ctx, b)
	if err := call.cmd.Err(); err != nil {
		return failure(parent, "mark route", err)
	}
	return nil
}

// RouteStates implements budgets.Store: one batch of HMGETs, whatever the
// number of routes; the flags are judged against the store's clock.
func (s *Store) RouteStates(ctx context.Context, routes []string) (map[string]budgets.RouteState, error) {
	if err := ended(ctx, "route states"); err != nil {
		return nil, err
	}
	states := make(map[string]budgets.RouteState, len(routes))
	if len(routes) == 0 {
		return states, nil
	}
	parent := ctx
	ctx, cancel, err := s.start(ctx, "route states")
	if err != nil {
		return nil, err
	}
	defer cancel()
	now := s.now().UnixMilli()
	b := newBatch(s.client)
	cmds := make([]*redis.SliceCmd, len(routes))
	for i, r := range routes {
		cmds[i] = b.pipe.HMGet(ctx, s.keys.routeFlags(entityHash(r)), "q", "p")
	}
	s.send(parent, ctx, b)
	for i, r := range routes {
		vals, err := cmds[i].Result()
		if err != nil {
			return nil, failure(parent, "route states", err)
		}
		switch {
		case now < untilField(vals, 0):
			states[r] = budgets.RouteQuarantined
		case now < untilField(vals, 1):
			states[r] = budgets.RoutePushback
		default:
			states[r] = budgets.RouteHealthy
		}
	}
	return states, nil
}

// AcquireLease implements budgets.Store: one script call on the route's
// leases.
func (s *Store) AcquireLease(ctx context.Context, route, holder string, ttl time.Duration) error {
	if err := ended(ctx, "acquire lease"); err != nil {
		return err
	}
	if err := budgets.ValidateLease(route, holder, ttl); err != nil {
		return err
	}
	parent := ctx
	ctx, cancel, err := s.start(ctx, "acquire lease")
	if err != nil {
		return err
	}
	defer cancel()
	now := s.now().UnixMilli()
	b := newBatch(s.client)
	call := b.eval(ctx, leaseScript, []string{s.keys.routeLeases(entityHash(route))},
		now, holder, now+millisCeil(ttl), graceMs)
	s.send(parent, ctx, b)
	if err := call.cmd.Err(); err != nil {
		return failure(parent, "acquire lease", err)
	}
	return nil
}

// ReleaseLease implements budgets.Store: one ZREM.
func (s *Store) ReleaseLease(ctx context.Context, route, holder string) error {
	if err := ended(ctx, "release lease"); err != nil {
		return err
	}
	parent := ctx
	ctx, cancel, err := s.start(ctx, "release lease")
	if err != nil {
		return err
	}
	defer cancel()
	b := newBatch(s.client)
	cmd := b.pipe.ZRem(ctx, s.keys.routeLeases(entityHash(route)), holder)
	s.send(parent, ctx, b)
	if err := cmd.Err(); err != nil {
		return failure(parent, "release lease", err)
	}
	return nil
}

// InFlight implements budgets.Store: one batch of ZCOUNTs of the leases
// that expire after now, whatever the number of routes.
func (s *Store) InFlight(ctx context.Context, routes []string) (map[string]int, error) {
	if err := ended(ctx, "in flight"); err != nil {
		return nil, err
	}
	counts := make(map[string]int, len(routes))
	if len(routes) == 0 {
		return counts, nil
	}
	parent := ctx
	ctx, cancel, err := s.start(ctx, "in flight")
	if err != nil {
		return nil, err
	}
	defer cancel()
	after := "(" + strconv.FormatInt(s.now().UnixMilli(), 10)
	b := newBatch(s.client)
	cmds := make([]*redis.IntCmd, len(routes))
	for i, r := range routes {
		cmds[i] = b.pipe.ZCount(ctx, s.keys.routeLeases(entityHash(r)), after, "+inf")
	}
	s.send(parent, ctx, b)
	for i, r := range routes {
		n, err := cmds[i].Result()
		if err != nil {
			return nil, failure(parent, "in flight", err)
		}
		counts[r] = int(n)
	}
	return counts, nil
}
