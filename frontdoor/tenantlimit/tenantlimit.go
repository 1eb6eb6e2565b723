// Package tenantlimit holds each tenant's request-rate and concurrency
// limits, which both front doors apply before a group runs, beside the
// spend ceilings the dispatcher applies (docs/architecture.md §2):
//
//   - request rate: a token bucket per tenant, refilled at
//     RequestsPerSecond up to Burst; an empty bucket refuses with the time
//     until its next token;
//   - concurrency: at most MaxConcurrent requests in flight per tenant,
//     each holding a lease with a TTL that the Limiter refreshes while the
//     request runs, so a slot whose holder died frees itself.
//
// A Store keeps the buckets and leases: Memory for one replica, and
// redistenantlimit's on Redis, where the limits hold across every replica
// sharing it. tenantlimittest is the conformance suite both pass. The
// Limiter over a Store is what the doors call.
package tenantlimit

import (
	"context"
	"errors"
	"math"
	"time"
)

// Limit is one tenant's limits. A zero field is no limit of that kind.
type Limit struct {
	// RequestsPerSecond is the bucket's refill rate.
	RequestsPerSecond float64
	// Burst is how many tokens the bucket holds: the requests a tenant may
	// send at once after a quiet spell. Zero means RequestsPerSecond
	// rounded up, at least 1.
	Burst int
	// MaxConcurrent bounds the tenant's requests in flight.
	MaxConcurrent int
}

// burst is the bucket's capacity.
func (l Limit) burst() int {
	if l.Burst > 0 {
		return l.Burst
	}
	return max(1, int(math.Ceil(l.RequestsPerSecond)))
}

// IsZero reports whether the limit limits nothing.
func (l Limit) IsZero() bool { return l.RequestsPerSecond <= 0 && l.MaxConcurrent <= 0 }

// Store keeps the tenants' token buckets and concurrency leases. Keys are
// tenant names; every method is atomic for its key, across every caller
// of the same store (on Redis, across replicas). Times are the store's
// own clock (its Now), so a test clock drives them.
type Store interface {
	// Take takes one token from the bucket under key, which holds at most
	// burst tokens (full at first) and refills at rate per second. With no
	// token left it takes nothing and says how long until one is there.
	Take(ctx context.Context, key string, rate float64, burst int) (ok bool, wait time.Duration, err error)
	// Acquire gives holder one of the max slots under key until ttl
	// passes, after dropping the leases already expired; false when all
	// max are held.
	Acquire(ctx context.Context, key, holder string, max int, ttl time.Duration) (bool, error)
	// Refresh extends holder's lease to ttl from now; false when the lease
	// is gone (expired, or never held).
	Refresh(ctx context.Context, key, holder string, ttl time.Duration) (bool, error)
	// Release frees holder's slot; releasing a slot not held is no error.
	Release(ctx context.Context, key, holder string) error
}

// Reason says which limit refused a request; it is the metrics label.
type Reason string

const (
	ReasonRate        Reason = "rate"
	ReasonConcurrency Reason = "concurrency"
)

// ConcurrencyRetryAfter is the retry hint of a concurrency refusal: a slot
// frees when some request of the tenant ends, which nothing predicts, so a
// short wait (Retry-After's smallest whole value).
const ConcurrencyRetryAfter = time.Second

// Refusal is the error of a request over its tenant's limit.
type Refusal struct {
	Reason Reason
	// RetryAfter is when a retry may be admitted: the time until the
	// bucket's next token, or ConcurrencyRetryAfter.
	RetryAfter time.Duration
	// Limit is the limit that refused: requests per second or requests in
	// flight, for the message.
	Limit float64
}

func (r *Refusal) Error() string {
	if r.Reason == ReasonConcurrency {
		return "tenantlimit: the tenant's requests in flight are at their limit"
	}
	return "tenantlimit: the tenant's request rate is over its limit"
}

// errStore marks a store failure in what the Limiter logs.
var errStore = errors.New("tenantlimit: store unavailable")
