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

-- windowSums forgets the fields of a cohort's window (HASH p:<slot>
-- primaries, x:<slot> extra attempts) whose slot left the window of n
-- slots that ends with slot cur, and returns the primaries and extras of
-- the slots left, then those of its last nb slots (the burst bound's).
local function windowSums(key, cur, n, nb)
  local all = redis.call('HGETALL', key)
  local p, x, pb, xb, stale = 0, 0, 0, 0, {}
  for i = 1, #all, 2 do
    local slot = tonumber(string.sub(all[i], 3))
    if not slot or slot <= cur - n then
      stale[#stale + 1] = all[i]
    else
      local v = tonumber(all[i + 1])
      local burst = slot > cur - nb
      if string.sub(all[i], 1, 1) == 'p' then
        p = p + v
        if burst then pb = pb + v end
      else
        x = x + v
        if burst then xb = xb + v end
      end
    end
  end
  if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  return p, x, pb, xb
end

-- uncount takes one back from a window's field, if the field is still
-- there: a slot that left the window holds nothing to give back.
local function uncount(key, field)
  local v = tonumber(redis.call('HGET', key, field))
  if v and v > 0 then redis.call('HINCRBY', key, field, -1) end
end

-- refill adds the reserve tokens earned since t; t moves on only when at
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
// A ledger counts the slots each named group holds (g:<group>), the slots
// forgiven in its lifetime (f, at most its max m), and first forgives the
// slots a dead group still holds when one is named (budgets.AdmitRequest).
//
// KEYS: account hash, reservation units (HASH nonce → units), reservation
// expiries (ZSET nonce → ms).
// ARGV: now, nonce, max attempts (0: no ledger), units, ceiling (0: none),
// reservation expiry, minimum account expiry, gc grace, group (hash, or
// empty), dead group to forgive (hash, or empty).
// Returns {0 granted | 1 attempts full | 2 ceiling reached, attempts used,
// ms until the ledger lapses when attempts are full and it forgave slots
// or holds a live reservation, else 0}. A replay of a granted call (same
// nonce) returns the grant again.
var takeScript = redis.NewScript(prelude + `
local now, nonce = tonumber(ARGV[1]), ARGV[2]
local max, units, ceiling = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local resExp, minExp, grace = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local group, dead = ARGV[9], ARGV[10]
if redis.call('HEXISTS', KEYS[2], nonce) == 1 then
  return {0, tonumber(redis.call('HGET', KEYS[1], 'a')) or 0, 0}
end
local acct = load(now, ARGV[1])
local forgiven = tonumber(redis.call('HGET', KEYS[1], 'f')) or 0
if max > 0 and dead ~= '' and acct.e then
  local n = math.min(tonumber(redis.call('HGET', KEYS[1], 'g:' .. dead)) or 0, max - forgiven)
  if n > 0 then
    acct.a, forgiven = acct.a - n, forgiven + n
    redis.call('HINCRBY', KEYS[1], 'g:' .. dead, -n)
    redis.call('HSET', KEYS[1], 'a', int(acct.a), 'f', int(forgiven))
  end
end
local code = 0
if max > 0 and acct.a >= max then
  code = 1
elseif ceiling > 0 and acct.s + acct.r + units > ceiling then
  code = 2
end
if code ~= 0 then
  if acct.dirty then redis.call('HSET', KEYS[1], 'r', int(acct.r)) end
  local after = 0
  if code == 1 and acct.e and (forgiven > 0 or redis.call('ZCARD', KEYS[3]) > 0) then after = acct.e - now end
  return {code, acct.a, after}
end
if max > 0 then
  acct.a = acct.a + 1
  redis.call('HSET', KEYS[1], 'm', int(max))
  if group ~= '' then redis.call('HINCRBY', KEYS[1], 'g:' .. group, 1) end
end
acct.r = acct.r + units
local e = math.max(acct.e or 0, resExp, minExp)
redis.call('HSET', KEYS[1], 'a', int(acct.a), 's', int(acct.s), 'r', int(acct.r), 'e', int(e))
redis.call('HSET', KEYS[2], nonce, int(units))
redis.call('ZADD', KEYS[3], int(resExp), nonce)
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], int(e - now + grace)) end
return {0, acct.a, 0}
`)

// endScript ends an account's share of a live reservation: settle replaces
// the reserved units by the used ones; release gives the units back and,
// for a user action (ARGV[5] = 1), the attempt slot — unless its group
// holds none, a forgiveness having given it back already. A settle of an
// attempt lost with its worker (ARGV[7] = 1) forgives its slot, within the
// ledger's forgiveness bound (f < m).
//
// KEYS: as takeScript. ARGV: now, nonce, 1 settle | 0 release, used units,
// 1 give back the slot | 0, the reservation's group (hash, or empty), 1 lost | 0.
// Returns 1 if the reservation was live here, 0 (changing nothing) if not.
var endScript = redis.NewScript(prelude + `
local now, nonce, group = tonumber(ARGV[1]), ARGV[2], ARGV[6]
-- slotBack gives back one slot of group, if it still holds one.
local function slotBack(acct)
  if group == '' then
    acct.a = acct.a - 1
    return true
  end
  if (tonumber(redis.call('HGET', KEYS[1], 'g:' .. group)) or 0) > 0 then
    redis.call('HINCRBY', KEYS[1], 'g:' .. group, -1)
    acct.a = acct.a - 1
    return true
  end
  return false
end
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
  if ARGV[7] == '1' then
    local v = redis.call('HMGET', KEYS[1], 'f', 'm')
    local f, m = tonumber(v[1]) or 0, tonumber(v[2]) or 0
    if f < m and slotBack(acct) then redis.call('HSET', KEYS[1], 'f', int(f + 1)) end
  end
elseif ARGV[5] == '1' then
  slotBack(acct)
end
redis.call('HSET', KEYS[1], 'a', int(acct.a), 's', int(acct.s), 'r', int(acct.r))
return 1
`)

// countScript counts an admitted primary in its cohort's window.
//
// KEYS: cohort window (HASH p:<slot> primaries, x:<slot> extra attempts).
// ARGV: slot index, slots in the window, key ttl (ms).
var countScript = redis.NewScript(prelude + `
windowSums(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), 0)
redis.call('HINCRBY', KEYS[1], 'p:' .. ARGV[1], 1)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
`)

// uncountScript takes back the count of a primary whose admission was
// denied. A hedge decided in between may have counted it; the window
// then holds one hedge more than its primaries allowed, until that slot
// leaves it.
//
// KEYS: cohort window. ARGV: the field (p:<slot>).
var uncountScript = redis.NewScript(prelude + `
uncount(KEYS[1], ARGV[1])
return 1
`)

// poolCountScript counts an extra attempt in its cohort's window: a
// replacement or a continuation always; a hedge when the window has room
// for it under the ceiling, reserve left ((x + 1) + reserve ≤ ceiling × p,
// in microtokens), and its last burst slots under the burst ceiling (xb + 1
// ≤ burst ceiling × pb, when burst slots > 0), else when the pool's reserve,
// refilled up to now, pays a token. It records the count in the pool's
// tokens, so it ends once.
//
// KEYS: cohort window, pool reserve (HASH l level, c capacity, rate
// microtokens/s, t last refill, u last use), pool tokens (ZSET
// "nonce:source" → reservation expiry).
// ARGV: now, nonce, slot index, slots in the window, ceiling (microtokens
// per primary), replacement reserve (microtokens), 1 replacement or
// continuation | 0 hedge, reserve capacity, reserve rate (microtokens/s),
// reservation expiry, reserve idle ttl, gc grace, window key ttl, burst
// slots, burst ceiling (microtokens per primary).
// Returns the source: 0 none (a hedge refused), 1 cohort, 2 reserve, 3 a
// replacement or a continuation. A replay of a granted call returns the
// same source.
var poolCountScript = redis.NewScript(prelude + `
local now, nonce, slot = tonumber(ARGV[1]), ARGV[2], ARGV[3]
for src = 1, 3 do
  if redis.call('ZSCORE', KEYS[3], nonce .. ':' .. src) then return src end
end
local n, ceiling, reserve = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local fcap, rate = tonumber(ARGV[8]), tonumber(ARGV[9])
local resExp, idle, grace = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local nb, burstCeiling = tonumber(ARGV[14]), tonumber(ARGV[15])
local p, x, pb, xb = windowSums(KEYS[1], tonumber(slot), n, nb)
local src = 0
if ARGV[7] == '1' then
  src = 3
elseif (x + 1) * ONE + reserve <= ceiling * p and (nb == 0 or (xb + 1) * ONE <= burstCeiling * pb) then
  src = 1
elseif fcap > 0 then
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
  redis.call('HSET', KEYS[2], 'l', int(fl), 'c', int(fcap), 'rate', ARGV[9], 't', int(ft), 'u', int(now))
  redis.call('PEXPIRE', KEYS[2], int(idle + grace))
end
if src ~= 0 then
  redis.call('HINCRBY', KEYS[1], 'x:' .. slot, 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[13])
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[1])
  redis.call('ZADD', KEYS[3], int(resExp), nonce .. ':' .. src)
  local keep = resExp - now + grace
  if redis.call('PTTL', KEYS[3]) < keep then redis.call('PEXPIRE', KEYS[3], int(keep)) end
end
return src
`)

// poolEndScript ends a reservation's count: a settled attempt stays
// counted; a released one is uncounted from its slot (if the slot is
// still in the window) and gives a reserve token back (not above capacity,
// the reserve refilled up to now first).
//
// KEYS: the count's cohort window, pool reserve, pool tokens.
// ARGV: now, nonce, source (1 cohort | 2 reserve | 3 replacement), 1 release
// | 0 settle, slot index, reserve idle ttl.
// Returns 1 if the count was held, 0 (changing nothing) if not.
var poolEndScript = redis.NewScript(prelude + `
local now, idle = tonumber(ARGV[1]), tonumber(ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[1])
if redis.call('ZREM', KEYS[3], ARGV[2] .. ':' .. ARGV[3]) == 0 then return 0 end
if ARGV[4] ~= '1' then return 1 end
uncount(KEYS[1], 'x:' .. ARGV[5])
if ARGV[3] == '2' then
  local v = redis.call('HMGET', KEYS[2], 'l', 'c', 'rate', 't', 'u')
  local l, c, rate, t, u = tonumber(v[1]), tonumber(v[2]), tonumber(v[3]), tonumber(v[4]), tonumber(v[5])
  if l and c and rate and t and u and now < u + idle then
    l, t = refill(l, c, t, rate, now)
    redis.call('HSET', KEYS[2], 'l', int(math.min(c, l + ONE)), 't', int(t))
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
