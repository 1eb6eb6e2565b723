package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/budgets"
)

// ErrUnavailable wraps every failure to reach Redis or to get an answer from
// it in time (and any error Redis returns), so that a caller can tell an
// unavailable store (suppress hedges, let primaries go on) from a malformed
// request or an unknown reservation.
var ErrUnavailable = errors.New("redisstore: redis unavailable")

const (
	// DefaultPrefix starts every key when Options.Prefix is empty.
	DefaultPrefix = "hr"
	// DefaultTimeout bounds each call when Options.Timeout is zero.
	DefaultTimeout = 50 * time.Millisecond
	// gcGrace is how long a key outlives the state it holds before Redis
	// deletes it. Expiry itself is judged by the scripts against the
	// caller's clock; the grace covers clock skew between replicas and a
	// store clock that runs apart from the Redis server's.
	gcGrace = 5 * time.Minute
	// maxExact bounds every unit count the scripts handle: Lua numbers are
	// doubles, exact for integers up to 2^53.
	maxExact = int64(1) << 53
)

// Options configures a Store.
type Options struct {
	// Prefix starts every key, so several stores (or test runs) can share a
	// server; it must not contain '{' or '}'. Empty means DefaultPrefix.
	Prefix string
	// Now is the store's clock; nil means time.Now. Every script is given
	// Now in Unix milliseconds and judges expiry by it; replicas sharing a
	// store should keep their clocks within a few milliseconds.
	Now func() time.Time
	// Timeout bounds each call (every round trip it makes included); an
	// earlier deadline of the caller's context wins. Zero means
	// DefaultTimeout.
	Timeout time.Duration
	// ProbeInterval paces the calls that try Redis once a round trip got no
	// answer: until one is answered, only one call per interval goes to
	// Redis and the others fail at once with ErrUnavailable. Zero means
	// DefaultProbeInterval; a negative interval sends every call.
	ProbeInterval time.Duration
}

// Store is a budgets.Store kept in Redis, standalone or cluster, for many
// dispatcher replicas. It is safe for concurrent use; it does not own the
// client and never closes it.
type Store struct {
	client  redis.UniversalClient
	keys    keys
	now     func() time.Time
	timeout time.Duration
	breaker breaker
}

var _ budgets.Store = (*Store)(nil)

// New returns a Store on client. The client must bound socket I/O by the
// context's deadline (ContextTimeoutEnabled), or Timeout could not stop a
// call that waits on a stalled server; New refuses a *redis.Client,
// *redis.ClusterClient or *redis.Ring that does not.
func New(client redis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: new: client is nil")
	}
	if !FollowsContextDeadlines(client) {
		return nil, errors.New("redisstore: new: the client ignores context deadlines; create it with ContextTimeoutEnabled: true so Timeout bounds every call")
	}
	if strings.ContainsAny(opts.Prefix, "{}") {
		return nil, fmt.Errorf("redisstore: new: prefix %q contains a brace, which would become every key's hash tag", opts.Prefix)
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("redisstore: new: timeout %v is negative", opts.Timeout)
	}
	s := &Store{client: client, keys: keys{prefix: opts.Prefix}, now: opts.Now, timeout: opts.Timeout}
	if s.keys.prefix == "" {
		s.keys.prefix = DefaultPrefix
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.timeout == 0 {
		s.timeout = DefaultTimeout
	}
	s.breaker.interval = opts.ProbeInterval
	if s.breaker.interval == 0 {
		s.breaker.interval = DefaultProbeInterval
	}
	return s, nil
}

// FollowsContextDeadlines reports whether client bounds its socket I/O by
// context deadlines (go-redis's ContextTimeoutEnabled); for client types it
// does not know, it trusts the caller. It is the one such check: New and
// arbiter/sharedgate's NewRedisGate both refuse a client without it.
func FollowsContextDeadlines(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return true
}

// start begins a call that goes to Redis: it fails at once while the
// breaker is open, and otherwise returns ctx bounded by the store's
// timeout.
func (s *Store) start(ctx context.Context, op string) (context.Context, context.CancelFunc, error) {
	if !s.breaker.allow() {
		return nil, nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, op, errBreakerOpen)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	return ctx, cancel, nil
}

// begin starts op, a call that goes to Redis, as start does, once it has
// refused a ctx that already ended and then invalid: the caller's check of
// op's arguments, nil when they are fine.
func (s *Store) begin(ctx context.Context, op string, invalid error) (context.Context, context.CancelFunc, error) {
	if err := ended(ctx, op); err != nil {
		return nil, nil, err
	}
	if invalid != nil {
		return nil, nil, invalid
	}
	return s.start(ctx, op)
}

// roundTrip does op as one command, which queue adds to a batch of its
// own, in one round trip; begin's ctx and invalid come first. The error of
// the command's reply, read once the batch ran, is op's failure.
func (s *Store) roundTrip(ctx context.Context, op string, invalid error, queue func(ctx context.Context, b *batch) reply) error {
	parent := ctx
	ctx, cancel, err := s.begin(ctx, op, invalid)
	if err != nil {
		return err
	}
	defer cancel()
	b := newBatch(s.client)
	cmd := queue(ctx, b)
	s.send(parent, ctx, b)
	if err := cmd.Err(); err != nil {
		return failure(parent, op, err)
	}
	return nil
}

// send runs b within ctx and tells the breaker whether Redis answered. A
// round trip cut short by the caller's own context says nothing of Redis.
func (s *Store) send(parent, ctx context.Context, b *batch) {
	if b.exec(ctx) {
		s.breaker.answered()
	} else if parent.Err() == nil {
		s.breaker.unanswered()
	}
}

// failure wraps err, met while doing op: the caller's context error if
// that context ended, ErrUnavailable otherwise.
func failure(parent context.Context, op string, err error) error {
	if perr := parent.Err(); perr != nil {
		return fmt.Errorf("redisstore: %s: %w (%v)", op, perr, err)
	}
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
}

// ended reports a call on a context that ended before it started.
func ended(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redisstore: %s: %w", op, err)
	}
	return nil
}

// millisCeil converts a positive duration to whole milliseconds, rounding
// up so that a sub-millisecond TTL is not expired at birth.
func millisCeil(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

var (
	graceMs = gcGrace.Milliseconds()
	idleMs  = budgets.BucketIdleTTL.Milliseconds()
)

// checkExact refuses unit counts the scripts could not hold exactly.
func checkExact(what string, spend budgets.SpendPolicy) error {
	for _, v := range []int64{spend.InputUnits, spend.OutputUnits, spend.Units(), spend.UserActionCeiling, spend.TenantCeiling} {
		if v >= maxExact || v < 0 {
			return fmt.Errorf("%s: %w: spend figures must stay below 2^53 units (input %d, output %d, ceilings %d and %d)",
				what, budgets.ErrInvalidRequest, spend.InputUnits, spend.OutputUnits, spend.UserActionCeiling, spend.TenantCeiling)
		}
	}
	return nil
}

// scripts lists every script the store runs, for LoadScripts.
var scripts = []*redis.Script{
	takeScript, endScript, countScript, uncountScript, poolCountScript, poolEndScript, markScript, leaseScript,
}

// LoadScripts loads every script into every server the client talks to
// (each master of a cluster), so that no call pays the second round trip a
// missing script costs. It is optional: a server that lacks a script, say
// after a restart, is sent its source when a call needs it.
func (s *Store) LoadScripts(ctx context.Context) error {
	parent := ctx
	ctx, cancel, err := s.begin(ctx, "load scripts", nil)
	if err != nil {
		return err
	}
	defer cancel()
	load := func(ctx context.Context, c redis.Scripter) error {
		for _, sc := range scripts {
			if err := sc.Load(ctx, c).Err(); err != nil {
				return err
			}
		}
		return nil
	}
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return load(ctx, m) })
	case *redis.Ring:
		err = c.ForEachShard(ctx, func(ctx context.Context, sh *redis.Client) error { return load(ctx, sh) })
	default:
		err = load(ctx, s.client)
	}
	if err != nil && !isReply(err) && parent.Err() == nil {
		s.breaker.unanswered()
	} else {
		s.breaker.answered()
	}
	if err != nil {
		return failure(parent, "load scripts", err)
	}
	return nil
}
