package tenantlimit

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of the Limiter's Options.
const (
	// DefaultLeaseTTL is how long a concurrency slot outlives a holder
	// that stopped refreshing it (a gateway that died mid-request). The
	// Limiter refreshes live leases every third of it.
	DefaultLeaseTTL = 10 * time.Second
	// DefaultStoreTimeout bounds one store call of Admit or of a release.
	DefaultStoreTimeout = time.Second
	// minLeaseTTL is the shortest lease TTL: a store keeps expiries in
	// milliseconds, and leases are refreshed every third of the TTL.
	minLeaseTTL = 30 * time.Millisecond
	// storeErrorLogEvery bounds how often a failing store is logged.
	storeErrorLogEvery = 10 * time.Second
)

// Options configure a Limiter.
type Options struct {
	// Limits are the limits by tenant name; a tenant not named, or the
	// empty tenant (no tenants configured), is not limited.
	Limits map[string]Limit
	// LeaseTTL is the TTL of a concurrency slot; zero means
	// DefaultLeaseTTL.
	LeaseTTL time.Duration
	// StoreTimeout bounds one store call; zero means DefaultStoreTimeout.
	StoreTimeout time.Duration
	// Registerer takes the refusal and store-error counters; nil
	// registers none.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Limiter applies the tenants' limits on a Store: both front doors call
// Admit before a request's group runs and the release it returns when
// the request ends, on every path. It is safe for concurrent use; Close
// stops its lease refreshing.
type Limiter struct {
	store  Store
	limits map[string]Limit
	ttl    time.Duration
	wait   time.Duration
	log    *slog.Logger

	refusals    *prometheus.CounterVec
	storeErrors prometheus.Counter
	lastLogged  atomic.Int64 // Unix ns of the last store error logged

	mu   sync.Mutex
	live map[*lease]struct{}

	stop chan struct{}
	done chan struct{}
}

// lease is one request's concurrency slot.
type lease struct {
	tenant, holder string
}

// New returns a Limiter applying opts.Limits on store. It refreshes the
// live concurrency leases in the background until Close.
func New(store Store, opts Options) (*Limiter, error) {
	if store == nil {
		return nil, errors.New("tenantlimit: a store is required")
	}
	if opts.LeaseTTL < 0 || opts.StoreTimeout < 0 {
		return nil, errors.New("tenantlimit: the lease TTL and the store timeout must not be negative")
	}
	if opts.LeaseTTL > 0 && opts.LeaseTTL < minLeaseTTL {
		return nil, fmt.Errorf("tenantlimit: lease TTL %v is below %v: leases are refreshed every third of it", opts.LeaseTTL, minLeaseTTL)
	}
	for tenant, l := range opts.Limits {
		if l.RequestsPerSecond < 0 || l.Burst < 0 || l.MaxConcurrent < 0 {
			return nil, fmt.Errorf("tenantlimit: tenant %q: limits must not be negative", tenant)
		}
	}
	l := &Limiter{store: store, limits: maps.Clone(opts.Limits),
		ttl: cmp.Or(opts.LeaseTTL, DefaultLeaseTTL), wait: cmp.Or(opts.StoreTimeout, DefaultStoreTimeout),
		log: opts.Logger, live: map[*lease]struct{}{}, stop: make(chan struct{}), done: make(chan struct{})}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	l.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_tenant_limit_refusals_total",
		Help: "Requests a front door refused because their tenant was over its request rate or its requests in flight, by limit."},
		[]string{"reason"})
	l.storeErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "hedgerow_tenant_limit_store_errors_total",
		Help: "Tenant limit checks the store failed to answer; those requests were admitted."})
	for _, r := range []Reason{ReasonRate, ReasonConcurrency} {
		l.refusals.WithLabelValues(string(r))
	}
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{l.refusals, l.storeErrors} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("tenantlimit: register metrics: %w", err)
			}
		}
	}
	go l.refreshLoop()
	return l, nil
}

// Close stops refreshing leases; the slots still held expire after their
// TTL unless released.
func (l *Limiter) Close() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
}

// Admit admits one request of tenant under its limits, or refuses it with
// a *Refusal. An admitted request calls release when it ends (any number
// of times; the first frees its slot). A store that fails admits the
// request: the limits protect capacity, and an unreachable Redis must not
// stop every tenant (the failure is counted and logged).
func (l *Limiter) Admit(ctx context.Context, tenant string) (release func(), err error) {
	lim, ok := l.limits[tenant]
	if !ok || lim.IsZero() {
		return func() {}, nil
	}
	var ls *lease
	if lim.MaxConcurrent > 0 {
		ls = &lease{tenant: tenant, holder: holderID()}
		sctx, cancel := context.WithTimeout(ctx, l.wait)
		got, err := l.store.Acquire(sctx, tenant, ls.holder, lim.MaxConcurrent, l.ttl)
		cancel()
		switch {
		case err != nil:
			l.storeFailed(ctx, "acquire", err)
			ls = nil
		case !got:
			l.refusals.WithLabelValues(string(ReasonConcurrency)).Inc()
			return nil, &Refusal{Reason: ReasonConcurrency, RetryAfter: ConcurrencyRetryAfter, Limit: float64(lim.MaxConcurrent)}
		}
	}
	if lim.RequestsPerSecond > 0 {
		sctx, cancel := context.WithTimeout(ctx, l.wait)
		got, wait, err := l.store.Take(sctx, tenant, lim.RequestsPerSecond, lim.burst())
		cancel()
		switch {
		case err != nil:
			l.storeFailed(ctx, "take", err)
		case !got:
			if ls != nil {
				l.free(ctx, ls)
			}
			l.refusals.WithLabelValues(string(ReasonRate)).Inc()
			return nil, &Refusal{Reason: ReasonRate, RetryAfter: wait, Limit: lim.RequestsPerSecond}
		}
	}
	if ls == nil {
		return func() {}, nil
	}
	l.mu.Lock()
	l.live[ls] = struct{}{}
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			delete(l.live, ls)
			l.mu.Unlock()
			// The request's context may be gone (its caller left): the
			// slot is freed regardless. Synchronously: a door releases
			// before its answer's last bytes leave, so a caller that saw
			// its answer may send the next request at once (one store
			// round trip on the answer's tail, with Redis).
			l.free(context.WithoutCancel(ctx), ls)
		})
	}, nil
}

// free releases a lease in the store.
func (l *Limiter) free(ctx context.Context, ls *lease) {
	sctx, cancel := context.WithTimeout(ctx, l.wait)
	defer cancel()
	if err := l.store.Release(sctx, ls.tenant, ls.holder); err != nil {
		l.storeFailed(ctx, "release", err) // the lease expires after its TTL
	}
}

// refreshLoop keeps the live leases from expiring while their requests
// run.
func (l *Limiter) refreshLoop() {
	defer close(l.done)
	t := time.NewTicker(l.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.refresh(context.Background())
		}
	}
}

// refresh extends every live lease by the TTL. A lease already gone (the
// gateway stalled longer than the TTL) is not taken again: its request
// finishes uncounted rather than going over the limit.
func (l *Limiter) refresh(ctx context.Context) {
	l.mu.Lock()
	live := make([]*lease, 0, len(l.live))
	for ls := range l.live {
		live = append(live, ls)
	}
	l.mu.Unlock()
	for _, ls := range live {
		sctx, cancel := context.WithTimeout(ctx, l.wait)
		ok, err := l.store.Refresh(sctx, ls.tenant, ls.holder, l.ttl)
		cancel()
		if err != nil {
			l.storeFailed(ctx, "refresh", err)
			continue
		}
		if !ok {
			l.log.Debug("tenant concurrency lease expired before its request ended")
		}
	}
}

// storeFailed counts a store failure and logs it at most every
// storeErrorLogEvery. A call cut short because its caller left is no
// store failure: the request ends at once anyway.
func (l *Limiter) storeFailed(ctx context.Context, op string, err error) {
	if ctx.Err() != nil {
		return
	}
	l.storeErrors.Inc()
	now := time.Now().UnixNano()
	last := l.lastLogged.Load()
	if now-last < int64(storeErrorLogEvery) || !l.lastLogged.CompareAndSwap(last, now) {
		return
	}
	l.log.Warn("tenant limits not applied: store failed; requests admitted", "op", op, "err", fmt.Errorf("%w: %w", errStore, err))
}

// holderID is a random lease holder id, unique across replicas.
func holderID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}
