// Package slice splits a region's ceilings into slices that each gateway
// spends from in memory (docs/architecture.md §7, "Slices"), so a request
// makes no budget round trip and the limits still hold, within a bound,
// when the region's store cannot be reached.
//
// A Granter keeps each ceiling whole: the tokens of a rate ceiling (a token
// bucket, full at first, refilled at PerSecond up to Burst) and the slots of a
// concurrency ceiling held by each gateway. A token leaves the bucket when it
// is granted, so the tokens granted over any interval are at most the
// bucket's burst plus its refill, however many gateways ask; a slot is held
// by one gateway until it gives it back or its hold expires, so the slots
// held never exceed Max. Memory is the granter of one process (and tests);
// redisslice's is the one a region's gateways share.
//
// Slices is a gateway's side: it asks for tokens about a second before its
// slice runs dry, in grants sized by its own recent use, keeps a freed slot
// a moment for the next request, and renews what it holds in the background.
// When the granter fails, it spends what its slices still hold and then a
// safe share: the ceiling divided by the gateways it last saw alive, never
// more.
package slice

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// ErrInvalidRequest wraps every refusal of a malformed ceiling or call.
var ErrInvalidRequest = errors.New("slice: invalid ceiling")

// Rate is a ceiling on how fast units are spent: a token bucket refilled at
// PerSecond up to Burst, shared by every gateway of the region.
type Rate struct {
	// Key names the ceiling across the region, e.g. "tenant:acme:rate".
	Key string
	// Kind labels the ceiling's metrics, e.g. "tenant_rate": a bounded
	// set of names, never a tenant's or a route's.
	Kind      string
	PerSecond float64
	Burst     float64
}

// Concurrency is a ceiling on how many units are held at once across the
// region, e.g. a tenant's requests in flight.
type Concurrency struct {
	Key  string
	Kind string
	Max  int
}

// Validate refuses a rate ceiling that cannot hold.
func (r Rate) Validate() error {
	if r.Key == "" || r.Kind == "" {
		return fmt.Errorf("%w: a rate ceiling needs a key and a kind", ErrInvalidRequest)
	}
	if !(r.PerSecond > 0) || !(r.Burst >= 1) || math.IsInf(r.PerSecond, 0) || math.IsInf(r.Burst, 0) {
		return fmt.Errorf("%w: rate %q: per second must be positive and burst at least 1 (got %v, %v)", ErrInvalidRequest, r.Key, r.PerSecond, r.Burst)
	}
	return nil
}

// Validate refuses a concurrency ceiling that cannot hold.
func (c Concurrency) Validate() error {
	if c.Key == "" || c.Kind == "" {
		return fmt.Errorf("%w: a concurrency ceiling needs a key and a kind", ErrInvalidRequest)
	}
	if c.Max < 1 {
		return fmt.Errorf("%w: concurrency %q: max must be at least 1 (got %d)", ErrInvalidRequest, c.Key, c.Max)
	}
	return nil
}

// Granter keeps the region's ceilings whole and grants slices of them.
// Implementations are safe for concurrent use, atomic per ceiling across
// every caller sharing them, and pass the conformance suite in slicetest.
type Granter interface {
	// Take puts giveBack unspent tokens back into r's bucket (never past
	// its burst), then takes up to want tokens from it: took is what it
	// took (whole tokens, possibly 0), and when took < want, wait is how
	// long until the bucket holds one more.
	Take(ctx context.Context, r Rate, want, giveBack float64) (took float64, wait time.Duration, err error)
	// Hold sets holder's slots of c to want until ttl from now, or to as
	// many as the other live holders leave free when that is fewer, and
	// answers what holder now holds. A hold that expires is free for
	// others; want 0 gives every slot back.
	Hold(ctx context.Context, c Concurrency, holder string, want int, ttl time.Duration) (held int, err error)
	// Alive records holder as a live gateway of the region until ttl from
	// now and counts the live ones, itself included: the divisor of every
	// safe share.
	Alive(ctx context.Context, holder string, ttl time.Duration) (int, error)
}

// UntilToken is how long a bucket holding tokens (< 1) takes to hold one
// at perSecond, rounded up to the millisecond, at least one, and at most
// the longest time.Duration (a very slow bucket's wait would overflow it):
// every granter answers the same wait.
func UntilToken(tokens, perSecond float64) time.Duration {
	ms := math.Ceil((1 - tokens) * 1000 / perSecond)
	if !(ms < maxWaitMs) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(max(ms, 1)) * time.Millisecond
}

// maxWaitMs is the first whole millisecond past the longest time.Duration.
const maxWaitMs = float64(math.MaxInt64/int64(time.Millisecond)) + 1
