package redisstore

import "github.com/redis/go-redis/v9"

// The scripts below are the only code that changes budget state. Each reads
// the caller's clock as its first argument ("now", Unix ms) and judges every
// expiry against it; Redis key TTLs (PEXPIRE) only collect garbage, a grace
// period after the state they hold is dead. All quantities are integers
// (units, microtokens, ms) written with %d, so values up to 2^53 survive
// Lua's doubles exactly.

// prelude holds the helpers every state-changing script shares.
const prelude = `
local ONE = 1000000

local function int(x) return string.format('%d', x) end

-- purge ends the reservations of an account whose expiry is at or before
-- now and returns the units they held.
local function purge(res, exp, now)
  local freed = 0
  while true do
    local dead = redis.call('ZRANGEBYSCORE', exp, '-inf', now, 'LIMIT', 0, 256)
    if #dead == 0 then return freed end
    local units = redis.call('HMGET', res, unpack(dead))
    for i = 1, #dead do freed = freed + (tonumber(units[i]) or 0) end
    redis.call('HDEL', res, unpack(dead))
    redis.call('ZREM', exp, unpack(dead))
  end
end

-- load reads an account (KEYS[1] hash a/s/r/e, KEYS[2] reservation units,
-- KEYS[3] reservation expiries), starts it afresh if it outlived its expiry,
-- and returns the units of expired reservations to it.
local function load(now, nowArg)
  local v = redis.call('HMGET', KEYS[1], 'a', 's', 'r', 'e')
  local acct = {a = tonumber(v[1]) or 0, s = tonumber(v[2]) or 0, r = tonumber(v[3]) or 0, e = tonumber(v[4])}
  if acct.e and now >= acct.e then
    redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
    return {a = 0, s = 0, r = 0}
  end
  local freed = purge(KEYS[2], KEYS[3], nowArg)
  acct.r = acct.r - freed
  acct.dirty = freed > 0 and acct.e ~= nil
  return acct
end

-- bucketLevel reads a cohort bucket (l level, c capacity, u last use),
-- starting it at its initial fill when new or idle too long, and caps it.
local function bucketLevel(key, now, initial, cap, idle)
  local v = redis.call('HMGET', key, 'l', 'u')
  local l, u = tonumber(v[1]), tonumber(v[2])
  if not l or not u or now >= u + idle then l = initial end
  if l > cap then l = cap end
  return l
end

-- refill adds the floor tokens earned since t; t moves on only when at
-- least one microtoken was earned, so slow rates are not rounded away.
local function refill(l, c, t, rate, now)
  if l >= c then return c, now end
  local earned = math.floor((now - t) * rate / 1000)
  if earned > 0 then return math.min(c, l + earned), now end
  return l, t
end
`

// takeScript takes an attempt slot (when ARGV[3] > 0) and reserves units
// against an account: a user action's ledger and spend, or a tenant's window.
//
// KEYS: account hash, reservation units (HASH nonce → units), reservation
// expiries (ZSET nonce → ms).
// ARGV: now, nonce, max attempts (0: no ledger), units, ceiling (0: none),
// reservation expiry, minimum account expiry, gc grace.
// Returns {0 granted | 1 attempts full | 2 ceiling reached, attempts used}.
// A replay of a granted call (same nonce) returns the grant again.
var takeScript = redis.NewScript(prelude + `
local now, nonce = tonumber(ARGV[1]), ARGV[2]
local max, units, ceiling = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local resExp, minExp, grace = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
if redis.call('HEXISTS', KEYS[2], nonce) == 1 then
  return {0, tonumber(redis.call('HGET', KEYS[1], 'a')) or 0}
end
local acct = load(now, ARGV[1])
local code = 0
if max > 0 and acct.a >= max then
  code = 1
elseif ceiling > 0 and acct.s + acct.r + units > ceiling then
  code = 2
end
if code ~= 0 then
  if acct.dirty then redis.call('HSET', KEYS[1], 'r', int(acct.r)) end
  return {code, acct.a}
end
if max > 0 then acct.a = acct.a + 1 end
acct.r = acct.r + units
local e = math.max(acct.e or 0, resExp, minExp)
redis.call('HSET', KEYS[1], 'a', int(acct.a), 's', int(acct.s), 'r', int(acct.r), 'e', int(e))
redis.call('HSET', KEYS[2], nonce, int(units))
redis.call('ZADD', KEYS[3], int(resExp), nonce)
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], int(e - now + grace)) end
return {0, acct.a}
`)

// endScript ends an account's share of a live reservation: settle replaces
// the reserved units by the used ones; release gives the units back and,
// for a user action (ARGV[5] = 1), the attempt slot.
//
// KEYS: as takeScript. ARGV: now, nonce, 1 settle | 0 release, used units,
// 1 give back the slot | 0.
// Returns 1 if the reservation was live here, 0 (changing nothing) if not.
var endScript = redis.NewScript(prelude + `
local now, nonce = tonumber(ARGV[1]), ARGV[2]
local acct = load(now, ARGV[1])
local units = redis.call('HGET', KEYS[2], nonce)
if not units or not acct.e then
  if acct.dirty then redis.call('HSET', KEYS[1], 'r', int(acct.r)) end
  return 0
end
redis.call('HDEL', KEYS[2], nonce)
redis.call('ZREM', KEYS[3], nonce)
acct.r = acct.r - tonumber(units)
if ARGV[3] == '1' then
  acct.s = acct.s + tonumber(ARGV[4])
elseif ARGV[5] == '1' then
  acct.a = acct.a - 1
end
redis.call('HSET', KEYS[1], 'a', int(acct.a), 's', int(acct.s), 'r', int(acct.r))
return 1
`)

// depositScript puts a primary's ratio into its cohort's bucket, up to the
// capacity.
//
// KEYS: cohort bucket (HASH l level, c capacity, u last use).
// ARGV: now, initial fill, capacity, ratio (microtokens), idle ttl, gc grace.
// Returns the microtokens actually added, which a compensation takes back.
var depositScript = redis.NewScript(prelude + `
local now, initial, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ratio, idle, grace = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local l = bucketLevel(KEYS[1], now, initial, cap, idle)
local added = math.min(cap, l + ratio) - l
redis.call('HSET', KEYS[1], 'l', int(l + added), 'c', int(cap), 'u', int(now))
redis.call('PEXPIRE', KEYS[1], int(idle + grace))
return added
`)

// withdrawScript takes back a compensated deposit. The level may go below
// zero when a concurrent hedge already spent the deposit: later deposits
// repay that debt, so the glimpsed token does not stay granted.
//
// KEYS: cohort bucket. ARGV: microtokens to take back.
var withdrawScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'l', -tonumber(ARGV[1]))
end
return 1
`)

// poolTakeScript takes one token for an extra attempt: from the cohort's
// bucket if it holds the need (one token, plus the replacement reserve for
// a hedge), else from the pool's floor, refilled up to now.
//
// KEYS: cohort bucket, pool floor (HASH l level, c capacity, rate
// microtokens/s, t last refill, u last use), pool tokens (ZSET
// "nonce:source" → reservation expiry).
// ARGV: now, nonce, initial fill, capacity, need, floor capacity, floor
// rate (microtokens/s), reservation expiry, idle ttl, gc grace.
// Returns the source: 0 none, 1 cohort, 2 floor. A replay of a granted
// call returns the same source.
var poolTakeScript = redis.NewScript(prelude + `
local now, nonce = tonumber(ARGV[1]), ARGV[2]
for src = 1, 2 do
  if redis.call('ZSCORE', KEYS[3], nonce .. ':' .. src) then return src end
end
local initial, cap, need = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local fcap, rate = tonumber(ARGV[6]), tonumber(ARGV[7])
local resExp, idle, grace = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local src = 0
local l = bucketLevel(KEYS[1], now, initial, cap, idle)
if l >= need then
  l = l - ONE
  src = 1
end
redis.call('HSET', KEYS[1], 'l', int(l), 'c', int(cap), 'u', int(now))
redis.call('PEXPIRE', KEYS[1], int(idle + grace))
if src == 0 and fcap > 0 then
  local v = redis.call('HMGET', KEYS[2], 'l', 't', 'u')
  local fl, ft, fu = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
  if not fl or not ft or not fu or now >= fu + idle then
    fl, ft = fcap, now
  end
  fl, ft = refill(fl, fcap, ft, rate, now)
  if fl >= ONE then
    fl = fl - ONE
    src = 2
  end
  redis.call('HSET', KEYS[2], 'l', int(fl), 'c', int(fcap), 'rate', ARGV[7], 't', int(ft), 'u', int(now))
  redis.call('PEXPIRE', KEYS[2], int(idle + grace))
end
if src ~= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[1])
  redis.call('ZADD', KEYS[3], int(resExp), nonce .. ':' .. src)
  local keep = resExp - now + grace
  if redis.call('PTTL', KEYS[3]) < keep then redis.call('PEXPIRE', KEYS[3], int(keep)) end
end
return src
`)

// poolEndScript ends a reservation's token: a settled attempt keeps it, a
// released one gives it back (not above capacity; a floor is refilled up
// to now first).
//
// KEYS: the token's cohort bucket or pool floor, pool tokens.
// ARGV: now, nonce, source (1 cohort | 2 floor), 1 release | 0 settle, idle ttl.
// Returns 1 if the token was held, 0 (changing nothing) if not.
var poolEndScript = redis.NewScript(prelude + `
local now, idle = tonumber(ARGV[1]), tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
if redis.call('ZREM', KEYS[2], ARGV[2] .. ':' .. ARGV[3]) == 0 then return 0 end
if ARGV[4] ~= '1' then return 1 end
if ARGV[3] == '1' then
  local v = redis.call('HMGET', KEYS[1], 'l', 'c', 'u')
  local l, c, u = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
  if l and c and u and now < u + idle then
    redis.call('HSET', KEYS[1], 'l', int(math.min(c, l + ONE)))
  end
else
  local v = redis.call('HMGET', KEYS[1], 'l', 'c', 'rate', 't', 'u')
  local l, c, rate, t, u = tonumber(v[1]), tonumber(v[2]), tonumber(v[3]), tonumber(v[4]), tonumber(v[5])
  if l and c and rate and t and u and now < u + idle then
    l, t = refill(l, c, t, rate, now)
    redis.call('HSET', KEYS[1], 'l', int(math.min(c, l + ONE)), 't', int(t))
  end
end
return 1
`)

// markScript sets a route flag, keeping the later of the old and new expiry.
//
// KEYS: route flags (HASH q quarantine-until, p pushback-until, e
// ejected-until, ms). ARGV: now, field (q | p | e), until, gc grace.
var markScript = redis.NewScript(prelude + `
local now, untilMs, grace = tonumber(ARGV[1]), tonumber(ARGV[3]), tonumber(ARGV[4])
if untilMs > (tonumber(redis.call('HGET', KEYS[1], ARGV[2])) or 0) then
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
end
local v = redis.call('HMGET', KEYS[1], 'q', 'p', 'e')
local last = math.max(tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3]) or 0)
redis.call('PEXPIRE', KEYS[1], int(last - now + grace))
return 1
`)

// leaseScript records or renews a holder's lease and forgets expired ones.
//
// KEYS: route leases (ZSET holder → expiry ms). ARGV: now, holder, until, gc grace.
var leaseScript = redis.NewScript(prelude + `
local now, grace = tonumber(ARGV[1]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], int(tonumber(last[2]) - now + grace))
return 1
`)
