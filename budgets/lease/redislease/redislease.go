// Package redislease is the lease.RegionStore a region's gateways share in
// the region's own Redis, a standalone server or a Redis Cluster
// (docs/architecture.md §14, "The region's side"): the leases the region
// holds, the demand its gateways saw since the renewer last looked, and
// the region-wide lock of the one gateway that renews. Nothing in it
// crosses regions.
//
// # Keys
//
// Every key starts with the store's prefix (default "hr") and carries the
// hash tag {lease}, so all of them sit in one slot of a cluster:
//
//	<prefix>:{lease}:held     the leases the region holds (HASH ceiling key → the lease.Held as
//	                          JSON, its expiry in UTC; no TTL)
//	<prefix>:{lease}:demand   the units wanted since the last take (HASH ceiling key → a float,
//	                          HINCRBYFLOAT; no TTL: TakeDemand deletes it)
//	<prefix>:{lease}:lock     the renewal lock (HASH holder → the gateway holding it;
//	                          until → the end of its hold, Unix ms on the store's clock;
//	                          PX the hold plus a minute, for collection only)
//
// A ceiling key is a field of a hash, never part of a key's name, so any
// string is a ceiling key and none collides with another.
//
// # Scripts and time
//
// SetHeld is one HSET and Held one HGETALL. The operations that read and
// write are each one Lua script (redis.NewScript: EVALSHA, EVAL when the
// server lacks it), atomic in Redis: AddDemand adds every ceiling's units
// at once; TakeDemand reads the demand and deletes it, so a unit added
// concurrently is taken by this take or the next, never both or neither;
// Lock takes a free or lapsed lock, or extends its holder's own, and
// refuses any other; Unlock deletes the lock only if the holder holds it
// (compare and delete). A hold is judged on the store's clock
// (Options.Now), passed to the scripts in Unix milliseconds, never on
// Redis' own, so that tests run on a settable clock and a region's
// gateways agree on one clock with the lease's expiries.
//
// # Expiry
//
// Only the lock has a TTL, and only so that Redis collects a lock whose
// holder died: its hold plus a minute, the margin between the store's
// clock and Redis', never shorter than a live hold. The held leases have
// none: a region that forgot the lease it holds spends the fallback
// (lease.Spending), which may be more than the safe share the authority
// reserved for it. A Redis that loses its memory (a restart without
// persistence, eviction under maxmemory with any policy but noeviction)
// forgets them all the same; the demand it loses only undersizes the next
// renewal.
package redislease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/budgets/lease"
)

// Options configure a Store.
type Options struct {
	// Prefix starts every key; empty means "hr", as redis.key_prefix.
	Prefix string
	// Now is the store's clock, which judges the lock's holds; nil means
	// time.Now. Every gateway of a region should read the same time.
	Now func() time.Time
}

// Store is a lease.RegionStore on Redis, safe for concurrent use.
type Store struct {
	client redis.UniversalClient
	now    func() time.Time
	held   string
	demand string
	lock   string
}

var _ lease.RegionStore = (*Store)(nil)

// New returns a Store on client.
func New(client redis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("redislease: a Redis client is required")
	}
	if opts.Prefix == "" {
		opts.Prefix = "hr"
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	key := func(name string) string { return opts.Prefix + ":{lease}:" + name }
	return &Store{client: client, now: opts.Now, held: key("held"), demand: key("demand"), lock: key("lock")}, nil
}

// collectAfter is how long past a hold's end Redis keeps the lock: the
// margin between the store's clock and Redis'.
const collectAfter = 60_000 // ms

// addScript adds units to ceilings' demand. KEYS[1] the demand; ARGV
// ceiling key, units, ceiling key, units, …
var addScript = redis.NewScript(`
for i = 1, #ARGV, 2 do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
end
return 0
`)

// takeScript answers the demand and deletes it. KEYS[1] the demand.
// Returns HGETALL's flat list of ceiling key, units (as Redis formats
// them: a Lua number would be truncated to an integer).
var takeScript = redis.NewScript(`
local all = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
return all
`)

// lockScript takes or extends the lock. KEYS[1] the lock; ARGV now (ms),
// holder, ttl (ms). Another holder's hold that has not ended by now
// refuses it (0); else the holder holds it until now + ttl (1).
var lockScript = redis.NewScript(`
local now = tonumber(ARGV[1])
local ttl = tonumber(ARGV[3])
local cur = redis.call('HMGET', KEYS[1], 'holder', 'until')
if cur[1] and cur[1] ~= ARGV[2] and tonumber(cur[2]) > now then
  return 0
end
redis.call('HSET', KEYS[1], 'holder', ARGV[2], 'until', string.format('%.0f', now + ttl))
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', ttl + ` + strconv.Itoa(collectAfter) + `))
return 1
`)

// unlockScript deletes the lock if its holder is ARGV[1]. KEYS[1] the
// lock.
var unlockScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'holder') == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
return 0
`)

// Held implements lease.RegionStore.
func (s *Store) Held(ctx context.Context) (map[string]lease.Held, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("redislease: held: %w", err)
	}
	all, err := s.client.HGetAll(ctx, s.held).Result()
	if err != nil {
		return nil, fmt.Errorf("redislease: held: %w", err)
	}
	held := make(map[string]lease.Held, len(all))
	for key, v := range all {
		var h lease.Held
		if err := json.Unmarshal([]byte(v), &h); err != nil {
			return nil, fmt.Errorf("redislease: held: ceiling %q: %w", key, err)
		}
		held[key] = h
	}
	return held, nil
}

// SetHeld implements lease.RegionStore.
func (s *Store) SetHeld(ctx context.Context, key string, h lease.Held) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redislease: set held %q: %w", key, err)
	}
	if !(h.Share >= 0) || h.Share > 1 {
		return fmt.Errorf("redislease: set held %q: %w: share %v must be in [0, 1]", key, lease.ErrInvalid, h.Share)
	}
	h.Expires = h.Expires.UTC() // one spelling for every gateway; the zero time stays zero
	v, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("redislease: set held %q: %w", key, err)
	}
	if err := s.client.HSet(ctx, s.held, key, v).Err(); err != nil {
		return fmt.Errorf("redislease: set held %q: %w", key, err)
	}
	return nil
}

// AddDemand implements lease.RegionStore. Units must be finite and ≥ 0.
func (s *Store) AddDemand(ctx context.Context, units map[string]float64) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redislease: add demand: %w", err)
	}
	if len(units) == 0 {
		return nil
	}
	args := make([]any, 0, 2*len(units))
	for key, u := range units {
		if !(u >= 0) || math.IsInf(u, 0) {
			return fmt.Errorf("redislease: add demand: %w: ceiling %q: units %v must be finite and ≥ 0", lease.ErrInvalid, key, u)
		}
		args = append(args, key, strconv.FormatFloat(u, 'g', -1, 64))
	}
	if err := addScript.Run(ctx, s.client, []string{s.demand}, args...).Err(); err != nil {
		return fmt.Errorf("redislease: add demand: %w", err)
	}
	return nil
}

// TakeDemand implements lease.RegionStore.
func (s *Store) TakeDemand(ctx context.Context) (map[string]float64, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("redislease: take demand: %w", err)
	}
	all, err := takeScript.Run(ctx, s.client, []string{s.demand}).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("redislease: take demand: %w", err)
	}
	if len(all)%2 != 0 {
		return nil, fmt.Errorf("redislease: take demand: unexpected reply %q", all)
	}
	demand := make(map[string]float64, len(all)/2)
	for i := 0; i < len(all); i += 2 {
		u, err := strconv.ParseFloat(all[i+1], 64)
		if err != nil {
			return nil, fmt.Errorf("redislease: take demand: ceiling %q: %w", all[i], err)
		}
		demand[all[i]] = u
	}
	return demand, nil
}

// Lock implements lease.RegionStore. The holder must be named and the ttl
// positive.
func (s *Store) Lock(ctx context.Context, holder string, ttl time.Duration) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("redislease: lock: %w", err)
	}
	if holder == "" || ttl <= 0 {
		return false, fmt.Errorf("redislease: lock: %w: a hold needs a holder and a positive ttl (got %q, %v)", lease.ErrInvalid, holder, ttl)
	}
	n, err := lockScript.Run(ctx, s.client, []string{s.lock}, s.now().UnixMilli(), holder, ms(ttl)).Int()
	if err != nil {
		return false, fmt.Errorf("redislease: lock as %q: %w", holder, err)
	}
	return n == 1, nil
}

// Unlock implements lease.RegionStore.
func (s *Store) Unlock(ctx context.Context, holder string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redislease: unlock: %w", err)
	}
	if holder == "" {
		return nil // no one holds the lock under no name
	}
	if err := unlockScript.Run(ctx, s.client, []string{s.lock}, holder).Err(); err != nil {
		return fmt.Errorf("redislease: unlock as %q: %w", holder, err)
	}
	return nil
}

// ms is a ttl in whole milliseconds, rounded up: a positive ttl is never 0.
func ms(d time.Duration) int64 {
	n := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		n++
	}
	return n
}
