package worker

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"
)

// Leases records the attempts a worker has in flight on its route, so that
// every dispatcher replica sees the route's load across the cluster (docs/architecture.md
// §7: route in-flight leases that expire if a holder dies). It names only the
// calls the worker makes: any budgets.RouteLeases, so any budgets.Store,
// satisfies it; the Redis store shares the leases between processes.
type Leases interface {
	// AcquireLease records that holder has an attempt in flight on route
	// until ttl from now; acquiring again renews it.
	AcquireLease(ctx context.Context, route, holder string, ttl time.Duration) error
	// ReleaseLease ends holder's lease on route; an absent lease is not an
	// error.
	ReleaseLease(ctx context.Context, route, holder string) error
}

// Defaults of the lease settings of Options.
const (
	// DefaultLeaseRenewInterval is how often a worker renews the leases of
	// its attempts in flight.
	DefaultLeaseRenewInterval = time.Second
	// DefaultLeaseRenewals is how many renew intervals a lease lasts
	// without renewal when Options.LeaseTTL is zero: a renewal may fail or
	// come late twice before the lease lapses, and a killed worker's
	// leases are gone within three intervals.
	DefaultLeaseRenewals = 3
	// leaseLogEvery bounds the log lines of lease failures: one per
	// interval, with the count of those it held back.
	leaseLogEvery = 30 * time.Second
)

// Lease operations, the "op" label of hedgerow_worker_lease_errors_total.
const (
	LeaseAcquire = "acquire"
	LeaseRenew   = "renew"
	LeaseRelease = "release"
)

// leaseKeeper holds the leases of one worker's attempts. The attempts only
// mark a lease begun or ended, under mu, and wake the keeper; the keeper's
// own goroutine makes every store call, so no attempt ever waits for the
// store. A round of calls stops at the first failure and the keeper then
// waits for its next tick: a store that does not answer costs one counted
// failure per renew interval, whatever the attempt rate. The number of
// leases is bounded by the worker's in-flight limit (plus those ended but
// not yet released), so nothing queues without bound.
type leaseKeeper struct {
	store   Leases
	route   string
	worker  string
	ttl     time.Duration
	renew   time.Duration
	metrics *Metrics
	log     *slog.Logger

	mu     sync.Mutex
	leases map[attemptKey]*lease

	wake    chan struct{} // capacity 1: a round is wanted
	stop    chan struct{} // closed by close
	closing sync.Once
	done    chan struct{} // closed when the goroutine has returned
	stopCtx context.Context

	// Owned by the keeper's goroutine.
	lastLog    time.Time
	heldBackOf int // failures not logged since lastLog
}

// lease is one attempt's lease. ended is set by the attempt; acquired and
// renewed only by the keeper's goroutine, both under mu.
type lease struct {
	key      attemptKey
	holder   string
	ended    bool      // the attempt ended: release the lease
	acquired bool      // the store holds the lease, as far as the keeper knows
	renewed  time.Time // when the last successful acquire or renewal was sent
}

func newLeaseKeeper(cfg Options, log *slog.Logger) *leaseKeeper {
	if cfg.Leases == nil {
		return nil
	}
	return &leaseKeeper{
		store: cfg.Leases, route: cfg.Route, worker: cfg.WorkerID,
		ttl: cfg.LeaseTTL, renew: cfg.LeaseRenewInterval,
		metrics: cfg.Metrics, log: log,
		leases: make(map[attemptKey]*lease),
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
}

// holder names an attempt's lease: the worker, the hedge group and the
// attempt number — ids the dispatcher and this worker drew, never the
// user's — so it is unique across the cluster.
func (k *leaseKeeper) holder(key attemptKey) string {
	return k.worker + "/" + key.group + "/" + strconv.Itoa(key.attempt)
}

// start runs the keeper's goroutine.
func (k *leaseKeeper) start() {
	if k == nil {
		return
	}
	go k.run()
}

// begin marks an attempt in flight; the keeper acquires its lease soon
// after. It never waits for the store.
func (k *leaseKeeper) begin(key attemptKey) {
	if k == nil {
		return
	}
	k.mu.Lock()
	if l, ok := k.leases[key]; ok {
		l.ended = false // the same attempt again before its release: keep the lease
	} else {
		k.leases[key] = &lease{key: key, holder: k.holder(key)}
	}
	k.mu.Unlock()
	k.poke()
}

// end marks an attempt ended; the keeper releases its lease soon after. It
// never waits for the store.
func (k *leaseKeeper) end(key attemptKey) {
	if k == nil {
		return
	}
	k.mu.Lock()
	if l, ok := k.leases[key]; ok {
		l.ended = true
	}
	k.mu.Unlock()
	k.poke()
}

func (k *leaseKeeper) poke() {
	select {
	case k.wake <- struct{}{}:
	default: // a round is already wanted
	}
}

// close stops the keeper: it releases the leases it holds, within ctx, and
// returns once its goroutine has. It returns ctx's error if ctx ends first.
func (k *leaseKeeper) close(ctx context.Context) error {
	if k == nil {
		return nil
	}
	k.closing.Do(func() {
		k.stopCtx = ctx
		close(k.stop)
	})
	select {
	case <-k.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (k *leaseKeeper) run() {
	defer close(k.done)
	tick := time.NewTicker(k.renew)
	defer tick.Stop()
	backOff := false // the last round failed: wait for the tick
	for {
		select {
		case <-k.stop:
			k.releaseAll(k.stopCtx)
			return
		case <-tick.C:
			backOff = !k.round(true)
		case <-k.wake:
			if !backOff {
				backOff = !k.round(false)
			}
		}
	}
}

// round makes the calls the leases need now — releases first, so the
// route's count drops as soon as it can, then acquisitions, then, when
// renewDue, renewals of leases half a renew interval old — and reports
// whether none failed. It stops at the first failure: what is left is
// tried again next round.
func (k *leaseKeeper) round(renewDue bool) bool {
	now := time.Now()
	var release, acquire, renew []*lease
	k.mu.Lock()
	for key, l := range k.leases {
		switch {
		case l.ended && !l.acquired:
			delete(k.leases, key) // ended before its lease was taken: nothing to undo
		case l.ended:
			release = append(release, l)
		case !l.acquired:
			acquire = append(acquire, l)
		case renewDue && now.Sub(l.renewed) >= k.renew/2:
			renew = append(renew, l)
		}
	}
	k.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), k.renew)
	defer cancel()
	for _, l := range release {
		if !k.release(ctx, l) {
			return false
		}
	}
	for _, l := range acquire {
		if !k.acquire(ctx, l, LeaseAcquire) {
			return false
		}
	}
	for _, l := range renew {
		if !k.acquire(ctx, l, LeaseRenew) {
			return false
		}
	}
	return true
}

// acquire takes or renews l's lease.
func (k *leaseKeeper) acquire(ctx context.Context, l *lease, op string) bool {
	sent := time.Now()
	if err := k.store.AcquireLease(ctx, k.route, l.holder, k.ttl); err != nil {
		k.failed(op, err)
		return false
	}
	k.mu.Lock()
	l.acquired, l.renewed = true, sent
	k.mu.Unlock()
	return true
}

// release gives l's lease back. A lease whose release keeps failing is
// forgotten once it must have expired.
func (k *leaseKeeper) release(ctx context.Context, l *lease) bool {
	err := k.store.ReleaseLease(ctx, k.route, l.holder)
	k.mu.Lock()
	if err == nil || time.Since(l.renewed) >= k.ttl {
		l.acquired = false
		if l.ended { // not begun again meanwhile
			delete(k.leases, l.key)
		}
	}
	k.mu.Unlock()
	if err != nil {
		k.failed(LeaseRelease, err)
		return false
	}
	return true
}

// releaseAll gives back every lease the store holds, at Stop, within ctx
// and at most one renew interval; leases it cannot release expire.
func (k *leaseKeeper) releaseAll(ctx context.Context) {
	if ctx.Err() != nil {
		return // Stop ran out of time: the leases expire on their own
	}
	ctx, cancel := context.WithTimeout(ctx, k.renew)
	defer cancel()
	k.mu.Lock()
	var held []*lease
	for _, l := range k.leases {
		if l.acquired {
			l.ended = true
			held = append(held, l)
		}
	}
	k.mu.Unlock()
	for _, l := range held {
		if !k.release(ctx, l) {
			return
		}
	}
}

// failed counts a failed store call and logs it, at most once per
// leaseLogEvery with the count of those held back. The error names the
// store's failure, never an attempt's content. It runs on the keeper's
// goroutine only.
func (k *leaseKeeper) failed(op string, err error) {
	k.metrics.leaseFailed(k.route, op)
	now := time.Now()
	if !k.lastLog.IsZero() && now.Sub(k.lastLog) < leaseLogEvery {
		k.heldBackOf++
		return
	}
	attrs := []any{"op", op, "error", err}
	if k.heldBackOf > 0 {
		attrs = append(attrs, "failures_not_logged", k.heldBackOf)
	}
	k.log.Warn("route lease not updated; it expires on its own", attrs...)
	k.lastLog, k.heldBackOf = now, 0
}
