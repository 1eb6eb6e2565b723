package redisstore

import (
	"crypto/sha256"
	"encoding/base64"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/hedgerow/hedgerow/budgets"
)

// entityHash names an entity (user action, tenant, pool, cohort, route) in
// keys and reservation ids: the first 128 bits of the SHA-256 of its id,
// base64url-encoded. A user-supplied id then can neither break out of its
// hash tag (a "}" in it is hashed away) nor appear in Redis or in an id
// that ends up in a log.
func entityHash(id string) string {
	sum := sha256.Sum256([]byte(id))
	return base64.RawURLEncoding.EncodeToString(sum[:16])
}

// keys builds every key of one store under its prefix. Each entity has one
// hash tag, so the keys a script touches always share a slot.
type keys struct{ prefix string }

// accountKeys returns the three keys of a spend account: the account hash
// (fields a attempts, s settled, r reserved, e expiry), the units of its
// live reservations (HASH nonce → units) and their expiries (ZSET nonce →
// Unix ms).
func (k keys) accountKeys(base string) []string {
	return []string{base, base + ":res", base + ":exp"}
}

// userAction holds a user action's ledger and spend: {ua:<hash>}.
func (k keys) userAction(uaHash string) []string {
	return k.accountKeys(k.prefix + ":{ua:" + uaHash + "}")
}

// tenantWindow holds a tenant's spend in one window, named by the window's
// length and start so that windows of different lengths never mix.
func (k keys) tenantWindow(tenantHash string, lengthMs, startMs int64) []string {
	return k.accountKeys(k.prefix + ":{tenant:" + tenantHash + "}:w:" +
		strconv.FormatInt(lengthMs, 10) + ":" + strconv.FormatInt(startMs, 10))
}

// pool returns the pool's tag prefix: its cohort windows, its reserve and the
// record of the counts held by live reservations all share it.
func (k keys) pool(poolHash string) string { return k.prefix + ":{pool:" + poolHash + "}" }

// window holds a cohort's duplicate-rate window of slots of slotMs,
// named by the slot length so that windows of different slots never mix.
func (k keys) window(poolHash, cohortHash string, slotMs int64) string {
	return k.pool(poolHash) + ":w:" + cohortHash + ":" + strconv.FormatInt(slotMs, 10)
}
func (k keys) reserve(poolHash string) string    { return k.pool(poolHash) + ":reserve" }
func (k keys) poolTokens(poolHash string) string { return k.pool(poolHash) + ":tokens" }

func (k keys) route(routeHash string) string       { return k.prefix + ":{route:" + routeHash + "}" }
func (k keys) routeFlags(routeHash string) string  { return k.route(routeHash) + ":flags" }
func (k keys) routeLeases(routeHash string) string { return k.route(routeHash) + ":leases" }

// What counted an extra attempt in its cohort's window, as the pool
// scripts report it and reservation ids carry it.
const (
	srcNone        = 0 // nothing: a primary
	srcCohort      = 1 // a hedge under the window's ceiling
	srcReserve     = 2 // a hedge the pool's reserve paid
	srcReplacement = 3 // a replacement or a continuation, never refused
)

// reservation is what a ReservationID encodes: every entity the
// reservation spans, so that Settle and Release go straight to them.
type reservation struct {
	nonce  string // unique per reservation; its record's name in every entity
	ua     string // user action hash
	group  string // the hash of the group its ledger slot is held for, or ""
	source int    // srcNone, srcCohort, srcReserve, srcReplacement
	pool   string // pool hash, with source ≠ srcNone
	cohort string // cohort hash, with source ≠ srcNone
	tenant string // tenant hash, when a tenant ceiling applied
	winLen int64  // tenant window length, ms
	winAt  int64  // tenant window start, Unix ms
	slotMs int64  // the duplicate window's slot length, with source ≠ srcNone
	slot   int64  // the slot the extra attempt was counted in
}

// idVersion starts every reservation id, so the format can change. r1 ids
// (a duplicate-rate bucket's tokens) and r2 ids (no group) are refused as
// unknown: their shares return to the ceilings when they expire.
const idVersion = "r3"

// id renders the reservation as its opaque ReservationID:
// r3.<nonce>.<ua>.<source>.<pool>.<cohort>.<tenant>.<window length>.<window start>.<slot length>.<slot>.<group>.<check>,
// where check is a digest of the rest, so that an id damaged on its way
// back (truncated, altered) is refused whole instead of ending the shares
// of some entities and missing the others.
func (r reservation) id() budgets.ReservationID {
	body := strings.Join([]string{
		idVersion, r.nonce, r.ua, strconv.Itoa(r.source), r.pool, r.cohort, r.tenant,
		strconv.FormatInt(r.winLen, 10), strconv.FormatInt(r.winAt, 10),
		strconv.FormatInt(r.slotMs, 10), strconv.FormatInt(r.slot, 10), r.group,
	}, ".")
	return budgets.ReservationID(body + "." + idCheck(body))
}

// idCheck is the digest that ends a reservation id: 72 bits of the SHA-256
// of the rest.
func idCheck(body string) string {
	sum := sha256.Sum256([]byte(body))
	return base64.RawURLEncoding.EncodeToString(sum[:9])
}

// parseReservation decodes an id made by reservation.id; ok is false for
// anything else.
func parseReservation(id budgets.ReservationID) (r reservation, ok bool) {
	i := strings.LastIndexByte(string(id), '.')
	if i < 0 || string(id)[i+1:] != idCheck(string(id)[:i]) {
		return reservation{}, false
	}
	body := string(id)[:i]
	parts := strings.Split(body, ".")
	if len(parts) != 12 || parts[0] != idVersion {
		return reservation{}, false
	}
	r.nonce, r.ua, r.pool, r.cohort, r.tenant, r.group = parts[1], parts[2], parts[4], parts[5], parts[6], parts[11]
	var err error
	if r.source, err = strconv.Atoi(parts[3]); err != nil {
		return reservation{}, false
	}
	if r.winLen, err = strconv.ParseInt(parts[7], 10, 64); err != nil {
		return reservation{}, false
	}
	if r.winAt, err = strconv.ParseInt(parts[8], 10, 64); err != nil {
		return reservation{}, false
	}
	if r.slotMs, err = strconv.ParseInt(parts[9], 10, 64); err != nil {
		return reservation{}, false
	}
	if r.slot, err = strconv.ParseInt(parts[10], 10, 64); err != nil {
		return reservation{}, false
	}
	switch {
	case !isHash(r.nonce) || !isHash(r.ua):
		return reservation{}, false
	case r.source < srcNone || r.source > srcReplacement:
		return reservation{}, false
	case r.source != srcNone && (!isHash(r.pool) || !isHash(r.cohort) || r.slotMs <= 0):
		return reservation{}, false
	case r.tenant != "" && (!isHash(r.tenant) || r.winLen <= 0):
		return reservation{}, false
	case r.group != "" && !isHash(r.group):
		return reservation{}, false
	}
	return r, true
}

// isHash reports whether s has the form of entityHash's and newNonce's
// results, so a forged id cannot name keys outside the store's layout.
func isHash(s string) bool {
	if len(s) != 22 {
		return false
	}
	_, err := base64.RawURLEncoding.DecodeString(s)
	return err == nil
}

// newNonce returns 128 random bits, base64url-encoded: the reservation's
// name in each entity it spans, unique across all replicas.
func newNonce() string {
	var b [16]byte
	for i := 0; i < 16; i += 8 {
		v := rand.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}
