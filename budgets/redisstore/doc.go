// Package redisstore is the budgets.Store of many dispatcher replicas,
// kept in Redis — a standalone server or a Redis Cluster (docs/architecture.md §7). It
// passes the conformance suite of budgets/storetest against both.
//
// # Key layout
//
// Every key starts with the store's prefix (default "hr") and holds one
// hash tag per entity, so that the keys one script touches share a slot.
// Ids are not written as such: each is replaced by the first 128 bits of
// its SHA-256, base64url-encoded (22 characters), so a user-supplied id
// with a brace cannot move its key's hash tag, and no user or tenant id
// sits in Redis or in a reservation id in clear.
//
//	<prefix>:{ua:<h>}                       ledger and spend of a user action (HASH a attempts, s settled, r reserved, e expiry, g:<group h> slots a group holds, f slots forgiven, m max)
//	<prefix>:{ua:<h>}:res, …:exp            its live reservations: units (HASH nonce → units), expiries (ZSET nonce → ms)
//	<prefix>:{tenant:<h>}:w:<len>:<start>   a tenant's spend in one window (same three keys, no attempts)
//	<prefix>:{pool:<h>}:w:<cohort h>:<ms>   a cohort's duplicate-rate window of slots of <ms> (HASH p:<slot> primaries, x:<slot> extra attempts)
//	<prefix>:{pool:<h>}:reserve             the pool's reserve (HASH l, c, rate, t last refill, u last use)
//	<prefix>:{pool:<h>}:tokens              counts held by live reservations (ZSET "nonce:source" → expiry)
//	<prefix>:{route:<h>}:flags              route flags (HASH q quarantined-until, p pushback-until; ms)
//	<prefix>:{route:<h>}:leases             in-flight leases (ZSET holder → expiry)
//
// # Time and expiry
//
// The store reads its own clock (Options.Now) and hands it, in Unix
// milliseconds, to every script, which judges every expiry against it: a
// ledger past its TTL starts afresh, a reservation past its ReservationTTL
// returns its units (the scripts purge the expiry ZSET of each account
// they touch), flags and leases count only while their expiry is ahead.
// Redis TTLs only collect garbage: each key is given a PEXPIRE a grace
// period (five minutes) past the death of the state it holds. So a store
// on a test clock is deterministic, and replicas need clocks that agree
// to within a few milliseconds, not a Redis clock.
//
// # Scripts and round trips
//
// All state changes are Lua scripts (redis.NewScript), one per entity and
// step, each atomic on its own slot. A round trip is one pipelined batch;
// on a cluster go-redis splits it by master and sends the parts at once.
// Scripts go as EVALSHA; a server that lacks one (its first use, a
// restart) refuses it without running it and only those calls are sent
// again as EVAL, a second batch that LoadScripts avoids up front.
//
//   - Admit: one batch — the user action's take (ledger slot and spend),
//     the tenant window's take (with a tenant ceiling) and the primary's
//     count in its cohort's window.
//   - ReserveExtra: one batch — the route's flags (HMGET), the user
//     action's take, the pool's count (one script on the pool's slot:
//     the cohort's window decides a hedge, else the reserve pays; a
//     replacement or a continuation is always counted) and the tenant
//     window's take.
//   - Settle and Release: one batch — each entity the reservation spans
//     ends its own share. The ReservationID carries those entities (hashed)
//     and a random nonce naming the reservation's record in each of them,
//     plus a digest that makes a damaged id unknown as a whole.
//   - MarkRoute, AcquireLease, ReleaseLease: one command; RouteStates,
//     InFlight and RouteSnapshot (both at once, for a dispatcher's route
//     refresh): one batch for any number of routes.
//
// # Compensation
//
// The entities of a decision sit in different slots, so a decision is
// reserve-then-compensate: every entity's script grants or refuses on its
// own, all in the one batch, and when any refuses (or a route flag is up)
// a second batch gives back what the others granted — the slot and spend
// through the same end script Release uses, the count likewise, a
// primary's count by uncounting it. The reason is the first refusal
// in the order of the budgets.Store docs. Between the two batches another
// replica may glimpse a grant that is about to be given back: it is then
// denied spuriously, or, for a primary's count, a hedge may be allowed by
// a primary that is then uncounted: one hedge more than the window's
// primaries allow, until its slot leaves the window.
//
// # Failures and what is best-effort
//
// Every call is bounded by Options.Timeout (the caller's earlier deadline
// wins); the client must enforce context deadlines (ContextTimeoutEnabled),
// which New checks. A Redis that cannot be reached or answers too late
// makes the call fail with an error wrapping ErrUnavailable — never a
// denial — and the caller suppresses hedges and lets primaries go on. A
// context the caller ended is reported as its error instead. Error replies
// of Redis wrap ErrUnavailable too (a store error, not the caller's).
//
// So that an outage does not cost every primary the whole timeout, a round
// trip that got no answer opens a breaker: until Redis answers again, the
// store sends one call per Options.ProbeInterval (default 250ms) and fails
// the others at once, in microseconds. An error reply is an answer and
// leaves the breaker closed. One slow answer thus suppresses this replica's
// hedges for an interval: the optional duplicate fails closed.
//
// Exactness has limits where Redis failed part-way:
//   - A batch that failed after some scripts ran: the granted parts Redis
//     answered for are given back if the call has time left; the others
//     hold their spend until the reservation expires, and a slot, count or token
//     taken that way stays taken (a spurious refusal later, never an
//     excess).
//   - A call that timed out may still run on the server afterwards (a
//     stalled server runs its queue when it resumes); its reservation,
//     never returned to the caller, expires after its ReservationTTL.
//   - go-redis may resend a batch after a connection error; takes are
//     idempotent on their nonce, ends on their record, but a primary's
//     count may land twice (a share of a hedge more, for one window).
//   - Settle and Release end each entity's share at most once, and the user
//     action's share decides the answer. If an earlier attempt ended only
//     some shares (a partial failure), a retry ends the rest but reports
//     ErrUnknownReservation; two conflicting ends of one reservation racing
//     each other may mix (one settles the user action, the other releases
//     the tenant's share).
//   - A Redis that lost its memory (a restart without persistence) forgets
//     every ledger, window, reservation, flag and lease: budgets start
//     afresh and earlier reservations are unknown.
package redisstore
