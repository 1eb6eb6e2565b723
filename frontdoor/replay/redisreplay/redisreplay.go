// Package redisreplay is the replay.Store that gateway replicas share
// through Redis, so a retry of an Idempotency-Key reaching any replica gets
// the committed answer back (docs/architecture.md §2).
//
// One key per user action, `<prefix>:{rp:<replay key>}` (one hash slot, so
// it works on a Redis Cluster), holds the answer and its expiry. Expiry is
// judged on the store's clock against the expiry in the value, so a test
// clock decides it; the key's PX TTL (the same TTL, on Redis' clock) only
// lets Redis collect it. Answers are never logged.
//
// Both bounds are the store's. The total (max_total_bytes, for all the
// gateways sharing the Redis) cannot be left to Redis' maxmemory: Redis
// runs noeviction, since an evicting policy would drop winner-gate keys
// and let a user action commit twice, so answers filling it would make
// the gate's writes fail. The bytes kept are counted in time buckets, a
// twenty-fourth of the answer's TTL wide, in one hash `<prefix>:{rp}:bytes`
// (a slot of its own: the answers' keys sit in many slots): field = the
// bucket's start in Unix ms, value = "<bytes> <expiry ms>", the expiry
// being the bucket's end plus the TTL, when the last answer it counts has
// expired. Put first reserves the answer's bytes (its JSON, its key and
// entryOverhead for Redis' own structures) with one script that drops the
// lapsed buckets, sums the rest and adds to the current bucket only if
// the sum stays within the bound — else ErrStoreFull, nothing stored —
// and then stores the answer; a SET that fails gives its bytes back.
//
// What the count allows (a Redis Cluster cannot run the count and the SET
// in one script, their keys being in different slots): racing Puts never
// pass the bound together, since the check and the count are one script;
// the count errs high, refusing early, by (a) the answers of a bucket
// that expired before it, at most a bucket's width (TTL/24) of Puts,
// (b) an answer replaced under the same key, counted twice, and (c) a
// reservation whose SET failed and whose give-back failed too (a gateway
// killed, or Redis lost, between the two round trips): one entry each,
// every one of them gone when its bucket lapses, within the TTL plus a
// bucket. It errs low by a SET applied whose reply was lost (given back
// though kept), one entry each, for at most the TTL.
//
// A key's in-flight marker is `<prefix>:{rp:<replay key>}:lease`, in the
// answer's hash slot, so Put can store the answer and drop the marker in one
// transaction; Claim, Refresh and Release are Lua scripts (compare the lease
// and its token, then set or delete). Lease expiry is judged like an
// answer's, on the store's clock against the expiry in the value (replicas'
// clocks must agree to well within a lease); the key's PX TTL is the marker
// keep, so a lapsed marker is remembered as an orphan that long.
package redisreplay

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/frontdoor/replay"
)

// Options configure a Store.
type Options struct {
	// Prefix starts every key; empty means "hr", as redis.key_prefix.
	Prefix string
	// MaxEntryBytes bounds one answer; zero means
	// replay.DefaultMaxEntryBytes.
	MaxEntryBytes int
	// MaxTotalBytes bounds the answers every store sharing the Redis (and
	// Prefix) keeps together; zero means replay.DefaultMaxTotalBytes. It
	// must sit well under Redis' maxmemory, which holds the winner gate,
	// the budgets and the markers too.
	MaxTotalBytes int
	// Timeout bounds one round trip; zero means none beyond the caller's
	// context.
	Timeout time.Duration
	// MarkerKeep is how long a marker is remembered after its last claim
	// or refresh; zero means replay.DefaultMarkerKeep.
	MarkerKeep time.Duration
	// Now is the store's clock; nil means time.Now.
	Now func() time.Time
}

// Store is a replay.Store on Redis.
type Store struct {
	client redis.UniversalClient
	opts   Options
}

var _ replay.Store = (*Store)(nil)

// New returns a Store on client.
func New(client redis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisreplay: a Redis client is required")
	}
	if opts.MaxEntryBytes < 0 || opts.MaxTotalBytes < 0 || opts.Timeout < 0 || opts.MarkerKeep < 0 {
		return nil, errors.New("redisreplay: the bounds, the timeout and the marker keep must not be negative")
	}
	opts.MarkerKeep = cmp.Or(opts.MarkerKeep, replay.DefaultMarkerKeep)
	opts.Prefix = cmp.Or(opts.Prefix, "hr")
	opts.MaxEntryBytes = cmp.Or(opts.MaxEntryBytes, replay.DefaultMaxEntryBytes)
	opts.MaxTotalBytes = cmp.Or(opts.MaxTotalBytes, replay.DefaultMaxTotalBytes)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Store{client: client, opts: opts}, nil
}

// entry is an answer as stored: the answer and its expiry in Unix
// milliseconds on the store's clock.
type entry struct {
	Fingerprint string            `json:"f"`
	Status      int               `json:"s"`
	Header      map[string]string `json:"h,omitempty"`
	Body        []byte            `json:"b"`
	NotKept     bool              `json:"n,omitempty"` // a tombstone (replay.Answer.NotKept)
	ExpiresMs   int64             `json:"e"`
}

func (s *Store) key(k string) string { return s.opts.Prefix + ":{rp:" + k + "}" }

func (s *Store) leaseKey(k string) string { return s.key(k) + ":lease" }

// bytesKey is the hash of the byte counts by time bucket, in a slot of
// its own.
func (s *Store) bytesKey() string { return s.opts.Prefix + ":{rp}:bytes" }

// entryOverhead is what an answer's key costs Redis beside the bytes of
// its name and value (its dictionary entries, objects and TTL), counted
// against the total bound with them.
const entryOverhead = 128

// bucketsPerTTL is how many time buckets one TTL spans: the count holds
// an expired answer's bytes for at most TTL/bucketsPerTTL.
const bucketsPerTTL = 24

func (s *Store) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.opts.Timeout > 0 {
		return context.WithTimeout(ctx, s.opts.Timeout)
	}
	return ctx, func() {}
}

// Get returns the live answer under key, or nil.
func (s *Store) Get(ctx context.Context, key string) (*replay.Answer, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	data, err := s.client.Get(ctx, s.key(key)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("redisreplay: get: %w", err)
	}
	var e entry
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, fmt.Errorf("redisreplay: decode a stored answer: %w", err)
	}
	if s.opts.Now().UnixMilli() >= e.ExpiresMs {
		return nil, nil
	}
	return &replay.Answer{Fingerprint: e.Fingerprint, Status: e.Status, Header: e.Header, Body: e.Body, NotKept: e.NotKept}, nil
}

// Put stores a under key for ttl; ErrTooLarge above the entry bound,
// ErrStoreFull when the answers kept would pass the total bound.
func (s *Store) Put(ctx context.Context, key string, a *replay.Answer, ttl time.Duration) error {
	if ttl <= 0 {
		return errors.New("redisreplay: the TTL must be positive")
	}
	now := s.opts.Now()
	data, err := json.Marshal(entry{Fingerprint: a.Fingerprint, Status: a.Status, Header: a.Header, Body: a.Body,
		NotKept: a.NotKept, ExpiresMs: now.Add(ttl).UnixMilli()})
	if err != nil {
		return fmt.Errorf("redisreplay: encode an answer: %w", err)
	}
	if len(data) > s.opts.MaxEntryBytes {
		return replay.ErrTooLarge
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	size := len(data) + len(s.key(key)) + entryOverhead
	bucket, err := s.reserve(ctx, now, ttl, size)
	if err != nil {
		return err
	}
	pipe := s.client.TxPipeline()
	pipe.Set(ctx, s.key(key), data, ttl)
	pipe.Del(ctx, s.leaseKey(key))
	if _, err := pipe.Exec(ctx); err != nil {
		// Not stored (or its reply lost): the bytes go back, on a context
		// of their own, as the caller's may be what ended.
		gctx, gcancel := s.ctx(context.WithoutCancel(ctx))
		defer gcancel()
		if gerr := giveBackScript.Run(gctx, s.client, []string{s.bytesKey()}, bucket, size).Err(); gerr != nil {
			err = errors.Join(err, fmt.Errorf("give the reserved bytes back: %w", gerr))
		}
		return fmt.Errorf("redisreplay: set: %w", err)
	}
	return nil
}

// reserveScript counts ARGV[1] bytes into bucket ARGV[4] of KEYS[1] (its
// expiry at least ARGV[5], Unix ms) if the live buckets — those whose
// expiry is after ARGV[3], now — plus them stay within ARGV[2]; lapsed
// buckets are dropped. It returns {1, total} when counted, {0, total}
// when refused, total being what the live buckets held before.
var reserveScript = redis.NewScript(`
local size, max, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local all = redis.call('HGETALL', KEYS[1])
local total, keep, mine, mineExp = 0, tonumber(ARGV[5]), 0, 0
for i = 1, #all, 2 do
  local b, e = string.match(all[i+1], '^(%d+) (%d+)$')
  b, e = tonumber(b), tonumber(e)
  if e == nil or e <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    total = total + b
    if e > keep then keep = e end
    if all[i] == ARGV[4] then mine, mineExp = b, e end
  end
end
if total + size > max then
  return {0, total}
end
redis.call('HSET', KEYS[1], ARGV[4], string.format('%d %d', mine + size, math.max(mineExp, tonumber(ARGV[5]))))
redis.call('PEXPIRE', KEYS[1], keep - now)
return {1, total}
`)

// giveBackScript takes ARGV[2] bytes back out of bucket ARGV[1] of
// KEYS[1], never below zero.
var giveBackScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return 0 end
local b, e = string.match(cur, '^(%d+) (%d+)$')
b = math.max(0, tonumber(b) - tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d %d', b, tonumber(e)))
return 1
`)

// reserve counts size bytes of an answer kept for ttl from now into the
// current bucket, or refuses them with ErrStoreFull; it returns the
// bucket's field.
func (s *Store) reserve(ctx context.Context, now time.Time, ttl time.Duration, size int) (string, error) {
	width := max(ttl/bucketsPerTTL, time.Millisecond).Milliseconds()
	start := now.UnixMilli() / width * width
	bucket := strconv.FormatInt(start, 10)
	expiry := start + width + ttl.Milliseconds()
	res, err := reserveScript.Run(ctx, s.client, []string{s.bytesKey()},
		size, s.opts.MaxTotalBytes, now.UnixMilli(), bucket, expiry).Slice()
	if err != nil {
		return "", fmt.Errorf("redisreplay: count the bytes kept: %w", err)
	}
	if len(res) != 2 {
		return "", fmt.Errorf("redisreplay: the count returned %d values, want 2", len(res))
	}
	if ok, _ := res[0].(int64); ok != 1 {
		return "", replay.ErrStoreFull
	}
	return bucket, nil
}

// marker is a marker as stored: the marker and its lease's expiry in Unix
// milliseconds on the store's clock.
type marker struct {
	Fingerprint string `json:"f"`
	Owner       string `json:"o"`
	Token       string `json:"t"`
	LeaseMs     int64  `json:"l"`
	KeepMs      int64  `json:"k"` // remembered until then, like ExpiresMs
}

// claimScript takes the lease KEYS[1]: ARGV[1] is the new marker, ARGV[2]
// now in Unix ms, ARGV[3] the key's PX. It returns {1, lapsed marker or ""}
// when won, {0, live marker} when held.
var claimScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
local now = tonumber(ARGV[2])
if cur then
  local m = cjson.decode(cur)
  if m.k <= now then
    cur = ''
  elseif m.l > now then
    return {0, cur}
  end
else
  cur = ''
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
return {1, cur}
`)

// refreshScript replaces the marker KEYS[1] with ARGV[2] (PX ARGV[3]) if it
// still holds token ARGV[1] and is remembered at ARGV[4] (now, Unix ms);
// 1 when it did.
var refreshScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
local m = cur and cjson.decode(cur)
if m and m.t == ARGV[1] and m.k > tonumber(ARGV[4]) then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
`)

// releaseScript deletes the marker KEYS[1] if it holds token ARGV[1].
var releaseScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and cjson.decode(cur).t == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// encodeMarker is m with a lease from now (zero: lapsed now) and the
// marker keep, and the key's PX in milliseconds.
func (s *Store) encodeMarker(m replay.Marker, lease time.Duration) (string, int64, error) {
	now, keep := s.opts.Now(), max(lease, s.opts.MarkerKeep)
	data, err := json.Marshal(marker{Fingerprint: m.Fingerprint, Owner: m.Owner, Token: m.Token,
		LeaseMs: now.Add(lease).UnixMilli(), KeepMs: now.Add(keep).UnixMilli()})
	if err != nil {
		return "", 0, fmt.Errorf("redisreplay: encode a marker: %w", err)
	}
	return string(data), keep.Milliseconds(), nil
}

func decodeMarker(raw string) (*replay.Marker, error) {
	var m marker
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return nil, fmt.Errorf("redisreplay: decode a marker: %w", err)
	}
	return &replay.Marker{Fingerprint: m.Fingerprint, Owner: m.Owner, Token: m.Token}, nil
}

// Claim takes the lease of key for m unless a live marker holds it.
func (s *Store) Claim(ctx context.Context, key string, m replay.Marker, lease time.Duration) (replay.Claimed, error) {
	if lease <= 0 {
		return replay.Claimed{}, errors.New("redisreplay: the lease must be positive")
	}
	data, keepMs, err := s.encodeMarker(m, lease)
	if err != nil {
		return replay.Claimed{}, err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	res, err := claimScript.Run(ctx, s.client, []string{s.leaseKey(key)}, data, s.opts.Now().UnixMilli(), keepMs).Slice()
	if err != nil {
		return replay.Claimed{}, fmt.Errorf("redisreplay: claim: %w", err)
	}
	if len(res) != 2 {
		return replay.Claimed{}, fmt.Errorf("redisreplay: claim returned %d values, want 2", len(res))
	}
	won, _ := res[0].(int64)
	other, _ := res[1].(string)
	if won != 1 {
		held, err := decodeMarker(other)
		if err != nil {
			return replay.Claimed{}, err
		}
		return replay.Claimed{Holder: held}, nil
	}
	c := replay.Claimed{Won: true}
	if other != "" {
		if c.Orphaned, err = decodeMarker(other); err != nil {
			return replay.Claimed{}, err
		}
	}
	return c, nil
}

// Refresh extends the lease of key if m's token holds it.
func (s *Store) Refresh(ctx context.Context, key string, m replay.Marker, lease time.Duration) (bool, error) {
	if lease <= 0 {
		return false, errors.New("redisreplay: the lease must be positive")
	}
	return s.replaceMarker(ctx, key, m, lease)
}

// Lapse ends the lease of key now if m's token holds it, leaving m as the
// orphan marker.
func (s *Store) Lapse(ctx context.Context, key string, m replay.Marker) error {
	_, err := s.replaceMarker(ctx, key, m, 0)
	return err
}

// replaceMarker sets m with lease from now as the marker of key if m's
// token holds it.
func (s *Store) replaceMarker(ctx context.Context, key string, m replay.Marker, lease time.Duration) (bool, error) {
	data, keepMs, err := s.encodeMarker(m, lease)
	if err != nil {
		return false, err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	n, err := refreshScript.Run(ctx, s.client, []string{s.leaseKey(key)}, m.Token, data, keepMs, s.opts.Now().UnixMilli()).Int64()
	if err != nil {
		return false, fmt.Errorf("redisreplay: replace a marker: %w", err)
	}
	return n == 1, nil
}

// Release drops the lease of key if m's token holds it.
func (s *Store) Release(ctx context.Context, key string, m replay.Marker) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	if err := releaseScript.Run(ctx, s.client, []string{s.leaseKey(key)}, m.Token).Err(); err != nil {
		return fmt.Errorf("redisreplay: release: %w", err)
	}
	return nil
}
