// Package replay keeps the committed answers of user actions so a retry
// with the same Idempotency-Key gets the answer back instead of a new
// provider call (docs/architecture.md §2, §6, Stripe's model).
//
// A Store maps a key — a hash of the tenant and the caller's key, never the
// key itself — to an Answer: the exact bytes a door wrote, its status, the
// headers that matter, and a fingerprint of the request that produced it, so
// a key reused with another request is told apart. Entries expire after a
// TTL and are bounded in size, per entry and in total. Memory is the store
// of one replica; replaytest is the conformance suite every store passes.
//
// Answers hold callers' outputs: no store logs or records them.
package replay

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"
)

// DefaultTTL is how long a committed answer is replayed: a day, as Stripe
// keeps its idempotency keys.
const DefaultTTL = 24 * time.Hour

// Default size bounds of a store.
const (
	DefaultMaxEntryBytes = 4 << 20
	DefaultMaxTotalBytes = 256 << 20
)

// ErrTooLarge is returned by Put for an answer above the store's per-entry
// bound (or its total): it is not kept, and a retry runs again.
var ErrTooLarge = errors.New("replay: answer larger than the store keeps")

// Answer is one committed answer as a door wrote it.
type Answer struct {
	// Fingerprint identifies the request that produced the answer
	// (Fingerprint); a retry naming the same key with another request is
	// refused.
	Fingerprint string
	// Status is the HTTP status written (200 for a NATS answer).
	Status int
	// Header holds the headers that describe the answer (content type,
	// X-Hedgerow-*), as plain headers even when first sent as trailers.
	Header map[string]string
	// Body is every byte of the body as written: a JSON answer or a whole
	// event stream.
	Body []byte
}

// size is what an answer counts against the bounds.
func (a *Answer) size() int {
	n := len(a.Fingerprint) + len(a.Body)
	for k, v := range a.Header {
		n += len(k) + len(v)
	}
	return n
}

// Store keeps committed answers by key for a TTL.
type Store interface {
	// Get returns the live answer stored under key, or nil.
	Get(ctx context.Context, key string) (*Answer, error)
	// Put stores a copy of a under key for ttl, replacing any earlier
	// answer; ErrTooLarge when a is over the bounds.
	Put(ctx context.Context, key string, a *Answer, ttl time.Duration) error
}

// Key is the store key of a user action: a hash of tenant and the caller's
// Idempotency-Key, so neither is kept in the clear.
func Key(tenant, idempotencyKey string) string {
	return hashOf("key", tenant, idempotencyKey)
}

// Fingerprint hashes what makes two requests the same request: the door's
// dialect and path and the canonical request (its encoding as the door
// submits it).
func Fingerprint(dialect, path string, canonical []byte) string {
	return hashOf("request", dialect, path, string(canonical))
}

func hashOf(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		var n [8]byte
		for i := range n {
			n[i] = byte(len(p) >> (8 * i))
		}
		h.Write(n[:]) // length-prefixed: no two part lists collide by concatenation
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil))
}

func clone(a *Answer) *Answer {
	c := *a
	c.Body = append([]byte(nil), a.Body...)
	c.Header = make(map[string]string, len(a.Header))
	for k, v := range a.Header {
		c.Header[k] = v
	}
	return &c
}
