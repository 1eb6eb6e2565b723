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
package redisreplay

import (
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
	if opts.MaxEntryBytes < 0 || opts.Timeout < 0 {
		return nil, errors.New("redisreplay: the entry bound and the timeout must not be negative")
	}
	if opts.Prefix == "" {
		opts.Prefix = "hr"
	}
	if opts.MaxEntryBytes == 0 {
		opts.MaxEntryBytes = replay.DefaultMaxEntryBytes
	}
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
	ExpiresMs   int64             `json:"e"`
}

func (s *Store) key(k string) string { return s.opts.Prefix + ":{rp:" + k + "}" }

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
	return &replay.Answer{Fingerprint: e.Fingerprint, Status: e.Status, Header: e.Header, Body: e.Body}, nil
}

// Put stores a under key for ttl; ErrTooLarge above the entry bound.
func (s *Store) Put(ctx context.Context, key string, a *replay.Answer, ttl time.Duration) error {
	if ttl <= 0 {
		return errors.New("redisreplay: the TTL must be positive")
	}
	data, err := json.Marshal(entry{Fingerprint: a.Fingerprint, Status: a.Status, Header: a.Header, Body: a.Body,
		ExpiresMs: s.opts.Now().Add(ttl).UnixMilli()})
	if err != nil {
		return fmt.Errorf("redisreplay: encode an answer: %w", err)
	}
	if len(data) > s.opts.MaxEntryBytes {
		return replay.ErrTooLarge
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	if err := s.client.Set(ctx, s.key(key), data, ttl).Err(); err != nil {
		return fmt.Errorf("redisreplay: set: %w", err)
	}
	return nil
}
