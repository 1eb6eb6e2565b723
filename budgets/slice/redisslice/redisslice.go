// Package redisslice is the slice.Granter a region's gateways share through
// Redis, a standalone server or a Redis Cluster (docs/architecture.md §7,
// "Slices"): the whole of every ceiling lives in Redis, and each gateway's
// slice.Slices spends from the slices it is granted.
//
// # Keys
//
// Every key starts with the granter's prefix (default "hr"); a ceiling's
// keys share the hash tag {sl:<key>}, so they sit in one slot of a cluster,
// and the region's keys share {sl}.
//
//	<prefix>:{sl:<key>}:rate   a rate ceiling's bucket (HASH tokens; at: Unix ms of the last refill;
//	                           burst: the burst it was last asked with; w:<holder> → "<want>:<Unix ms>",
//	                           what each holder asked for and did not get, dropped once older than
//	                           slice.DemandWindow)
//	<prefix>:{sl:<key>}:hold   a concurrency ceiling's holds (HASH holder → "<slots>:<expiry, Unix ms>")
//	<prefix>:{sl}:alive        the region's live holders (ZSET holder → expiry, Unix ms)
//	<prefix>:{sl}:epoch        the name of the granter's state (STRING, slice.NewEpoch; no TTL)
//
// # Scripts and time
//
// Each operation is one Lua script (redis.NewScript: EVALSHA, EVAL when the
// server lacks it) on the keys of one slot, atomic in Redis, so every
// gateway sharing the prefix shares one bucket, one set of holds and one
// count of the living. Times are the granter's clock (Options.Now) in Unix
// milliseconds, passed to every script, which judges every refill, want
// and expiry by it. The take script keeps the arithmetic of slice.Memory —
// a duration's Seconds times PerSecond, slice.Rebudget, the adjust,
// slice.Share of the live wants, in doubles — and returns what it took and
// the tokens it left, from which Take computes slice.UntilToken's wait in
// Go: on a clock of whole milliseconds both granters answer the same, to
// the bit, as long as the live wants sum exactly (both sum them in the
// arbitrary order of a map or a hash).
//
// # Expiry
//
// The keys' PX TTLs, on Redis' clock, only let Redis collect what a missing
// key means anyway: a refilling bucket a minute after it would be full again
// (its debt paid), holds and live holders a minute after the last lapses.
// A bucket that never refills (PerSecond 0, a window's budget) is never
// full again once spent from, and Redis cannot tell when its window ends:
// it is kept Options.KeepBudgets (default a week and a day) past its last
// call, a minute when it is full. The epoch key never expires: it must
// outlive the state it names, or the gateways would charge their windows'
// spend again. A Redis that evicts keys under maxmemory (any policy but
// noeviction) may drop a spent budget without a new epoch: it forgets it.
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

// DefaultKeepBudgets is how long a budget that never refills and was
// spent from is kept past its last call when Options.KeepBudgets is 0:
// longer than a daily or weekly spend window, so one idle for all of its
// window is not forgotten.
const DefaultKeepBudgets = slice.KeepBudgets

// Options configure a Granter.
type Options struct {
	// Prefix starts every key; empty means "hr", as redis.key_prefix.
	Prefix string
	// Now is the granter's clock; nil means time.Now.
	Now func() time.Time
	// KeepBudgets is how long Redis keeps a bucket with PerSecond 0 that
	// is not full past its last call: at least the longest window such a
	// bucket is keyed by (a tenant's spend_window), or a window idle that
	// long comes back full. 0 means DefaultKeepBudgets.
	KeepBudgets time.Duration
}

// Granter is a slice.Granter on Redis.
type Granter struct {
	client redis.UniversalClient
	prefix string
	now    func() time.Time
	keepMs int64
}

var _ slice.Granter = (*Granter)(nil)

// New returns a Granter on client.
func New(client redis.UniversalClient, opts Options) (*Granter, error) {
	if client == nil {
		return nil, errors.New("redisslice: a Redis client is required")
	}
	if opts.KeepBudgets < 0 {
		return nil, fmt.Errorf("redisslice: KeepBudgets %v is negative", opts.KeepBudgets)
	}
	if opts.Prefix == "" {
		opts.Prefix = "hr"
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.KeepBudgets == 0 {
		opts.KeepBudgets = DefaultKeepBudgets
	}
	return &Granter{client: client, prefix: opts.Prefix, now: opts.Now, keepMs: ms(opts.KeepBudgets)}, nil
}

// rateKey is the key of r's bucket.
func (g *Granter) rateKey(r slice.Rate) string { return g.prefix + ":{sl:" + r.Key + "}:rate" }

// holdKey is the key of c's holds.
func (g *Granter) holdKey(c slice.Concurrency) string { return g.prefix + ":{sl:" + c.Key + "}:hold" }

// aliveKey is the key of the region's live holders.
func (g *Granter) aliveKey() string { return g.prefix + ":{sl}:alive" }

// epochKey is the key of the name of the granter's state.
func (g *Granter) epochKey() string { return g.prefix + ":{sl}:epoch" }

// collectAfter is how long past the moment a key's state would be full or
// free Redis keeps it: the margin between the granters' clocks and Redis'.
const collectAfter = 60_000 // ms

// takeScript refills a bucket, rebudgets it, adjusts it and grants the
// holder its share of the want. KEYS[1] the bucket; ARGV now (ms), per
// second, burst, holder, want, adjust, the demand window (ms), how long
// to keep a spent budget that never refills (ms). Returns {took, tokens
// left}, both as %.17g strings (a Lua number reply would be truncated to
// an integer). Each step is slice.Memory's, in the same doubles:
//   - a bucket starts full, asked with its burst; a clock behind the last
//     refill refills nothing; the refill is Go's Duration.Seconds() of the
//     elapsed whole milliseconds times per second;
//   - slice.Rebudget: a bucket that never refills gains the change of its
//     burst (none for a bucket written before the burst was kept);
//   - a positive adjust is capped at the burst, a negative one is charged
//     to the capped tokens, possibly into debt;
//   - every want older than the demand window is deleted (so the hash
//     holds only the holders that asked within it); a want of 0 stops
//     there, recording nothing; else slice.Share of the tokens there (none
//     in debt) among the live wants, the holder's own in place of its
//     last, is taken, and what it did not get is recorded as its want
//     (none when it got all).
var takeScript = redis.NewScript(`
local now = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local holder = 'w:' .. ARGV[4]
local want = tonumber(ARGV[5])
local adjust = tonumber(ARGV[6])
local window = tonumber(ARGV[7])
local keep = tonumber(ARGV[8])
local all = redis.call('HGETALL', KEYS[1])
local tokens, at, last
local wants = {}
for i = 1, #all, 2 do
  local f, v = all[i], all[i + 1]
  if f == 'tokens' then
    tokens = tonumber(v)
  elseif f == 'at' then
    at = tonumber(v)
  elseif f == 'burst' then
    last = tonumber(v)
  elseif string.sub(f, 1, 2) == 'w:' then
    local sep = string.find(v, ':', 1, true)
    if now - tonumber(string.sub(v, sep + 1)) >= window then
      redis.call('HDEL', KEYS[1], f)
    else
      wants[f] = tonumber(string.sub(v, 1, sep - 1))
    end
  end
end
if tokens == nil or at == nil then
  tokens, at, last = burst, now, burst
end
if now > at then
  local dt = now - at
  local sec = math.floor(dt / 1000)
  tokens = tokens + (sec + (dt - sec * 1000) * 1000000 / 1e9) * rate
  at = now
end
if rate <= 0 and last ~= nil and last ~= 0 then
  tokens = tokens + (burst - last)
end
if adjust > 0 then
  tokens = math.min(burst, tokens + adjust)
else
  tokens = math.min(burst, tokens) + adjust
end
local took = 0
if want > 0 then
  wants[holder] = want
  local holders = {}
  for h in pairs(wants) do
    holders[#holders + 1] = h
  end
  table.sort(holders)
  local total = 0
  for _, h in ipairs(holders) do
    total = total + wants[h]
  end
  local there = math.max(0, tokens)
  if total <= there or total == 0 then
    took = math.min(want, there)
  else
    took = math.min(want, there * want / total)
  end
  tokens = tokens - took
  if took < want then
    redis.call('HSET', KEYS[1], holder, string.format('%.17g', want - took) .. ':' .. ARGV[1])
  else
    redis.call('HDEL', KEYS[1], holder)
  end
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'at', string.format('%.0f', at),
  'burst', string.format('%.17g', burst))
local ttl
if rate > 0 then
  ttl = math.min(math.ceil((burst - tokens) * 1000 / rate), 1e15) + ` + strconv.Itoa(collectAfter) + `
elseif tokens >= burst then
  ttl = ` + strconv.Itoa(collectAfter) + `
else
  ttl = keep
end
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

// aliveScript records a live holder, counts the live ones and names the
// granter's state. KEYS[1] the live holders, KEYS[2] the epoch (one slot:
// both are tagged {sl}); ARGV now (ms), holder, ttl (ms), a fresh epoch,
// set only when the key is missing (a new or emptied Redis). Returns
// {live holders, epoch}.
var aliveScript = redis.NewScript(`
local now = tonumber(ARGV[1])
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
local last = tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2])
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', last - now + ` + strconv.Itoa(collectAfter) + `))
redis.call('SET', KEYS[2], ARGV[4], 'NX')
return {redis.call('ZCARD', KEYS[1]), redis.call('GET', KEYS[2])}
`)

// Take adjusts r's bucket by adjust and grants holder its share of up to
// want tokens.
func (g *Granter) Take(ctx context.Context, r slice.Rate, holder string, want, adjust float64) (float64, float64, time.Duration, error) {
	if err := r.Validate(); err != nil {
		return 0, 0, 0, fmt.Errorf("redisslice: take: %w", err)
	}
	if holder == "" {
		return 0, 0, 0, fmt.Errorf("redisslice: take: %w: a take needs a holder", slice.ErrInvalidRequest)
	}
	if !(want >= 0) || math.IsInf(want, 0) || math.IsNaN(adjust) || math.IsInf(adjust, 0) {
		return 0, 0, 0, fmt.Errorf("redisslice: take: %w: want must be finite and ≥ 0, adjust finite (got %v, %v)",
			slice.ErrInvalidRequest, want, adjust)
	}
	res, err := takeScript.Run(ctx, g.client, []string{g.rateKey(r)},
		g.now().UnixMilli(), float(r.PerSecond), float(r.Burst), holder, float(want), float(adjust),
		slice.DemandWindow.Milliseconds(), g.keepMs).StringSlice()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("redisslice: take: rate %q: %w", r.Key, err)
	}
	if len(res) != 2 {
		return 0, 0, 0, fmt.Errorf("redisslice: take: rate %q: unexpected reply %q", r.Key, res)
	}
	took, err1 := strconv.ParseFloat(res[0], 64)
	tokens, err2 := strconv.ParseFloat(res[1], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, 0, fmt.Errorf("redisslice: take: rate %q: unexpected reply %q: %w", r.Key, res, err)
	}
	if took < want {
		return took, tokens, slice.UntilToken(tokens, r.PerSecond), nil
	}
	return took, tokens, 0, nil
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

// Alive records holder as live until ttl from now, counts the live
// holders and names the granter's state: the epoch Redis keeps, created
// when missing, so a Redis restarted empty answers a new one.
func (g *Granter) Alive(ctx context.Context, holder string, ttl time.Duration) (int, string, error) {
	if holder == "" || ttl <= 0 {
		return 0, "", fmt.Errorf("redisslice: alive: %w: a live holder needs a name and a positive TTL", slice.ErrInvalidRequest)
	}
	res, err := aliveScript.Run(ctx, g.client, []string{g.aliveKey(), g.epochKey()},
		g.now().UnixMilli(), holder, ms(ttl), slice.NewEpoch()).Slice()
	if err != nil {
		return 0, "", fmt.Errorf("redisslice: alive: %w", err)
	}
	n, ok1 := reply(res, 0).(int64)
	epoch, ok2 := reply(res, 1).(string)
	if !ok1 || !ok2 || epoch == "" {
		return 0, "", fmt.Errorf("redisslice: alive: unexpected reply %v", res)
	}
	return int(n), epoch, nil
}

// reply is the i-th element of a script's reply, nil when it is short.
func reply(res []any, i int) any {
	if i < len(res) {
		return res[i]
	}
	return nil
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
