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
// (docs/architecture.md §7, "Slices"). The region's store (Redis) keeps
// the attempt ledgers, the duplicate windows, route flags and leases; each
// tenant's spend window is spent from this gateway's slice of it, so it
// costs no round trip of its own and still holds, at the gateway's safe
// share, while the region's store is away. An admission the region's
// store cannot answer is decided by a Memory of this gateway, so a
// primary is never admitted without a ledger or a spend ceiling: per
// gateway until the store answers again.
type Sliced struct {
	Store  // the region's
	slices *slice.Slices
	local  *Memory
	now    func() time.Time

	mu      sync.Mutex
	charges map[ReservationID]charge // live reservations' tenant spend
	soonest time.Time                // the soonest expiry among charges
}

// charge is what a reservation took from its tenant's window slice.
type charge struct {
	window  slice.Rate
	units   int64
	expires time.Time
}

// localPrefix marks the reservations the gateway's own Memory granted.
const localPrefix = "local/"

var _ Store = (*Sliced)(nil)

// NewSliced returns the Store of a gateway whose region keeps region and
// whose tenant spend is spent from slices; now is the clock of the local
// Memory and of tenant windows (nil: time.Now).
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

// withoutTenant is p with no tenant ceiling: the region's store is not
// asked for it.
func withoutTenant(p SpendPolicy) SpendPolicy {
	p.TenantCeiling, p.TenantWindow = 0, 0
	return p
}

// Admit asks the region's store (or, when it cannot answer, the gateway's
// Memory) for the ledger slot, the user action's spend and the window's
// count, then the tenant's spend from the slice. The reasons keep the
// order of every Store: attempts, spend_user_action, spend_tenant.
func (s *Sliced) Admit(ctx context.Context, req AdmitRequest) (Admission, error) {
	if err := req.Validate(); err != nil {
		return Admission{}, err
	}
	region := req
	region.Spend = withoutTenant(req.Spend)
	adm, err := s.Store.Admit(ctx, region)
	if err != nil && !errors.Is(err, ErrInvalidRequest) && ctx.Err() == nil {
		adm, err = s.local.Admit(ctx, region)
		adm.Reservation = localPrefix + adm.Reservation
	}
	if err != nil || !adm.Allowed {
		return adm, err
	}
	if !s.takeTenant(ctx, adm.Reservation, req.Tenant, req.Spend) {
		s.releaseQuietly(ctx, adm.Reservation)
		return Admission{Reason: ReasonSpendTenant}, nil
	}
	return adm, nil
}

// ReserveExtra asks the region's store for the extra attempt, then the
// tenant's spend from the slice. While the region's store is away, extras
// are refused as by any Store that cannot answer.
func (s *Sliced) ReserveExtra(ctx context.Context, req ExtraRequest) (Grant, error) {
	if err := req.Validate(); err != nil {
		return Grant{}, err
	}
	region := req
	region.Spend = withoutTenant(req.Spend)
	grant, err := s.Store.ReserveExtra(ctx, region)
	if err != nil || !grant.Allowed {
		return grant, err
	}
	if !s.takeTenant(ctx, grant.Reservation, req.Tenant, req.Spend) {
		s.releaseQuietly(ctx, grant.Reservation)
		return Grant{Reason: ReasonSpendTenant}, nil
	}
	return grant, nil
}

// takeTenant spends the reservation's units from its tenant's window
// slice, if it has a tenant ceiling, and records the charge for the end.
func (s *Sliced) takeTenant(ctx context.Context, id ReservationID, tenant string, p SpendPolicy) bool {
	units := p.Units()
	if p.TenantCeiling == 0 || units == 0 {
		return true
	}
	if units > p.TenantCeiling {
		return false // no window could hold it
	}
	now := s.now()
	s.expire(now)
	w := tenantWindow(tenant, p, now)
	if ok, _ := s.slices.TakeN(ctx, w, float64(units)); !ok {
		return false
	}
	expires := now.Add(p.ReservationTTL)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.charges[id] = charge{window: w, units: units, expires: expires}
	if s.soonest.IsZero() || expires.Before(s.soonest) {
		s.soonest = expires
	}
	return true
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
		s.slices.Adjust(c.window, float64(c.units))
	}
}

// endTenant corrects the tenant's slice once a reservation ends: what it
// did not use goes back (all of it for a release), over-use is charged.
func (s *Sliced) endTenant(id ReservationID, used int64, release bool) {
	s.mu.Lock()
	c, ok := s.charges[id]
	delete(s.charges, id)
	s.mu.Unlock()
	if !ok {
		return
	}
	if release {
		used = 0
	}
	s.slices.Adjust(c.window, float64(c.units-used))
}

// releaseQuietly gives back a grant the tenant's spend then refused; a
// failure leaves it to its expiry, as a Store's own compensation does.
func (s *Sliced) releaseQuietly(ctx context.Context, id ReservationID) {
	_ = s.Release(ctx, id)
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
	s.endTenant(id, usage.InputUnits+usage.OutputUnits, false)
	return err
}

// Release gives the reservation back, in the store that granted it, and
// its units to the tenant's slice.
func (s *Sliced) Release(ctx context.Context, id ReservationID) error {
	store, storeID := s.storeOf(id)
	err := store.Release(ctx, storeID)
	s.endTenant(id, 0, true)
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
			s.endTenant(e.Reservation, e.Usage.InputUnits+e.Usage.OutputUnits, e.Release)
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
