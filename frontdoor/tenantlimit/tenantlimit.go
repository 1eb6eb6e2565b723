// Package tenantlimit holds each tenant's request-rate and concurrency
// limits, which both front doors apply before a group runs, beside the
// spend ceilings the dispatcher applies (docs/architecture.md §2):
//
//   - request rate: a token bucket per tenant, refilled at
//     RequestsPerSecond up to Burst; an empty bucket refuses with the time
//     until its next token;
//   - concurrency: at most MaxConcurrent requests in flight per tenant.
//
// Both are ceilings of the region, spent from the gateway's slices of them
// (docs/architecture.md §7 "Slices"): a request takes its token and its
// slot in memory, with no round trip in the common case, and while the
// region's granter (Redis) cannot be reached each gateway keeps within its
// safe share. The Limiter is what the doors call; Ceilings is what it
// spends from, in plain types (budgets/slice's Slices has them, and
// internal/node hands them over).
package tenantlimit

import (
	"context"
	"math"
	"time"
)

// Ceilings are the region's ceilings as a gateway spends them:
// *slice.Slices of package budgets/slice.
type Ceilings interface {
	// TakeRate spends one token of the bucket key (refilled at perSecond
	// up to burst), or says how long until one is likely there; kind
	// labels its metrics.
	TakeRate(ctx context.Context, key, kind string, perSecond, burst float64) (bool, time.Duration)
	// AcquireSlot takes one of max slots under key; ReleaseSlot gives one
	// back.
	AcquireSlot(ctx context.Context, key, kind string, max int) bool
	ReleaseSlot(key string)
}

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

// The keys and kinds of a tenant's ceilings. The kinds label the slices'
// metrics; the tenant's name never does.
const (
	rateKind        = "tenant_rate"
	concurrencyKind = "tenant_concurrency"
)

func rateKey(tenant string) string        { return "tenant:" + tenant + ":rate" }
func concurrencyKey(tenant string) string { return "tenant:" + tenant + ":concurrency" }

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
