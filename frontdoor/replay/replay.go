// Package replay keeps the committed answers of user actions so a retry
// with the same Idempotency-Key gets the answer back instead of a new
// provider call (docs/architecture.md §2, §6, Stripe's model).
//
// A Store maps a key — a hash of the tenant and the caller's key, never the
// key itself — to an Answer: the exact bytes a door wrote, its status, the
// headers that matter, and a fingerprint of the request that produced it, so
// a key reused with another request is told apart. Entries expire after a
// TTL and are bounded in size, per entry and in total (max_total_bytes:
// Memory evicts its oldest answers, a shared store refuses new ones with
// ErrStoreFull). Memory is the store of one replica; replaytest is the
// conformance suite every store passes.
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

// Default size bounds of a store: the same for Memory (one gateway's) and
// a store the gateways share (all of theirs together).
const (
	DefaultMaxEntryBytes = 4 << 20
	DefaultMaxTotalBytes = 256 << 20
)

// ErrTooLarge is returned by Put for an answer above the store's per-entry
// bound (or its total): it is not kept. Lead.End then keeps a tombstone
// (NotKeptAnswer) in its place, so a retry is refused answer_not_kept at
// once instead of running a second provider call (docs/architecture.md §2).
var ErrTooLarge = errors.New("replay: answer larger than the store keeps")

// ErrStoreFull is returned by Put when keeping the answer would pass the
// store's total bound (max_total_bytes) and the store does not evict to
// make room (a shared store: Redis runs noeviction, docs/architecture.md
// §2). The answer is not kept; Lead.End keeps its tombstone instead when
// that still fits, as for ErrTooLarge. The store takes answers again as
// the ones it holds expire.
var ErrStoreFull = errors.New("replay: the store's total bound is reached")

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
	// NotKept marks a tombstone: the request's answer was committed and
	// delivered whole, but it was over the bounds of the door's recorder
	// or the store, so only the fingerprint is kept (no status, headers or
	// body). A retry of the same request is refused answer_not_kept at
	// once, with no provider call (docs/architecture.md §2).
	NotKept bool
}

// NotKeptAnswer is the tombstone of the request with fingerprint fp whose
// delivered answer is too large to keep.
func NotKeptAnswer(fp string) *Answer { return &Answer{Fingerprint: fp, NotKept: true} }

// size is what an answer counts against the bounds.
func (a *Answer) size() int {
	n := len(a.Fingerprint) + len(a.Body)
	for k, v := range a.Header {
		n += len(k) + len(v)
	}
	return n
}

// Store keeps committed answers by key for a TTL, and the in-flight
// markers (leases) of the keys being served now, which every replica
// sharing the store sees (docs/architecture.md §2).
type Store interface {
	// Get returns the live answer stored under key, or nil.
	Get(ctx context.Context, key string) (*Answer, error)
	// Put stores a copy of a under key for ttl, replacing any earlier
	// answer, and ends the key's lease whoever holds it: the answer
	// replaces the marker. ErrTooLarge when a is over the bounds (the
	// lease is then left as it was).
	Put(ctx context.Context, key string, a *Answer, ttl time.Duration) error
	// Claim takes the lease of key for m, create-if-absent, for lease:
	// won when no marker is there or the one there lapsed (its holder did
	// not refresh it in time; Claimed.Orphaned is that marker); else the
	// live marker is returned and nothing changes.
	Claim(ctx context.Context, key string, m Marker, lease time.Duration) (Claimed, error)
	// Refresh extends the lease of key by lease from now if m's token
	// still holds it (even lapsed, when nobody took it over); false when
	// another lease or an answer replaced it.
	Refresh(ctx context.Context, key string, m Marker, lease time.Duration) (bool, error)
	// Release drops the lease of key if m's token holds it: the request
	// ended with no answer kept, and the next request of the key runs
	// afresh (not a takeover).
	Release(ctx context.Context, key string, m Marker) error
	// Lapse ends the lease of key now if m's token holds it, leaving m as
	// the orphan marker: the request committed an answer its caller never
	// got whole, and the next request of the key takes it over at once,
	// as it would after its gateway's death. A takeover that ended without
	// an answer lapses with the owner it took over, handing that orphan on
	// (Lead.End).
	Lapse(ctx context.Context, key string, m Marker) error
}

// Marker is the in-flight marker of a key: which request is being served
// and by whom.
type Marker struct {
	// Fingerprint is the request's (Fingerprint): a twin with another
	// request is refused while the marker is live.
	Fingerprint string
	// Owner names the group serving the request, so a takeover can tell
	// its commit from another's.
	Owner string
	// Token is this lease's own id, unique per claim.
	Token string
}

// Claimed is the outcome of Store.Claim.
type Claimed struct {
	// Won reports that the caller holds the lease now.
	Won bool
	// Holder is the live marker of another lease when not Won.
	Holder *Marker
	// Orphaned is the lapsed marker a won claim replaced: its holder
	// stopped refreshing before it stored an answer or released it.
	Orphaned *Marker
}

// DefaultLease is the lease of an in-flight marker: its holder refreshes
// it every third of it, and a marker left unrefreshed for a whole lease
// counts as orphaned (docs/architecture.md §2).
const DefaultLease = 5 * time.Second

// DefaultMarkerKeep is how long a marker is remembered after its last
// claim or refresh, so a retry still learns the request was orphaned while
// a winner gate holding it left may stand (a gateway sets it to its gate's
// TTL).
const DefaultMarkerKeep = time.Hour

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
