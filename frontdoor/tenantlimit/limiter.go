package tenantlimit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Options configure a Limiter.
type Options struct {
	// Limits are the limits by tenant name; a tenant not named, or the
	// empty tenant (no tenants configured), is not limited.
	Limits map[string]Limit
	// Registerer takes the refusal counter; nil registers none.
	Registerer prometheus.Registerer
}

// Limiter applies the tenants' limits on a gateway's ceilings: both front
// doors call Admit before a request's group runs and the release it
// returns when the request ends, on every path. It is safe for concurrent
// use.
type Limiter struct {
	ceilings Ceilings
	limits   map[string]Limit
	refusals *prometheus.CounterVec
}

// New returns a Limiter applying opts.Limits on ceilings.
func New(ceilings Ceilings, opts Options) (*Limiter, error) {
	if ceilings == nil {
		return nil, errors.New("tenantlimit: the gateway's ceilings are required")
	}
	for tenant, l := range opts.Limits {
		if l.RequestsPerSecond < 0 || l.Burst < 0 || l.MaxConcurrent < 0 ||
			math.IsNaN(l.RequestsPerSecond) || math.IsInf(l.RequestsPerSecond, 0) {
			return nil, fmt.Errorf("tenantlimit: tenant %q: limits must be finite and not negative", tenant)
		}
	}
	l := &Limiter{ceilings: ceilings, limits: maps.Clone(opts.Limits)}
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
		key := concurrencyKey(tenant)
		if !l.ceilings.AcquireSlot(ctx, key, concurrencyKind, lim.MaxConcurrent) {
			l.refusals.WithLabelValues(string(ReasonConcurrency)).Inc()
			return nil, &Refusal{Reason: ReasonConcurrency, RetryAfter: ConcurrencyRetryAfter, Limit: float64(lim.MaxConcurrent)}
		}
		var once sync.Once
		free = func() { once.Do(func() { l.ceilings.ReleaseSlot(key) }) }
	}
	if lim.RequestsPerSecond > 0 {
		if ok, wait := l.ceilings.TakeRate(ctx, rateKey(tenant), rateKind, lim.RequestsPerSecond, float64(lim.burst())); !ok {
			free()
			l.refusals.WithLabelValues(string(ReasonRate)).Inc()
			return nil, &Refusal{Reason: ReasonRate, RetryAfter: wait, Limit: lim.RequestsPerSecond}
		}
	}
	return free, nil
}
