package tenantlimit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/budgets/slice"
)

// Options configure a Limiter.
type Options struct {
	// Limits are the limits by tenant name; a tenant not named, or the
	// empty tenant (no tenants configured), is not limited.
	Limits map[string]Limit
	// Registerer takes the refusal counter; nil registers none.
	Registerer prometheus.Registerer
}

// Limiter applies the tenants' limits on a gateway's slices: both front
// doors call Admit before a request's group runs and the release it
// returns when the request ends, on every path. It is safe for concurrent
// use.
type Limiter struct {
	slices   *slice.Slices
	limits   map[string]Limit
	refusals *prometheus.CounterVec
}

// New returns a Limiter applying opts.Limits on slices.
func New(slices *slice.Slices, opts Options) (*Limiter, error) {
	if slices == nil {
		return nil, errors.New("tenantlimit: the gateway's slices are required")
	}
	for tenant, l := range opts.Limits {
		if l.RequestsPerSecond < 0 || l.Burst < 0 || l.MaxConcurrent < 0 ||
			math.IsNaN(l.RequestsPerSecond) || math.IsInf(l.RequestsPerSecond, 0) {
			return nil, fmt.Errorf("tenantlimit: tenant %q: limits must be finite and not negative", tenant)
		}
	}
	l := &Limiter{slices: slices, limits: maps.Clone(opts.Limits)}
	l.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_tenant_limit_refusals_total",
		Help: "Requests a front door refused because their tenant was over its request rate or its requests in flight, by limit."},
		[]string{"reason"})
	for _, r := range []Reason{ReasonRate, ReasonConcurrency} {
		l.refusals.WithLabelValues(string(r))
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(l.refusals); err != nil {
			return nil, fmt.Errorf("tenantlimit: register metrics: %w", err)
		}
	}
	return l, nil
}

// Admit admits one request of tenant under its limits, or refuses it with
// a *Refusal. An admitted request calls release when it ends (any number
// of times; the first frees its slot).
func (l *Limiter) Admit(ctx context.Context, tenant string) (release func(), err error) {
	lim, ok := l.limits[tenant]
	if !ok || lim.IsZero() {
		return func() {}, nil
	}
	free := func() {}
	if lim.MaxConcurrent > 0 {
		c := concurrencyCeiling(tenant, lim)
		if !l.slices.Acquire(ctx, c) {
			l.refusals.WithLabelValues(string(ReasonConcurrency)).Inc()
			return nil, &Refusal{Reason: ReasonConcurrency, RetryAfter: ConcurrencyRetryAfter, Limit: float64(lim.MaxConcurrent)}
		}
		var once sync.Once
		free = func() { once.Do(func() { l.slices.Release(c) }) }
	}
	if lim.RequestsPerSecond > 0 {
		if ok, wait := l.slices.Take(ctx, rateCeiling(tenant, lim)); !ok {
			free()
			l.refusals.WithLabelValues(string(ReasonRate)).Inc()
			return nil, &Refusal{Reason: ReasonRate, RetryAfter: wait, Limit: lim.RequestsPerSecond}
		}
	}
	return free, nil
}
