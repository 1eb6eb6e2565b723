// Package redisslice is the slice.Granter a region's gateways share through
// Redis, a standalone server or a Redis Cluster (docs/architecture.md §7,
// "Slices"): the whole of every ceiling lives in Redis, and each gateway's
// slice.Slices spends from the slices it is granted.
//
// # Keys
//
// Every key starts with the granter's prefix (default "hr"); a ceiling's
// keys share the hash tag {sl:<key>}, so they sit in one slot of a cluster.
//
//	<prefix>:{sl:<key>}:rate   a rate ceiling's bucket (HASH tokens, at: Unix ms of the last refill)
//	<prefix>:{sl:<key>}:hold   a concurrency ceiling's holds (HASH holder → "<slots>:<expiry, Unix ms>")
//	<prefix>:{sl}:alive        the region's live holders (ZSET holder → expiry, Unix ms)
//
// # Scripts and time
//
// Each operation is one Lua script (redis.NewScript: EVALSHA, EVAL when the
// server lacks it) on one key, atomic in Redis, so every gateway sharing
// the prefix shares one bucket, one set of holds and one count of the
// living. Times are the granter's clock (Options.Now) in Unix milliseconds,
// passed to every script, which judges every refill and expiry by it; the
// keys' PX TTLs, on Redis' clock, only let Redis collect idle ceilings a
// minute after they would be full or free anyway. The take script refills
// with the arithmetic of slice.Memory (a duration's Seconds times
// PerSecond, in doubles, floors of whole tokens) and returns the tokens it
// left, from which Take computes slice.UntilToken's wait in Go: on a clock
// of whole milliseconds both granters answer the same, to the bit.
package redisslice

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/budgets/slice"
)

// Options configure a Granter.
type Options struct {
	// Prefix starts every key; empty means "hr", as redis.key_prefix.
	Prefix string
	// Now is the granter's clock; nil means time.Now.
	Now func() time.Time
}

// Granter is a slice.Granter on Redis.
type Granter struct {
	client redis.UniversalClient
	prefix string
	now    func() time.Time
}

var _ slice.Granter = (*Granter)(nil)

// New returns a Granter on client.
func New(client redis.UniversalClient, opts Options) (*Granter, error) {
	if client == nil {
		return nil, errors.New("redisslice: a Redis client is required")
	}
	if opts.Prefix == "" {
		opts.Prefix = "hr"
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Granter{client: client, prefix: opts.Prefix, now: opts.Now}, nil
}

// rateKey is the key of r's bucket.
func (g *Granter) rateKey(r slice.Rate) string { return g.prefix + ":{sl:" + r.Key + "}:rate" }

// holdKey is the key of c's holds.
func (g *Granter) holdKey(c slice.Concurrency) string { return g.prefix + ":{sl:" + c.Key + "}:hold" }

// aliveKey is the key of the region's live holders.
func (g *Granter) aliveKey() string { return g.prefix + ":{sl}:alive" }

// collectAfter is how long past the moment a key's state would be full or
// free Redis keeps it: the margin between the granters' clocks and Redis'.
const collectAfter = 60_000 // ms

// takeScript refills a bucket, takes the given-back tokens back and takes
// what it can of the want. KEYS[1] the bucket; ARGV now (ms), per second,
// burst, want, give back. Returns {took, tokens left}, both as %.17g
// strings (a Lua number reply would be truncated to an integer). The
// bucket starts full; a clock behind the last refill refills nothing. The
// refill is Go's Duration.Seconds() of the elapsed whole milliseconds
// times per second, as slice.Memory computes it.
var takeScript = redis.NewScript(`
local now = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local back = tonumber(ARGV[5])
local v = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(v[1]), tonumber(v[2])
if tokens == nil or at == nil then
  tokens, at = burst, now
end
if now > at then
  local dt = now - at
  local sec = math.floor(dt / 1000)
  tokens = tokens + (sec + (dt - sec * 1000) * 1000000 / 1e9) * rate
  at = now
end
tokens = math.min(burst, tokens + back)
local took = math.min(math.floor(want), math.floor(tokens))
tokens = tokens - took
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'at', string.format('%.0f', at))
local ttl = math.min(math.ceil((burst - tokens) * 1000 / rate), 1e15) + ` + strconv.Itoa(collectAfter) + `
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', ttl))
return {string.format('%.17g', took), string.format('%.17g', tokens)}
`)

// holdScript sets a holder's slots. KEYS[1] the holds; ARGV now (ms),
// holder, want, max, ttl (ms). Drops the expired holds, then sets the
// holder's to the want or what the other live holds leave of max,
// whichever is fewer (none: its field is deleted). Returns what it holds.
var holdScript = redis.NewScript(`
local now = tonumber(ARGV[1])
local holder = ARGV[2]
local want = tonumber(ARGV[3])
local max = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local all = redis.call('HGETALL', KEYS[1])
local others, last = 0, 0
for i = 1, #all, 2 do
  local h, v = all[i], all[i + 1]
  local sep = string.find(v, ':', 1, true)
  local slots, exp = tonumber(string.sub(v, 1, sep - 1)), tonumber(string.sub(v, sep + 1))
  if exp <= now then
    redis.call('HDEL', KEYS[1], h)
  elseif h ~= holder then
    others = others + slots
    last = math.max(last, exp)
  end
end
local held = math.max(0, math.min(want, max - others))
if held == 0 then
  redis.call('HDEL', KEYS[1], holder)
else
  redis.call('HSET', KEYS[1], holder, string.format('%.0f:%.0f', held, now + ttl))
  last = math.max(last, now + ttl)
end
if last > now then
  redis.call('PEXPIRE', KEYS[1], string.format('%.0f', last - now + ` + strconv.Itoa(collectAfter) + `))
end
return held
`)

// aliveScript records a live holder and counts the live ones. KEYS[1] the
// live holders; ARGV now (ms), holder, ttl (ms).
var aliveScript = redis.NewScript(`
local now = tonumber(ARGV[1])
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
local last = tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2])
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', last - now + ` + strconv.Itoa(collectAfter) + `))
return redis.call('ZCARD', KEYS[1])
`)

// Take puts giveBack back into r's bucket and takes up to want tokens.
func (g *Granter) Take(ctx context.Context, r slice.Rate, want, giveBack float64) (float64, time.Duration, error) {
	if err := r.Validate(); err != nil {
		return 0, 0, fmt.Errorf("redisslice: take: %w", err)
	}
	if !(want >= 0) || !(giveBack >= 0) || math.IsInf(want, 0) || math.IsInf(giveBack, 0) {
		return 0, 0, fmt.Errorf("redisslice: take: %w: want and give back must be finite and ≥ 0 (got %v, %v)",
			slice.ErrInvalidRequest, want, giveBack)
	}
	res, err := takeScript.Run(ctx, g.client, []string{g.rateKey(r)},
		g.now().UnixMilli(), float(r.PerSecond), float(r.Burst), float(want), float(giveBack)).StringSlice()
	if err != nil {
		return 0, 0, fmt.Errorf("redisslice: take: rate %q: %w", r.Key, err)
	}
	if len(res) != 2 {
		return 0, 0, fmt.Errorf("redisslice: take: rate %q: unexpected reply %q", r.Key, res)
	}
	took, err1 := strconv.ParseFloat(res[0], 64)
	tokens, err2 := strconv.ParseFloat(res[1], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, fmt.Errorf("redisslice: take: rate %q: unexpected reply %q: %w", r.Key, res, err)
	}
	if took < want {
		return took, slice.UntilToken(tokens, r.PerSecond), nil
	}
	return took, 0, nil
}

// Hold sets holder's slots of c to want, or to what the other live holders
// leave free, until ttl from now.
func (g *Granter) Hold(ctx context.Context, c slice.Concurrency, holder string, want int, ttl time.Duration) (int, error) {
	if err := c.Validate(); err != nil {
		return 0, fmt.Errorf("redisslice: hold: %w", err)
	}
	if holder == "" || want < 0 || ttl <= 0 {
		return 0, fmt.Errorf("redisslice: hold: %w: a hold needs a holder, a want ≥ 0 and a positive TTL", slice.ErrInvalidRequest)
	}
	held, err := holdScript.Run(ctx, g.client, []string{g.holdKey(c)},
		g.now().UnixMilli(), holder, min(want, maxExact), min(c.Max, maxExact), ms(ttl)).Int()
	if err != nil {
		return 0, fmt.Errorf("redisslice: hold: concurrency %q: %w", c.Key, err)
	}
	return held, nil
}

// Alive records holder as live until ttl from now and counts the live
// holders.
func (g *Granter) Alive(ctx context.Context, holder string, ttl time.Duration) (int, error) {
	if holder == "" || ttl <= 0 {
		return 0, fmt.Errorf("redisslice: alive: %w: a live holder needs a name and a positive TTL", slice.ErrInvalidRequest)
	}
	n, err := aliveScript.Run(ctx, g.client, []string{g.aliveKey()}, g.now().UnixMilli(), holder, ms(ttl)).Int()
	if err != nil {
		return 0, fmt.Errorf("redisslice: alive: %w", err)
	}
	return n, nil
}

// float formats x so that Lua's tonumber reads back the same double.
func float(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

// ms is a TTL in whole milliseconds, rounded up: a positive TTL is never 0.
func ms(d time.Duration) int64 {
	n := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		n++
	}
	return n
}

// maxExact is the largest slot count the scripts' doubles hold exactly:
// Hold sends Max and the want at most this (no region holds 2^53 slots).
const maxExact = 1 << 53
