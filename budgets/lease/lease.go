// Package lease splits a global ceiling into regional leases
// (docs/architecture.md §14, "Leases"): each region holds a share of the
// ceiling, valid until an expiry, sized by its recent demand, and spends it
// through its own granter (budgets/slice), so nothing on a request's path
// crosses regions.
//
// A Table is the authority's state of one ceiling — what every region reads
// and writes back with compare-and-set — and Renew is the only way it
// changes: pure, driven by the renewing region's clock, so that the live
// authority and the simulator run the same code.
//
// The guarantee: at every instant the shares the regions may be spending
// sum to at most the whole ceiling, whichever regions are cut off, whatever
// replies are lost, with clocks apart by at most Options.Skew. A region
// spends its share until its expiry (Spending); after it, or with no lease,
// its safe share — the smaller of its last share and Options.Fallback. The
// table reserves for each region the most it may be spending (Reserved),
// and a renewal grants only what the others' reservations leave, so a lost
// region's share is granted to no one before its lease has expired, and a
// region cut off for good, or dead, keeps its safe share reserved until it
// returns or is taken out of Options.Regions.
//
// A budget (Ask.Budget: a ceiling consumed over a window, as a tenant's
// spend per day, never refilled) is leased as tokens instead: a region's
// share is the part of the window's budget it may have spent in all, it
// never shrinks (what was spent stays spent) and grows with the region's
// demand, a validity's demand ahead, out of what no region holds; a region
// without a lease of it spends the floor.
package lease

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// ErrInvalid wraps every refusal of malformed options or a malformed ask.
var ErrInvalid = errors.New("lease: invalid")

// Defaults of Options (docs/architecture.md §14).
const (
	DefaultValidity = 10 * time.Second
	DefaultSkew     = time.Second
	// DefaultFloorOfFallback is the floor's default as a part of the safe
	// share: every live region is sized to at least a tenth of it.
	DefaultFloorOfFallback = 0.1
)

// Options are the rules every region's renewals follow; every region must
// use the same.
type Options struct {
	// Regions names every region that may hold a lease. A region not
	// in the table yet is reserved its safe share: it may be spending it.
	Regions []string
	// Validity is how long a grant lasts from its renewal (default 10 s).
	Validity time.Duration
	// Skew bounds how far apart any two regions' clocks may be (default
	// 1 s): a region stops spending a share Skew before its expiry by its
	// own clock, and the authority counts it Skew past it.
	Skew time.Duration
	// Fallback is the safe share as a fraction of the ceiling (default 1 ÷
	// the regions): the most a region without a live lease spends.
	Fallback float64
	// Floor is the share every live region is sized to at least, as a
	// fraction of the ceiling (default a tenth of Fallback), so that a quiet
	// region's first requests find room.
	Floor float64
}

// Validate refuses options that cannot hold, zero fields taking their
// defaults.
func (o Options) Validate() error {
	_, err := o.withDefaults()
	return err
}

// withDefaults fills zero fields and refuses options that cannot hold.
func (o Options) withDefaults() (Options, error) {
	if len(o.Regions) == 0 {
		return o, fmt.Errorf("%w: options: no regions", ErrInvalid)
	}
	for i, r := range o.Regions {
		if r == "" || slices.Contains(o.Regions[:i], r) {
			return o, fmt.Errorf("%w: options: region %q is empty or named twice", ErrInvalid, r)
		}
	}
	if o.Validity == 0 {
		o.Validity = DefaultValidity
	}
	if o.Skew == 0 {
		o.Skew = DefaultSkew
	}
	if o.Fallback == 0 {
		o.Fallback = 1 / float64(len(o.Regions))
	}
	if o.Floor == 0 {
		o.Floor = o.Fallback * DefaultFloorOfFallback
	}
	switch n := float64(len(o.Regions)); {
	case o.Validity <= 2*o.Skew || o.Skew < 0:
		return o, fmt.Errorf("%w: options: validity %v must exceed twice the skew %v", ErrInvalid, o.Validity, o.Skew)
	case !(o.Fallback > 0) || o.Fallback*n > 1+1e-9:
		return o, fmt.Errorf("%w: options: fallback share %v must be > 0 and at most 1 ÷ %v regions", ErrInvalid, o.Fallback, n)
	case !(o.Floor > 0) || o.Floor > o.Fallback:
		return o, fmt.Errorf("%w: options: floor %v must be > 0 and at most the fallback share %v", ErrInvalid, o.Floor, o.Fallback)
	}
	return o, nil
}

// Grant is one region's lease in a table.
type Grant struct {
	// Share is the fraction of the ceiling granted, until Expires by the
	// renewing region's clock.
	Share   float64   `json:"share"`
	Expires time.Time `json:"expires"`
	// Demand is what the region wanted at its renewal, in units per second
	// (or units held, for a concurrency ceiling): what shares are sized by.
	Demand float64 `json:"demand"`
	// Held is the lease the region spent when it asked: it goes on
	// spending it until the reply reaches it, and past that if the reply is
	// lost, so the table reserves it until the region's next renewal says
	// what it holds then.
	Held Held `json:"held"`
	// Prior is the grant this one replaced, when the region did not report
	// holding it: its reply may still be on its way (a renewer paused
	// past its lock's hold, whose late write another renewal of the region
	// followed), so it stays reserved too, until the region's next renewal.
	// A region takes a grant only if it expires later than the one it
	// holds, and has at most two renewals of a ceiling in flight at once.
	Prior Held `json:"prior,omitzero"`
}

// Held is a lease as its region knows it: the last grant that reached it,
// or none (zero) for a region that never had one.
type Held struct {
	Share   float64   `json:"share"`
	Expires time.Time `json:"expires"`
}

// lease is the grant as its region holds it.
func (g Grant) lease() Held { return Held{Share: g.Share, Expires: g.Expires} }

// Table is the authority's state of one global ceiling.
type Table struct {
	// Since is when the table was created. For a lease's validity and the
	// skew after it, regions may still hold leases of a table that was
	// lost, which it knows nothing of: until then no region is granted more
	// than it held (learning, as Doorman's server after a master change).
	Since  time.Time        `json:"since"`
	Grants map[string]Grant `json:"grants,omitempty"`
	// Budget marks the table of a budget (Ask.Budget): once any renewal
	// says so, for good, since a budget's reservations are the larger.
	Budget bool `json:"budget,omitempty"`
}

// NewTable is a table created at now, with no grants: it learns first.
func NewTable(now time.Time) Table { return Table{Since: now} }

// Ask is a region's renewal.
type Ask struct {
	Region string
	// Demand is what the region wants, in units per second (units held for
	// a concurrency ceiling); ≥ 0.
	Demand float64
	// Held is the lease the region spends now: its last grant that reached
	// it, or none (zero).
	Held Held
	// Budget says the ceiling is a budget consumed over a window, not a
	// rate: Demand is then in parts of the budget per second, and shares
	// are allowances (the package doc).
	Budget bool
}

// Spending is the share a region spends at now by its own clock, holding
// h: h's share until Skew before its expiry, then its safe share; with no
// lease, the fallback.
func Spending(h Held, now time.Time, o Options) (float64, error) {
	o, err := o.withDefaults()
	if err != nil {
		return 0, err
	}
	return spends(h, now, -o.Skew, o), nil
}

// SpendingBudget is the part of a budget a region holding h may have spent
// in all: h's share whatever its expiry (tokens do not lapse), and the floor
// before its first lease.
func SpendingBudget(h Held, o Options) (float64, error) {
	o, err := o.withDefaults()
	if err != nil {
		return 0, err
	}
	return allowance(h, o), nil
}

// allowance is the part of a budget a region holding h may have spent.
func allowance(h Held, o Options) float64 {
	if h == (Held{}) {
		return o.Floor
	}
	return h.Share
}

// spends is what a region holding h spends at now, its expiry moved by
// margin: −Skew as the region counts (it stops early), +Skew as the
// authority counts (it may be spending a little longer). The safe share is
// the smaller of the last share and the fallback; a region that never had
// a lease spends the fallback.
func spends(h Held, now time.Time, margin time.Duration, o Options) float64 {
	switch {
	case h == Held{}:
		return o.Fallback
	case now.Before(h.Expires.Add(margin)):
		return h.Share
	}
	return min(h.Share, o.Fallback)
}

// Reserved is the most region may be spending at now: the largest of its
// grant, what it held when it asked and the grant this one replaced
// (Prior), each counted to Skew past its expiry and as its safe share
// after; a region not in the table is reserved the fallback.
func (t Table) Reserved(region string, now time.Time, o Options) (float64, error) {
	o, err := o.withDefaults()
	if err != nil {
		return 0, err
	}
	return t.reserved(region, now, o), nil
}

func (t Table) reserved(region string, now time.Time, o Options) float64 {
	g, ok := t.Grants[region]
	if t.Budget {
		if !ok {
			return o.Floor
		}
		return g.Share // no less than what it held or replaced: a budget's grants only grow
	}
	if !ok {
		return o.Fallback
	}
	res := max(spends(g.lease(), now, o.Skew, o), spends(g.Held, now, o.Skew, o))
	if g.Prior != (Held{}) {
		res = max(res, spends(g.Prior, now, o.Skew, o))
	}
	return res
}

// live reports whether region holds a grant not yet past its expiry and the
// skew at now.
func (t Table) live(region string, now time.Time, o Options) bool {
	g, ok := t.Grants[region]
	return ok && now.Before(g.Expires.Add(o.Skew))
}

// Renew is a's renewal at now by its region's clock: the table to write
// back (with compare-and-set: a conflict means another region renewed
// first; read again and renew again) and a's new grant.
//
// The grant is sized by demand: the live regions (a included) share what
// the others' reservations leave, each a Floor plus its demand's part of
// the rest; and it never exceeds what every other region's reservation
// leaves, so the table's reservations never sum past the ceiling. While
// the table learns (Table.Since), a is granted no more than it spends.
func Renew(t Table, a Ask, now time.Time, o Options) (Table, Grant, error) {
	o, err := o.withDefaults()
	if err != nil {
		return t, Grant{}, err
	}
	if !slices.Contains(o.Regions, a.Region) {
		return t, Grant{}, fmt.Errorf("%w: ask: region %q is not one of %v", ErrInvalid, a.Region, o.Regions)
	}
	if !(a.Demand >= 0) || math.IsInf(a.Demand, 0) || !(a.Held.Share >= 0) || a.Held.Share > 1 {
		return t, Grant{}, fmt.Errorf("%w: ask of %q: demand %v must be finite and ≥ 0, held share %v in [0, 1]",
			ErrInvalid, a.Region, a.Demand, a.Held.Share)
	}
	t.Budget = t.Budget || a.Budget
	if t.Budget {
		return renewBudget(t, a, now, o)
	}
	others, idle := 0.0, 0.0 // reservations of every other region; of those not live
	live := 1                // live regions, a included
	demand := a.Demand
	for _, r := range o.Regions {
		if r == a.Region {
			continue
		}
		res := t.reserved(r, now, o)
		others += res
		if t.live(r, now, o) {
			live++
			demand += t.Grants[r].Demand
		} else {
			idle += res
		}
	}
	free := max(0, 1-idle)
	share := free / float64(live)
	if demand > 0 {
		share = o.Floor + max(0, free-float64(live)*o.Floor)*a.Demand/demand
	}
	share = max(0, min(share, 1-others))
	if now.Before(t.Since.Add(o.Validity + o.Skew)) {
		share = min(share, spends(a.Held, now, -o.Skew, o))
	}
	return t.with(a, share, now, o)
}

// renewBudget is Renew of a budget's table: a's allowance never shrinks
// below any it may hold, and grows out of the room every region's
// allowance leaves by its demand over the time since its last grant (a
// validity's at its first since the table learned) — when the live
// regions' demands for a validity ask for more than the room, by no more
// than its demand's part of it. While the table learns it does not grow.
func renewBudget(t Table, a Ask, now time.Time, o Options) (Table, Grant, error) {
	others, wanted := 0.0, a.Demand // the other regions' allowances; the live regions' demand
	for _, r := range o.Regions {
		if r == a.Region {
			continue
		}
		others += t.reserved(r, now, o)
		if t.live(r, now, o) {
			wanted += t.Grants[r].Demand
		}
	}
	base := allowance(a.Held, o)
	if _, ok := t.Grants[a.Region]; ok {
		base = max(base, t.reserved(a.Region, now, o))
	}
	room := max(0, 1-others-base)
	// It grows by its demand over the time since its last grant, so that
	// it keeps a validity's demand ahead of what it spends (its first
	// grant's headroom) and no more.
	learned := t.Since.Add(o.Validity + o.Skew)
	since := o.Validity
	if old, ok := t.Grants[a.Region]; ok && !old.Expires.Add(-o.Validity).Before(learned) {
		since = min(since, max(0, now.Sub(old.Expires.Add(-o.Validity))))
	}
	step := min(a.Demand*since.Seconds(), room)
	if wanted*o.Validity.Seconds() > room {
		step = min(step, room*a.Demand/wanted)
	}
	if now.Before(learned) {
		step = 0
	}
	return t.with(a, base+step, now, o)
}

// with is t with a's new grant of share at now, the grant it replaced kept
// as Prior when a did not report holding it.
func (t Table) with(a Ask, share float64, now time.Time, o Options) (Table, Grant, error) {
	g := Grant{Share: share, Expires: now.Add(o.Validity), Demand: a.Demand, Held: a.Held}
	if old, ok := t.Grants[a.Region]; ok && old.lease() != a.Held {
		g.Prior = old.lease()
	}
	next := Table{Since: t.Since, Budget: t.Budget, Grants: make(map[string]Grant, len(t.Grants)+1)}
	for r, old := range t.Grants {
		if slices.Contains(o.Regions, r) {
			next.Grants[r] = old
		}
	}
	next.Grants[a.Region] = g
	return next, g, nil
}
