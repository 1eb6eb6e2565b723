// Package redistenantlimit is the tenantlimit.Store that gateway replicas
// share through Redis, so a tenant's request rate and requests in flight
// are limited across the whole cluster (docs/architecture.md §2).
//
// Each tenant has two keys in one hash slot, so the store works on a Redis
// Cluster: `<prefix>:{tl:<tenant>}:rate`, a hash holding the bucket's tokens
// and when it was last filled, and `<prefix>:{tl:<tenant>}:slots`, a sorted
// set of lease holders scored by their expiry in Unix milliseconds. Every
// operation is one Lua script, atomic in Redis. Times are the store's clock
// (Options.Now), passed in by the caller, so a test clock drives them and
// replicas' clocks need only agree to within what a lease TTL tolerates;
// the keys' PX TTLs, on Redis' clock, only let Redis collect idle tenants.
package redistenantlimit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/frontdoor/tenantlimit"
)

// Options configure a Store.
type Options struct {
	// Prefix starts every key; empty means "hr", as redis.key_prefix.
	Prefix string
	// Now is the store's clock; nil means time.Now.
	Now func() time.Time
}

// Store is a tenantlimit.Store on Redis.
type Store struct {
	client redis.UniversalClient
	prefix string
	now    func() time.Time
}

var _ tenantlimit.Store = (*Store)(nil)

// New returns a Store on client.
func New(client redis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("redistenantlimit: a Redis client is required")
	}
	if opts.Prefix == "" {
		opts.Prefix = "hr"
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Store{client: client, prefix: opts.Prefix, now: opts.Now}, nil
}

func (s *Store) rateKey(tenant string) string  { return s.prefix + ":{tl:" + tenant + "}:rate" }
func (s *Store) slotsKey(tenant string) string { return s.prefix + ":{tl:" + tenant + "}:slots" }

// takeScript takes one token. KEYS[1] the bucket; ARGV now (ms), rate (per
// second), burst. Returns {1, 0} or {0, ms until a token}. The bucket
// starts full; a clock behind the last fill refills nothing.
var takeScript = redis.NewScript(`
local now = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local v = redis.call('HMGET', KEYS[1], 't', 'at')
local tokens = tonumber(v[1])
local at = tonumber(v[2])
if tokens == nil or at == nil then
  tokens = burst
  at = now
end
if now > at then
  tokens = tokens + (now - at) * rate / 1000
  at = now
end
if tokens > burst then tokens = burst end
local ok, wait = 0, 0
if tokens >= 1 then
  tokens = tokens - 1
  ok = 1
else
  wait = math.ceil((1 - tokens) * 1000 / rate)
  if wait < 1 then wait = 1 end
end
redis.call('HSET', KEYS[1], 't', string.format('%.17g', tokens), 'at', at)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 60000)
return {ok, wait}
`)

// acquireScript gives a slot. KEYS[1] the slots; ARGV now (ms), holder,
// max, ttl (ms). Drops expired leases first.
var acquireScript = redis.NewScript(`
local now = tonumber(ARGV[1])
local ttl = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
return 1
`)

// refreshScript extends a live lease. KEYS[1] the slots; ARGV now (ms),
// holder, ttl (ms).
var refreshScript = redis.NewScript(`
local now = tonumber(ARGV[1])
local ttl = tonumber(ARGV[3])
local exp = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[2]))
if exp == nil then return 0 end
if exp <= now then
  redis.call('ZREM', KEYS[1], ARGV[2])
  return 0
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
return 1
`)

// Take takes one token from the tenant's bucket.
func (s *Store) Take(ctx context.Context, tenant string, rate float64, burst int) (bool, time.Duration, error) {
	if rate <= 0 || burst < 1 {
		return false, 0, errors.New("redistenantlimit: the rate and the burst must be positive")
	}
	res, err := takeScript.Run(ctx, s.client, []string{s.rateKey(tenant)},
		s.now().UnixMilli(), strconv.FormatFloat(rate, 'g', -1, 64), burst).Int64Slice()
	if err != nil {
		return false, 0, fmt.Errorf("redistenantlimit: take: %w", err)
	}
	if len(res) != 2 {
		return false, 0, fmt.Errorf("redistenantlimit: take: unexpected reply %v", res)
	}
	return res[0] == 1, time.Duration(res[1]) * time.Millisecond, nil
}

// Acquire gives holder one of the tenant's max slots for ttl.
func (s *Store) Acquire(ctx context.Context, tenant, holder string, max int, ttl time.Duration) (bool, error) {
	if max < 1 || ttl < time.Millisecond {
		return false, errors.New("redistenantlimit: the slot count and the lease TTL must be positive")
	}
	ok, err := acquireScript.Run(ctx, s.client, []string{s.slotsKey(tenant)},
		s.now().UnixMilli(), holder, max, ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("redistenantlimit: acquire: %w", err)
	}
	return ok == 1, nil
}

// Refresh extends holder's lease to ttl from now.
func (s *Store) Refresh(ctx context.Context, tenant, holder string, ttl time.Duration) (bool, error) {
	ok, err := refreshScript.Run(ctx, s.client, []string{s.slotsKey(tenant)},
		s.now().UnixMilli(), holder, ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("redistenantlimit: refresh: %w", err)
	}
	return ok == 1, nil
}

// Release frees holder's slot.
func (s *Store) Release(ctx context.Context, tenant, holder string) error {
	if err := s.client.ZRem(ctx, s.slotsKey(tenant), holder).Err(); err != nil {
		return fmt.Errorf("redistenantlimit: release: %w", err)
	}
	return nil
}
