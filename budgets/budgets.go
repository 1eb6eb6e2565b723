// Package budgets holds the ceilings that bound a user action across every
// dispatcher replica (docs/architecture.md §7): the attempt ledger of each user action, the
// duplicate-rate window of each cohort with a reserve per pool, spend ceilings
// per user action and per tenant window, route pushback, quarantine and
// ejection flags, and route in-flight leases.
//
// Everything sits behind one Store interface with two implementations: Memory
// for a single replica (and the simulator, on virtual time) and a Redis store
// (package budgets/redisstore) for many. Both must pass the conformance suite
// in budgets/storetest. Store is the union of three roles that a consumer can
// ask for alone: Reservations (attempts and spend), RouteFlags (pushback,
// quarantine and ejection) and RouteLeases (attempts in flight).
//
// The interface is coarse on purpose. Each request-path call (Admit for a
// primary, ReserveExtra for a hedge, replacement or continuation) carries
// everything the decision needs, including the ceiling's configuration, so a
// Redis store can make it one pipelined batch and needs no configuration of
// its own. Keys fall into one hash tag per entity — {ua:<id>} for the ledger
// and the user action's spend, {pool:<pool>} for the cohort windows and the
// pool reserve, {tenant:<id>} for the tenant's spend window, {route:<name>}
// for route flags and leases. A decision that spans several entities takes from them in that
// order (or, as the Redis store does, from all at once, choosing the reason
// in that order) and, when an entity refuses, gives back what the others
// granted: a decision never commits in part. Microtokens, TenantWindowStart and
// the Validate functions are shared so every implementation rounds, aligns and
// refuses alike.
//
// A denial is a result (Allowed false with a Reason), never an error. Errors
// mean the request was malformed (ErrInvalidRequest), the reservation is not
// live (ErrUnknownReservation), the context ended, or the store could not be
// reached; the caller then suppresses hedges and lets primaries go on.
package budgets

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// Errors of every Store, which callers may branch on with errors.Is.
var (
	// ErrUnknownReservation is returned by Settle and Release for a
	// reservation that is not live: never granted, already settled or
	// released, or expired. The call changes nothing, which makes settling
	// exactly-once.
	ErrUnknownReservation = errors.New("budgets: unknown reservation")
	// ErrInvalidRequest wraps every validation failure of a request, so
	// callers can tell a programming or configuration error from an
	// unavailable store.
	ErrInvalidRequest = errors.New("budgets: invalid request")
)

// Store is the shared budget state of every dispatcher replica: the union of
// the roles Reservations, RouteFlags and RouteLeases, and RouteSnapshot, which
// reads the routes' flags and leases together. Implementations must be safe
// for concurrent use and pass the conformance suite in budgets/storetest; a
// consumer that needs one role asks for that role only.
type Store interface {
	Reservations
	RouteFlags
	RouteLeases

	// RouteSnapshot reports, at one instant, what RouteStates and InFlight
	// report: each named route's state and its live leases. A dispatcher's
	// route refresh reads both every tick, in one round trip.
	RouteSnapshot(ctx context.Context, routes []string) (map[string]RouteState, map[string]int, error)
}

// Reservations is the accounting of a user action's attempts and spend: the
// attempt ledgers, the duplicate-rate windows and pool reserves, and the spend
// ceilings. It decides on each attempt and ends the reservation it granted.
type Reservations interface {
	// Admit decides on a user action's primary attempt: it takes an attempt
	// slot from the user action's ledger, reserves the attempt's estimated
	// spend against the user action's and the tenant's ceilings, and counts
	// the primary in its cohort's duplicate-rate window. On denial nothing is
	// kept or counted; the reason is the first refusal in the order
	// attempts, spend_user_action, spend_tenant. A store that decides entity
	// by entity may let concurrent decisions glimpse a part that is then
	// given back, as for ReserveExtra: a hedge decided in between may count
	// a primary that is then uncounted.
	Admit(ctx context.Context, req AdmitRequest) (Admission, error)

	// ReserveExtra decides on a hedge, a replacement or a continuation: the
	// target route must be neither in pushback, quarantined nor ejected; then
	// it takes an attempt slot, counts the attempt in its cohort's
	// duplicate-rate window — a hedge only if it fits under the ceiling or,
	// failing that, the pool's reserve pays; a replacement or a continuation
	// always — and reserves spend. On denial nothing is kept; the reason is
	// the first refusal in the order route_quarantined, route_pushback,
	// route_ejected, attempts, duplicate_rate, spend_user_action,
	// spend_tenant. A store that decides entity by entity
	// (the Redis store, whose entities may sit on different servers) may
	// let a concurrent decision glimpse a grant that is then compensated (a
	// spurious denial there), never one that stays.
	ReserveExtra(ctx context.Context, req ExtraRequest) (Grant, error)

	// Settle ends a live reservation with the attempt's actual usage: the
	// reserved units are replaced by the used ones, so an unused remainder
	// returns to the ceilings and over-use is charged. It returns
	// ErrUnknownReservation, changing nothing, if the reservation is unknown,
	// already ended or expired.
	Settle(ctx context.Context, id ReservationID, usage schemas.Usage) error

	// Release ends a live reservation whose grant never launched an attempt
	// (e.g. a hedge budget granted after a winner arrived): the spend, the
	// attempt slot, the window's count and any reserve token are all given
	// back (a count whose slot has left the window is gone already). An attempt
	// that launched is Settled instead, even with zero usage. It returns
	// ErrUnknownReservation, changing nothing, if the reservation is unknown,
	// already ended or expired.
	Release(ctx context.Context, id ReservationID) error

	// EndAll ends many live reservations at once, each as Settle (Release
	// false) or Release would, and returns one error per ending, in order:
	// nil, or what that call alone would have returned. A reservation named
	// twice ends once; the second ending is ErrUnknownReservation. It lets a
	// caller nobody waits for (the dispatcher settling finished attempts)
	// pay one round trip for many reservations.
	EndAll(ctx context.Context, ends []Ending) []error
}

// RouteFlags holds the pushback, quarantine and ejection flags of routes,
// shared by every replica so that one replica's pushback (or ejection)
// spares the route for all.
type RouteFlags interface {
	// MarkRoute flags a route as in pushback, quarantined or ejected for
	// ttl, for every replica. A flag that is already set keeps the later of
	// its two expiries; the three flags expire independently.
	MarkRoute(ctx context.Context, route string, state RouteState, ttl time.Duration) error

	// RouteStates reports the current state of each named route; a route
	// without a live flag is RouteHealthy; quarantine outranks pushback, which outranks
	// ejection.
	RouteStates(ctx context.Context, routes []string) (map[string]RouteState, error)
}

// RouteLeases holds the in-flight leases of routes: each attempt in flight
// holds one, renewed by its worker, so every replica sees a route's load
// across the cluster and a dead holder's leases expire.
type RouteLeases interface {
	// AcquireLease records that holder has an attempt in flight on route until
	// ttl from now; acquiring again with the same holder renews the lease, so a
	// live holder renews and a dead one's lease expires.
	AcquireLease(ctx context.Context, route, holder string, ttl time.Duration) error

	// ReleaseLease ends holder's lease on route. Releasing a lease that is
	// absent or expired is not an error: the attempt is not in flight either way.
	ReleaseLease(ctx context.Context, route, holder string) error

	// InFlight counts the live leases of each named route.
	InFlight(ctx context.Context, routes []string) (map[string]int, error)
}

// Ending is one reservation's end in EndAll: settled with Usage, or, when
// Release is set, released.
type Ending struct {
	Reservation ReservationID
	Usage       schemas.Usage
	Release     bool
	// Lost, with Release false, says the attempt was lost with its worker
	// (schemas.StatusLost: its heartbeats or stream stopped): its usage is
	// settled, and its ledger slot is given back (forgiven) within the
	// user action's forgiveness bound (AttemptPolicy), so a death does not
	// spend the retry's attempts (docs/architecture.md §7).
	Lost bool
}

// ReservationID names one live reservation. It is opaque: an implementation may
// encode in it the entities the reservation spans (the Redis store does, so a
// settle needs no lookup round trip).
type ReservationID string

// Reason says why a decision was denied. Its values are stable: they label the
// hedges_suppressed_total metric and the suppression records.
type Reason string

const (
	// ReasonNone is the reason of an allowed decision.
	ReasonNone Reason = ""
	// ReasonAttempts: the user action's attempt ledger is full.
	ReasonAttempts Reason = "attempts"
	// ReasonSpendUserAction: the reservation would exceed the user action's spend ceiling.
	ReasonSpendUserAction Reason = "spend_user_action"
	// ReasonSpendTenant: the reservation would exceed the tenant's ceiling for the current window.
	ReasonSpendTenant Reason = "spend_tenant"
	// ReasonDuplicateRate: a hedge fits under neither its cohort's window ceiling nor the pool's reserve.
	ReasonDuplicateRate Reason = "duplicate_rate"
	// ReasonRoutePushback: the target route asked for less load (429/529) and its pushback has not expired.
	ReasonRoutePushback Reason = "route_pushback"
	// ReasonRouteQuarantined: the target route failed with a route-local permanent error and is quarantined.
	ReasonRouteQuarantined Reason = "route_quarantined"
	// ReasonRouteEjected: the target route failed too often (outlier
	// ejection) and its ejection has not expired.
	ReasonRouteEjected Reason = "route_ejected"
)

// IsSpend reports whether the reason is one of the spend ceilings.
func (r Reason) IsSpend() bool { return r == ReasonSpendUserAction || r == ReasonSpendTenant }

// RouteState is the shared condition of a route.
type RouteState string

const (
	// RouteHealthy: no live flag; the route may take primaries and hedges.
	RouteHealthy RouteState = "healthy"
	// RoutePushback: the provider asked for less load (Retry-After, overloaded);
	// no hedge or replacement is sent towards it until the flag expires.
	RoutePushback RouteState = "pushback"
	// RouteQuarantined: a route-local permanent failure (auth, missing model,
	// bad route config); the route takes no attempts until the flag expires.
	RouteQuarantined RouteState = "quarantined"
	// RouteEjected: the route failed too often (consecutive transient
	// failures or a failure rate over a window, outlier ejection); it takes
	// no attempts until the flag expires, then is probed back in.
	RouteEjected RouteState = "ejected"
)

// TokenSource says what allowed a hedge under the duplicate-rate ceiling.
type TokenSource string

const (
	// TokenNone: nothing was drawn (a replacement or a continuation, which
	// the ceiling never refuses, or a denial).
	TokenNone TokenSource = ""
	// TokenCohort: the hedge fit under its cohort's window ceiling.
	TokenCohort TokenSource = "cohort"
	// TokenReserve: the cohort's window had no room and the pool's reserve paid.
	TokenReserve TokenSource = "reserve"
)

// AttemptPolicy bounds the attempts of one user action, across its hedge
// groups and the caller's retries.
//
// Slots taken for an attempt lost with its worker (Ending.Lost) or by a
// group whose gateway died (AdmitRequest.Forgive) are given back —
// forgiven —, at most Max in the ledger's lifetime: a death does not
// spend its retry's attempts, and however many deaths there are, a user
// action takes at most 2 × Max slots per ledger lifetime
// (docs/architecture.md §7).
type AttemptPolicy struct {
	// Max is the number of attempt slots in the user action's ledger (≥ 1).
	Max int
	// TTL is how long the ledger outlives its last grant; it should cover the
	// user action's deadline plus the caller's retry horizon. The user action
	// also lives as long as any of its reservations. Once it expires the user
	// action starts again with an empty ledger and no spend.
	TTL time.Duration
}

// SpendPolicy is what one attempt is estimated to cost and the ceilings it
// counts against. Units are provider usage units: input plus output tokens.
type SpendPolicy struct {
	// InputUnits is the request's input size.
	InputUnits int64
	// OutputUnits is the output estimate: max_tokens, or the cohort's P95
	// output when the request sets no max_tokens.
	OutputUnits int64
	// UserActionCeiling caps the units of all attempts of the user action; 0
	// means no ceiling.
	UserActionCeiling int64
	// TenantCeiling caps the tenant's units per TenantWindow; 0 means no
	// ceiling (and the tenant's spend is not tracked).
	TenantCeiling int64
	// TenantWindow is the length of the tenant's fixed spend windows, aligned
	// to the Unix epoch at millisecond resolution. A reservation counts in the
	// window it was made in, and so does its settlement.
	TenantWindow time.Duration
	// ReservationTTL bounds how long the reservation lives if its holder never
	// settles or releases it (the holder died); the reserved units then return
	// to the ceilings. Cover the deadline plus the cancellation lag.
	ReservationTTL time.Duration
}

// Units is the number of units the policy reserves.
func (p SpendPolicy) Units() int64 { return p.InputUnits + p.OutputUnits }

// DuplicateCeiling configures a cohort's duplicate-rate ceiling: a rate over
// a sliding window, not a bucket (docs/architecture.md §7). The store counts,
// per cohort, the primaries admitted and the extra attempts (hedges and
// replacements) granted in Slots consecutive slots of Window/Slots each,
// aligned to the Unix epoch; the window of a decision is the slot holding now
// and the Slots-1 before it. A hedge is allowed by the cohort when
//
//	extras + 1 + ReplacementReserve ≤ Ceiling × primaries
//
// over that window, so a burst of stalls can be hedged at once while, at
// every hedge, the hedges and replacements of the window stay within the
// ceiling. With BurstSlots set, a hedge must also fit a second, shorter
// bound over the last BurstSlots slots of the same counters:
//
//	burst extras + 1 ≤ BurstCeiling × burst primaries
//
// so a long window can hold the average while the burst bound caps what an
// incident adds within seconds (docs/architecture.md §7, "two windows").
// When the cohort refuses, the pool's reserve may pay (ReserveBucket). A
// replacement or a continuation is never refused by the ceiling: the attempt
// it replaces or continues has ended, so it adds no concurrent load, and the
// user action's attempt ledger bounds how many there are; it is counted, so
// it leaves less room to hedges (ExtraRequest.FollowsAnEndedAttempt).
type DuplicateCeiling struct {
	// Ceiling is the largest share of extra attempts per primary over the
	// window, in [0, 1].
	Ceiling float64
	// Window is the span the rate is taken over, kept as Slots counters of
	// Window/Slots each (at least 1ms). A window of another slot length is
	// another window: changing it starts the cohort's counts afresh.
	Window time.Duration
	Slots  int
	// ReplacementReserve is the room, in extra attempts, a hedge must leave
	// under the window's ceiling for replacements, which serve the primary
	// path: a burst of hedges does not use the allowance a failure's retry
	// is counted against.
	ReplacementReserve float64
	// BurstSlots is how many of the window's most recent slots (now's
	// included) the burst bound is taken over, in [0, Slots]; 0 means no
	// burst bound.
	BurstSlots int
	// BurstCeiling is the largest share of extra attempts per primary over
	// the burst slots, in [0, 1]; usually a multiple of Ceiling, the room
	// a short stretch may take above the window's average.
	BurstCeiling float64
}

// MaxWindowSlots bounds DuplicateCeiling.Slots, so a decision reads a
// bounded number of counters.
const MaxWindowSlots = 100

// SlotLength is the span of one of the window's slots, in whole
// milliseconds (both stores align slots in milliseconds).
func (c DuplicateCeiling) SlotLength() time.Duration {
	if c.Slots < 1 {
		return 0
	}
	return (c.Window / time.Duration(c.Slots)).Truncate(time.Millisecond)
}

// WindowSlot returns the index of the slot of length slot that contains
// now: slots are aligned to the Unix epoch, so every replica counts in the
// same slots.
func WindowSlot(now time.Time, slot time.Duration) int64 {
	ms, w := now.UnixMilli(), slot.Milliseconds()
	i := ms / w
	if ms < 0 && ms%w != 0 {
		i--
	}
	return i
}

// AllowsHedge reports whether a window holding primaries and extras (every
// hedge and replacement counted so far) has room for one more hedge under
// the ceiling, the reserve left. It computes in microtokens, as the Redis
// store's script does, so both decide alike to the last token.
func (c DuplicateCeiling) AllowsHedge(primaries, extras int64) bool {
	return (extras+1)*oneToken+Microtokens(c.ReplacementReserve) <= Microtokens(c.Ceiling)*primaries
}

// AllowsBurst reports whether the burst slots, holding primaries and
// extras, have room for one more hedge under BurstCeiling; always, without
// a burst bound. A hedge the cohort pays for needs AllowsHedge over the
// window and AllowsBurst over its last BurstSlots slots.
func (c DuplicateCeiling) AllowsBurst(primaries, extras int64) bool {
	return c.BurstSlots == 0 || (extras+1)*oneToken <= Microtokens(c.BurstCeiling)*primaries
}

// oneToken is one extra attempt in microtokens.
const oneToken = 1_000_000

// ReserveBucket configures a pool's reserve: a token bucket, full when created,
// that refills continuously, so a low-traffic or cold cohort, whose window
// holds too few primaries for a hedge, can still hedge now and then. A hedge
// the reserve pays is counted in its cohort's window like any other. A zero
// Capacity disables the reserve.
type ReserveBucket struct {
	Capacity        float64
	RefillPerSecond float64
}

// BucketIdleTTL is how long a pool reserve is kept without being used; after
// that it starts again full.
const BucketIdleTTL = 24 * time.Hour

// maxTokens bounds reserve capacities and the replacement reserve so that
// their fixed-point form (millionths of a token, see Microtokens) stays
// exact in int64 and in a Lua double.
const maxTokens = 1e9

// AdmitRequest asks for a user action's primary attempt.
type AdmitRequest struct {
	// UserAction identifies the user action; its ledger and spend are shared
	// by all its hedge groups and the caller's retries.
	UserAction string
	// Tenant identifies the tenant whose window ceiling applies; required when
	// Spend.TenantCeiling is set.
	Tenant string
	// Pool is the pool of equivalent routes the cohort belongs to; the
	// cohort's window lives with the pool's reserve.
	Pool string
	// Window names the duplicate-rate window the primary is counted in:
	// the dispatcher keeps one per class and pool (policy.DuplicateWindow),
	// where the duplicate load lands (docs/architecture.md §7).
	Window string
	// Group names the hedge group the attempt belongs to; the ledger
	// counts the slots each group holds, so a takeover can forgive them.
	// Empty: the slot is counted for the user action only.
	Group string
	// Forgive names a group of the same user action that died — its
	// gateway's in-flight lease lapsed, and this admission is the door's
	// takeover of it (Submission.Supersedes, docs/architecture.md §2) —:
	// the slots it still holds are given back before the decision, within
	// the forgiveness bound, and it holds none after, so each dead group is
	// forgiven once. Kept even when the admission is then denied.
	Forgive string
	// Local says no other gateway can know the user action — the caller
	// sent no Idempotency-Key, so it is this group alone —: a gateway's
	// store among several (Sliced) decides it in the gateway's memory and
	// slices, with no round trip to the region's store.
	Local      bool
	Attempts   AttemptPolicy
	Spend      SpendPolicy
	Duplicates DuplicateCeiling
}

// Validate reports the first problem that makes the request unusable, wrapped
// in ErrInvalidRequest.
func (r AdmitRequest) Validate() error {
	if err := r.validate(); err != nil {
		return fmt.Errorf("%w (admit request)", err)
	}
	return nil
}

func (r AdmitRequest) validate() error {
	if r.UserAction == "" {
		return invalid("user action is empty")
	}
	if r.Pool == "" || r.Window == "" {
		return invalid("pool and window are required")
	}
	if err := r.Attempts.validate(); err != nil {
		return err
	}
	if err := r.Spend.validate(r.Tenant); err != nil {
		return err
	}
	return r.Duplicates.validate()
}

// ExtraRequest asks for a hedge, a replacement or a continuation attempt of
// a user action.
type ExtraRequest struct {
	// Role is schemas.RoleHedge, schemas.RoleReplacement or
	// schemas.RoleContinuation. All three are counted in the cohort's
	// duplicate-rate window and take a slot of the user action's ledger;
	// only a hedge can be refused by the ceiling (DuplicateCeiling,
	// FollowsAnEndedAttempt). A continuation is counted as a replacement
	// is: it too follows an attempt that ended (a committed stream that
	// broke), and its caller sends the ledger's Max it may take
	// (max_attempts plus the pool's rescues, docs/architecture.md §7).
	Role       schemas.Role
	UserAction string
	// Group names the hedge group the attempt belongs to (AdmitRequest.Group).
	Group  string
	Tenant string
	// Route is the route the attempt would be sent to.
	Route  string
	Pool   string
	Window string
	// Local is AdmitRequest.Local.
	Local    bool
	Attempts AttemptPolicy
	Spend    SpendPolicy
	// Duplicates is the cohort's ceiling a hedge must fit under; Floor pays
	// for a hedge the cohort refuses.
	Duplicates DuplicateCeiling
	Reserve    ReserveBucket
}

// Validate reports the first problem that makes the request unusable, wrapped
// in ErrInvalidRequest.
func (r ExtraRequest) Validate() error {
	if err := r.validate(); err != nil {
		return fmt.Errorf("%w (extra request)", err)
	}
	return nil
}

func (r ExtraRequest) validate() error {
	if r.Role != schemas.RoleHedge && !r.FollowsAnEndedAttempt() {
		return invalid(fmt.Sprintf("role %q is not hedge, replacement or continuation", r.Role))
	}
	if r.UserAction == "" {
		return invalid("user action is empty")
	}
	if r.Route == "" {
		return invalid("route is empty")
	}
	if err := r.Attempts.validate(); err != nil {
		return err
	}
	if err := r.Spend.validate(r.Tenant); err != nil {
		return err
	}
	if r.Pool == "" || r.Window == "" {
		return invalid("an extra attempt needs its pool and cohort")
	}
	if err := r.Duplicates.validate(); err != nil {
		return err
	}
	return r.Reserve.validate()
}

// FollowsAnEndedAttempt reports whether the request's attempt follows one
// that has ended — a replacement (after a transient failure) or a
// continuation (after a committed stream broke) — rather than running
// beside one, as a hedge does. The duplicate-rate ceiling never refuses such
// an attempt and it draws no token (TokenNone): it adds no concurrent load,
// and the attempt ledger bounds how many there are. It is still counted in
// the window, so it leaves less room to hedges.
func (r ExtraRequest) FollowsAnEndedAttempt() bool {
	return r.Role == schemas.RoleReplacement || r.Role == schemas.RoleContinuation
}

// Admission is the decision on a primary attempt.
type Admission struct {
	Allowed bool
	// Reason says why the primary was denied; ReasonNone when allowed.
	Reason Reason
	// Reservation must be settled or released exactly once when allowed.
	Reservation ReservationID
	// AttemptsUsed is the number of ledger slots taken, this one included.
	AttemptsUsed int
	// ReservedUnits is the spend held by the reservation.
	ReservedUnits int64
	// RetryAfter, on a ReasonAttempts denial, is when the ledger lapses and
	// a retry is admitted afresh — set only when the user action may have
	// met a death: the ledger forgave slots in its lifetime, or holds a
	// live reservation (an attempt may still run, or died holding it). Zero
	// otherwise: every attempt ended and was counted, so the same request
	// should not be retried (docs/architecture.md §7).
	RetryAfter time.Duration
}

// Grant is the decision on a hedge, replacement or continuation attempt.
type Grant struct {
	Allowed bool
	// Reason says why the attempt was denied; ReasonNone when allowed.
	Reason Reason
	// Reservation must be settled or released exactly once when allowed.
	Reservation ReservationID
	// AttemptsUsed is the number of ledger slots taken, this one included.
	AttemptsUsed int
	// ReservedUnits is the spend held by the reservation.
	ReservedUnits int64
	// Token says what allowed a hedge; TokenNone for a replacement or a
	// continuation.
	Token TokenSource
}

// ValidateRouteMark reports whether MarkRoute may set state for ttl.
func ValidateRouteMark(route string, state RouteState, ttl time.Duration) error {
	if route == "" {
		return invalid("mark route: route is empty")
	}
	if state != RoutePushback && state != RouteQuarantined && state != RouteEjected {
		return invalid(fmt.Sprintf("mark route %q: state %q is not pushback, quarantined or ejected", route, state))
	}
	if ttl <= 0 {
		return invalid(fmt.Sprintf("mark route %q: ttl %v is not positive", route, ttl))
	}
	return nil
}

// ValidateLease reports whether AcquireLease may lease route to holder for ttl.
func ValidateLease(route, holder string, ttl time.Duration) error {
	if route == "" || holder == "" {
		return invalid("lease: route and holder are required")
	}
	if ttl <= 0 {
		return invalid(fmt.Sprintf("lease of %q: ttl %v is not positive", route, ttl))
	}
	return nil
}

// ValidateUsage reports whether usage can settle a reservation.
func ValidateUsage(usage schemas.Usage) error {
	if usage.InputUnits < 0 || usage.OutputUnits < 0 {
		return invalid(fmt.Sprintf("settle: negative usage %+v", usage))
	}
	if usage.InputUnits > MaxUnits || usage.OutputUnits > MaxUnits {
		return invalid(fmt.Sprintf("settle: usage %+v is over %d units", usage, int64(MaxUnits)))
	}
	return nil
}

// MaxUnits bounds every figure of units a store takes (estimates, ceilings,
// usage). Stores add them up: the Redis store in Lua, whose numbers are
// doubles exact only below 2^53, the memory store in int64. Under this bound
// the sums of any realistic number of reservations stay exact and never
// overflow, so a store never mistakes a huge figure (a max_tokens of
// 2^63-1) for room under a ceiling; over it is ErrInvalidRequest, never
// an unavailable store.
const MaxUnits = 1 << 50

func (p AttemptPolicy) validate() error {
	if p.Max < 1 {
		return invalid(fmt.Sprintf("attempts: max %d is below 1", p.Max))
	}
	if p.TTL <= 0 {
		return invalid(fmt.Sprintf("attempts: ledger ttl %v is not positive", p.TTL))
	}
	return nil
}

func (p SpendPolicy) validate(tenant string) error {
	switch {
	case p.InputUnits < 0 || p.OutputUnits < 0:
		return invalid(fmt.Sprintf("spend: negative estimate (input %d, output %d)", p.InputUnits, p.OutputUnits))
	case p.InputUnits > MaxUnits || p.OutputUnits > MaxUnits:
		return invalid(fmt.Sprintf("spend: estimate (input %d, output %d) is over %d units", p.InputUnits, p.OutputUnits, int64(MaxUnits)))
	case p.UserActionCeiling < 0 || p.TenantCeiling < 0:
		return invalid("spend: negative ceiling")
	case p.UserActionCeiling > MaxUnits || p.TenantCeiling > MaxUnits:
		return invalid(fmt.Sprintf("spend: ceiling is over %d units", int64(MaxUnits)))
	case p.ReservationTTL <= 0:
		return invalid(fmt.Sprintf("spend: reservation ttl %v is not positive", p.ReservationTTL))
	case p.TenantCeiling > 0 && tenant == "":
		return invalid("spend: a tenant ceiling needs a tenant")
	case p.TenantCeiling > 0 && p.TenantWindow < time.Millisecond:
		return invalid(fmt.Sprintf("spend: tenant window %v is below 1ms", p.TenantWindow))
	}
	return nil
}

func (c DuplicateCeiling) validate() error {
	switch {
	case !(c.Ceiling >= 0 && c.Ceiling <= 1):
		return invalid(fmt.Sprintf("duplicate ceiling: %v is outside [0, 1]", c.Ceiling))
	case c.Slots < 1 || c.Slots > MaxWindowSlots:
		return invalid(fmt.Sprintf("duplicate ceiling: %d slots is outside [1, %d]", c.Slots, MaxWindowSlots))
	case c.SlotLength() < time.Millisecond:
		return invalid(fmt.Sprintf("duplicate ceiling: window %v makes %d slots shorter than 1ms", c.Window, c.Slots))
	case !(c.ReplacementReserve >= 0 && c.ReplacementReserve <= maxTokens):
		return invalid(fmt.Sprintf("duplicate ceiling: replacement reserve %v is outside [0, %g]", c.ReplacementReserve, float64(maxTokens)))
	case c.BurstSlots < 0 || c.BurstSlots > c.Slots:
		return invalid(fmt.Sprintf("duplicate ceiling: %d burst slots is outside [0, %d]", c.BurstSlots, c.Slots))
	case !(c.BurstCeiling >= 0 && c.BurstCeiling <= 1):
		return invalid(fmt.Sprintf("duplicate ceiling: burst ceiling %v is outside [0, 1]", c.BurstCeiling))
	}
	return nil
}

func (f ReserveBucket) validate() error {
	switch {
	case !(f.Capacity >= 0 && f.Capacity <= maxTokens):
		return invalid(fmt.Sprintf("reserve bucket: capacity %v is outside [0, %g]", f.Capacity, float64(maxTokens)))
	case !(f.RefillPerSecond >= 0 && f.RefillPerSecond <= maxTokens):
		return invalid(fmt.Sprintf("reserve bucket: refill %v/s is outside [0, %g]", f.RefillPerSecond, float64(maxTokens)))
	}
	return nil
}

func invalid(msg string) error { return fmt.Errorf("%w: %s", ErrInvalidRequest, msg) }

// Microtokens converts a quantity of extra attempts (a ceiling, a reserve, a
// reserve level) to millionths of one. Stores decide in integers so that
// many small shares (a ceiling of 0.05 twenty times) add up to exactly one
// attempt in every implementation.
func Microtokens(tokens float64) int64 { return int64(tokens*1e6 + 0.5) }

// TenantWindowStart returns the start, in Unix milliseconds, of the fixed
// tenant window of length window that contains now.
func TenantWindowStart(now time.Time, window time.Duration) int64 {
	ms, w := now.UnixMilli(), window.Milliseconds()
	start := ms / w * w
	if ms < 0 && ms%w != 0 {
		start -= w
	}
	return start
}
