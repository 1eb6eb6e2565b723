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
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// ErrInvalidRequest wraps every refusal of a malformed ceiling or call.
var ErrInvalidRequest = errors.New("slice: invalid ceiling")

// Rate is a ceiling on how fast units are spent: a token bucket refilled at
// PerSecond up to Burst, shared by every gateway of the region. A bucket
// with PerSecond 0 never refills: keyed by a fixed window (as a tenant's
// spend window is), it is the window's budget.
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
	if !(r.PerSecond >= 0) || !(r.Burst >= 1) || math.IsInf(r.PerSecond, 0) || math.IsInf(r.Burst, 0) {
		return fmt.Errorf("%w: rate %q: per second must be ≥ 0 and burst at least 1 (got %v, %v)", ErrInvalidRequest, r.Key, r.PerSecond, r.Burst)
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
	// Take first adjusts r's bucket by adjust tokens — a positive adjust
	// puts unspent tokens back (never past the burst), a negative one
	// charges what a gateway spent without asking (over-use, or its safe
	// share while the granter was away), which may leave the bucket in
	// debt — and then grants holder up to want tokens. When the bucket
	// cannot give every live asker what it wants, it gives each its part of
	// what is there in proportion to what it wants (for another holder,
	// what it asked for within DemandWindow and did not get), so no gateway
	// starves another by asking first, and one that got what it asked for
	// takes no part from the next asker. took
	// may be a fraction of a token; left is what the bucket holds after
	// (below zero in debt): what a gateway cut off from the granter
	// divides into its safe share of a budget that never refills. When
	// took < want, wait is how long until the bucket holds one more (0 for
	// a bucket that never refills).
	Take(ctx context.Context, r Rate, holder string, want, adjust float64) (took, left float64, wait time.Duration, err error)
	// Hold sets holder's slots of c to want until ttl from now, or to as
	// many as the other live holders leave free when that is fewer, and
	// answers what holder now holds. A hold that expires is free for
	// others; want 0 gives every slot back.
	Hold(ctx context.Context, c Concurrency, holder string, want int, ttl time.Duration) (held int, err error)
	// Alive records holder as a live gateway of the region until ttl from
	// now and counts the live ones, itself included: the divisor of every
	// safe share. epoch names the granter's state: it changes when that
	// state was lost (a Redis restarted empty), and the gateways then
	// charge again what they spent of the budgets that do not refill.
	Alive(ctx context.Context, holder string, ttl time.Duration) (alive int, epoch string, err error)
}

// Rebudget is what a bucket last asked for with burst gains when r asks
// with another: a budget that never refills gains (or loses) the change
// of its ceiling, as a spend window whose limit a reload raised; a bucket
// that refills gains nothing, and is only capped at its new burst.
func Rebudget(r Rate, burst float64) float64 {
	if r.PerSecond > 0 || burst == 0 {
		return 0
	}
	return r.Burst - burst
}

// DemandWindow is how long what a holder asked for and did not get counts
// in the sharing of
// a contended bucket: a few of its background rounds, so a gateway that
// stopped asking stops taking part soon.
const DemandWindow = 2 * time.Second

// Share is holder's part of tokens when the live wants (each holder's
// last, its own current one included) are wants: all it wants when the
// tokens cover every want, else tokens in proportion to its want. Every
// granter shares by it.
func Share(tokens, want float64, wants map[string]float64) float64 {
	// Summed in the holders' order, so every granter adds the same doubles
	// in the same order and answers the same share to the bit.
	total := 0.0
	for _, holder := range slices.Sorted(maps.Keys(wants)) {
		total += wants[holder]
	}
	if total <= tokens || total == 0 {
		return math.Min(want, tokens)
	}
	return math.Min(want, tokens*want/total)
}

// UntilToken is how long a bucket holding tokens (< 1) takes to hold one
// at perSecond, rounded up to the millisecond, at least one, and at most
// the longest time.Duration (a very slow bucket's wait would overflow it):
// every granter answers the same wait. A bucket that never refills
// answers 0.
func UntilToken(tokens, perSecond float64) time.Duration {
	if perSecond <= 0 {
		return 0
	}
	ms := math.Ceil((1 - tokens) * 1000 / perSecond)
	if !(ms < maxWaitMs) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(max(ms, 1)) * time.Millisecond
}

// maxWaitMs is the first whole millisecond past the longest time.Duration.
const maxWaitMs = float64(math.MaxInt64/int64(time.Millisecond)) + 1

// NewEpoch names a granter's fresh state: random, so two states never
// share a name.
func NewEpoch() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}
