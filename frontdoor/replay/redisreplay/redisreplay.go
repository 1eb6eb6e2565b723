// Package redisreplay is the replay.Store that gateway replicas share
// through Redis, so a retry of an Idempotency-Key reaching any replica gets
// the committed answer back (docs/architecture.md §2).
//
// One key per user action, `<prefix>:{rp:<replay key>}` (one hash slot, so
// it works on a Redis Cluster), holds the answer and its expiry. Expiry is
// judged on the store's clock against the expiry in the value, so a test
// clock decides it; the key's PX TTL (the same TTL, on Redis' clock) only
// lets Redis collect it. The per-entry bound is the store's; the total is
// Redis' own maxmemory with an eviction policy. Answers are never logged.
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
	if opts.MaxEntryBytes < 0 || opts.Timeout < 0 || opts.MarkerKeep < 0 {
		return nil, errors.New("redisreplay: the entry bound, the timeout and the marker keep must not be negative")
	}
	opts.MarkerKeep = cmp.Or(opts.MarkerKeep, replay.DefaultMarkerKeep)
	opts.Prefix = cmp.Or(opts.Prefix, "hr")
	opts.MaxEntryBytes = cmp.Or(opts.MaxEntryBytes, replay.DefaultMaxEntryBytes)
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

// Put stores a under key for ttl; ErrTooLarge above the entry bound.
func (s *Store) Put(ctx context.Context, key string, a *replay.Answer, ttl time.Duration) error {
	if ttl <= 0 {
		return errors.New("redisreplay: the TTL must be positive")
	}
	data, err := json.Marshal(entry{Fingerprint: a.Fingerprint, Status: a.Status, Header: a.Header, Body: a.Body,
		NotKept: a.NotKept, ExpiresMs: s.opts.Now().Add(ttl).UnixMilli()})
	if err != nil {
		return fmt.Errorf("redisreplay: encode an answer: %w", err)
	}
	if len(data) > s.opts.MaxEntryBytes {
		return replay.ErrTooLarge
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	pipe := s.client.TxPipeline()
	pipe.Set(ctx, s.key(key), data, ttl)
	pipe.Del(ctx, s.leaseKey(key))
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("redisreplay: set: %w", err)
	}
	return nil
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
