package budgets

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hedgerow/hedgerow/budgets/slice"
	"github.com/hedgerow/hedgerow/schemas"
)

// Sliced is the Store of one gateway among a region's several
// (docs/architecture.md §7, "Slices"). A user action only this gateway can
// know (AdmitRequest.Local: no Idempotency-Key) is decided in the
// gateway's own Memory — its ledger, spend and duplicate window — with
// the pool's reserve spent from the gateway's slice of it: no round trip.
// One other gateways may share is decided by the region's store (Redis),
// which keeps its ledger, and, when that store cannot answer, by the
// gateway's Memory, so a primary is never admitted without a ledger or a
// spend ceiling. Either way each tenant's spend window is spent from the
// gateway's slice of it, so it costs no round trip of its own and holds,
// at the gateway's safe share, while the region's store is away. Route
// flags and leases are the region's store's.
type Sliced struct {
	Store  // the region's
	slices *slice.Slices
	local  *Memory
	now    func() time.Time

	mu      sync.Mutex
	charges map[ReservationID]charge // what live reservations took from slices
	soonest time.Time                // the soonest expiry among charges
}

// charge is what a reservation took from the gateway's slices: units of
// its tenant's spend window, a token of its pool's reserve, or both.
type charge struct {
	window  *slice.Rate
	units   int64
	reserve *slice.Rate
	expires time.Time
}

// localPrefix marks the reservations the gateway's own Memory granted.
const localPrefix = "local/"

var _ Store = (*Sliced)(nil)

// NewSliced returns the Store of a gateway whose region keeps region and
// whose slices are slices; now is the clock of the local Memory and of
// tenant windows (nil: time.Now).
func NewSliced(region Store, slices *slice.Slices, now func() time.Time) *Sliced {
	if now == nil {
		now = time.Now
	}
	return &Sliced{Store: region, slices: slices, local: NewMemory(now), now: now, charges: map[ReservationID]charge{}}
}

// tenantWindow is the slice ceiling of a tenant's spend window holding
// now: a budget that never refills, keyed by the window's start.
func tenantWindow(tenant string, p SpendPolicy, now time.Time) slice.Rate {
	start := TenantWindowStart(now, p.TenantWindow)
	return slice.Rate{
		Key:   "tenant:" + tenant + ":spend:" + strconv.FormatInt(p.TenantWindow.Milliseconds(), 10) + ":" + strconv.FormatInt(start, 10),
		Kind:  "tenant_spend",
		Burst: float64(p.TenantCeiling),
	}
}

// poolReserve is the slice ceiling of a pool's reserve.
func poolReserve(pool string, b ReserveBucket) slice.Rate {
	return slice.Rate{Key: "pool:" + pool + ":reserve", Kind: "pool_reserve", PerSecond: b.RefillPerSecond, Burst: b.Capacity}
}

// withoutTenant is p with no tenant ceiling: the tenant's spend is the
// slices', not the store's.
func withoutTenant(p SpendPolicy) SpendPolicy {
	p.TenantCeiling, p.TenantWindow = 0, 0
	return p
}

// Admit takes the tenant's spend from the slice, then decides the primary
// in the gateway's Memory (a local user action, or the region's store
// unreachable) or the region's store — the ledger slot, the user action's
// spend and the window's count —, giving the tenant's units back if that
// refuses. The tenant's units go first so that a refusal for them counts
// nothing anywhere (a primary counted and then refused would leave its
// window room for a hedge it never earned); the reasons keep the order of
// every Store, attempts and spend_user_action before spend_tenant, except
// that a request its tenant's window refuses is told spend_tenant even if
// its ledger is full too.
func (s *Sliced) Admit(ctx context.Context, req AdmitRequest) (Admission, error) {
	if err := req.Validate(); err != nil {
		return Admission{}, err
	}
	tenant, ok := s.takeTenant(ctx, req.Tenant, req.Spend)
	if !ok {
		return Admission{Reason: ReasonSpendTenant}, nil
	}
	inner := req
	inner.Spend = withoutTenant(req.Spend)
	var adm Admission
	var err error
	if !req.Local {
		adm, err = s.Store.Admit(ctx, inner)
	}
	if req.Local || err != nil && !errors.Is(err, ErrInvalidRequest) && ctx.Err() == nil {
		adm, err = s.local.Admit(ctx, inner)
		if adm.Allowed {
			adm.Reservation = localPrefix + adm.Reservation
		}
	}
	if err != nil || !adm.Allowed {
		s.giveBack(tenant)
		return adm, err
	}
	s.remember(adm.Reservation, tenant, s.now().Add(req.Spend.ReservationTTL))
	return adm, nil
}

// ReserveExtra takes the tenant's spend from the slice, then decides the
// extra attempt in the gateway's Memory (a local user action; its pool's
// reserve from the slice) or the region's store, giving the tenant's units
// back if that refuses. While the region's store is away, extras of
// shared user actions are refused as by any Store that cannot answer.
func (s *Sliced) ReserveExtra(ctx context.Context, req ExtraRequest) (Grant, error) {
	if err := req.Validate(); err != nil {
		return Grant{}, err
	}
	paid, ok := s.takeTenant(ctx, req.Tenant, req.Spend)
	if !ok {
		return Grant{Reason: ReasonSpendTenant}, nil
	}
	inner := req
	inner.Spend = withoutTenant(req.Spend)
	var grant Grant
	var err error
	if req.Local {
		grant, paid.reserve, err = s.localExtra(ctx, inner)
	} else {
		grant, err = s.Store.ReserveExtra(ctx, inner)
	}
	if err != nil || !grant.Allowed {
		s.giveBack(paid)
		return grant, err
	}
	s.remember(grant.Reservation, paid, s.now().Add(req.Spend.ReservationTTL))
	return grant, nil
}

// localExtra decides an extra attempt of a local user action in the
// gateway's Memory. A hedge its cohort's window refuses is paid, if the
// pool has a reserve, by a token of the gateway's slice of it — taken
// outside the Memory's lock, since a cold slice asks the region — and then
// counted as reserve-paid; the token goes back if the Memory then refuses.
func (s *Sliced) localExtra(ctx context.Context, req ExtraRequest) (Grant, *slice.Rate, error) {
	reserve := req.Reserve
	req.Reserve = ReserveBucket{}
	grant, err := s.local.ReserveExtra(ctx, req)
	var paid *slice.Rate
	if err == nil && !grant.Allowed && grant.Reason == ReasonDuplicateRate && reserve.Capacity >= 1 {
		r := poolReserve(req.Pool, reserve)
		if ok, _ := s.slices.Take(ctx, r); ok {
			if grant, err = s.local.reserveExtra(ctx, req, true); err != nil || !grant.Allowed {
				s.slices.Adjust(r, 1)
			} else {
				paid = &r
			}
		}
	}
	if grant.Allowed {
		grant.Reservation = localPrefix + grant.Reservation
	}
	return grant, paid, err
}

// takeTenant spends a reservation's units from its tenant's window slice,
// if it has a tenant ceiling, and says what it took; false when the window
// refuses them.
func (s *Sliced) takeTenant(ctx context.Context, tenant string, p SpendPolicy) (charge, bool) {
	now := s.now()
	s.expire(now)
	units := p.Units()
	if p.TenantCeiling == 0 || units == 0 {
		return charge{}, true
	}
	if units > p.TenantCeiling {
		return charge{}, false // no window could hold it
	}
	w := tenantWindow(tenant, p, now)
	if ok, _ := s.slices.TakeN(ctx, w, float64(units)); !ok {
		return charge{}, false
	}
	return charge{window: &w, units: units}, true
}

// giveBack returns what a decision took from slices when the store then
// refused it.
func (s *Sliced) giveBack(c charge) {
	if c.window != nil {
		s.slices.Adjust(*c.window, float64(c.units))
	}
	if c.reserve != nil {
		s.slices.Adjust(*c.reserve, 1)
	}
}

// remember records what a reservation took from slices, if anything.
func (s *Sliced) remember(id ReservationID, c charge, expires time.Time) {
	if c.window == nil && c.reserve == nil {
		return
	}
	c.expires = expires
	s.mu.Lock()
	defer s.mu.Unlock()
	s.charges[id] = c
	if s.soonest.IsZero() || expires.Before(s.soonest) {
		s.soonest = expires
	}
}

// expire gives back the units of reservations never ended by their TTL,
// as the region's store returns an expired reservation's units to its
// ceilings. It walks the charges only when one has expired.
func (s *Sliced) expire(now time.Time) {
	s.mu.Lock()
	if s.soonest.IsZero() || now.Before(s.soonest) {
		s.mu.Unlock()
		return
	}
	var expired []charge
	s.soonest = time.Time{}
	for id, c := range s.charges {
		switch {
		case !c.expires.After(now):
			expired = append(expired, c)
			delete(s.charges, id)
		case s.soonest.IsZero() || c.expires.Before(s.soonest):
			s.soonest = c.expires
		}
	}
	s.mu.Unlock()
	for _, c := range expired {
		if c.window != nil {
			s.slices.Adjust(*c.window, float64(c.units))
		}
	}
}

// endCharges corrects the slices once a reservation ends: the tenant's
// window gets back what the reservation did not use (all of it for a
// release) or is charged its over-use; a released reserve-paid hedge gives
// its reserve token back, as a Store's Release does.
func (s *Sliced) endCharges(id ReservationID, used int64, release bool) {
	s.mu.Lock()
	c, ok := s.charges[id]
	delete(s.charges, id)
	s.mu.Unlock()
	if !ok {
		return
	}
	if release {
		used = 0
		if c.reserve != nil {
			s.slices.Adjust(*c.reserve, 1)
		}
	}
	if c.window != nil {
		s.slices.Adjust(*c.window, float64(c.units-used))
	}
}

// storeOf is the store that granted id and the id it knows.
func (s *Sliced) storeOf(id ReservationID) (Reservations, ReservationID) {
	if rest, ok := strings.CutPrefix(string(id), localPrefix); ok {
		return s.local, ReservationID(rest)
	}
	return s.Store, id
}

// Settle ends the reservation with its usage, in the store that granted
// it, and corrects the tenant's slice.
func (s *Sliced) Settle(ctx context.Context, id ReservationID, usage schemas.Usage) error {
	if err := ValidateUsage(usage); err != nil {
		return err
	}
	store, storeID := s.storeOf(id)
	err := store.Settle(ctx, storeID, usage)
	s.endCharges(id, usage.InputUnits+usage.OutputUnits, false)
	return err
}

// Release gives the reservation back, in the store that granted it, and
// its units to the tenant's slice.
func (s *Sliced) Release(ctx context.Context, id ReservationID) error {
	store, storeID := s.storeOf(id)
	err := store.Release(ctx, storeID)
	s.endCharges(id, 0, true)
	return err
}

// EndAll ends each reservation in the store that granted it — the
// region's in one call, the gateway's own in another — and corrects the
// tenants' slices.
func (s *Sliced) EndAll(ctx context.Context, ends []Ending) []error {
	errs := make([]error, len(ends))
	var region, local []Ending
	var regionAt, localAt []int
	for i, e := range ends {
		if e.Release {
			continue
		}
		if err := ValidateUsage(e.Usage); err != nil {
			errs[i] = err
		}
	}
	for i, e := range ends {
		if errs[i] != nil {
			continue
		}
		store, id := s.storeOf(e.Reservation)
		e.Reservation = id
		if store == s.local {
			local, localAt = append(local, e), append(localAt, i)
		} else {
			region, regionAt = append(region, e), append(regionAt, i)
		}
	}
	for j, err := range s.endAllIn(ctx, s.Store, region) {
		errs[regionAt[j]] = err
	}
	for j, err := range s.endAllIn(ctx, s.local, local) {
		errs[localAt[j]] = err
	}
	for i, e := range ends {
		if errs[i] == nil || errors.Is(errs[i], ErrUnknownReservation) {
			s.endCharges(e.Reservation, e.Usage.InputUnits+e.Usage.OutputUnits, e.Release)
		}
	}
	return errs
}

// endAllIn is store's EndAll of ends, none for none.
func (s *Sliced) endAllIn(ctx context.Context, store Reservations, ends []Ending) []error {
	if len(ends) == 0 {
		return nil
	}
	return store.EndAll(ctx, ends)
}
