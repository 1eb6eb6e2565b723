package budgets

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// sweepInterval is how often, in clock time, Memory forgets entities whose
// expiry has passed. Expiry itself is exact at every call; the sweep only
// bounds memory held for entities nobody asks about again.
const sweepInterval = time.Minute

// Memory is a Store for a single replica: all state sits behind one mutex, so
// every decision is atomic and the compensation of a denied decision is never
// observed by another caller. Time comes from the clock given to NewMemory and
// expiry is evaluated lazily against it, which lets the simulator run Memory on
// virtual time and tests advance time without sleeping.
type Memory struct {
	now func() time.Time

	mu           sync.Mutex
	seq          uint64
	userActions  map[string]*userAction
	tenants      map[tenantWindowKey]*tenantAccount
	windows      map[windowKey]*duplicateWindow
	reserves     map[string]*reserveBucket
	routes       map[string]*routeFlags
	leases       map[string]map[string]time.Time // route → holder → expiry
	reservations map[ReservationID]*reservation
	byExpiry     reservationQueue
	nextSweep    time.Time
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty Memory store reading time from now; a nil now
// means time.Now.
func NewMemory(now func() time.Time) *Memory {
	if now == nil {
		now = time.Now
	}
	return &Memory{
		now:          now,
		userActions:  make(map[string]*userAction),
		tenants:      make(map[tenantWindowKey]*tenantAccount),
		windows:      make(map[windowKey]*duplicateWindow),
		reserves:     make(map[string]*reserveBucket),
		routes:       make(map[string]*routeFlags),
		leases:       make(map[string]map[string]time.Time),
		reservations: make(map[ReservationID]*reservation),
	}
}

// userAction is one user action's attempt ledger and spend, which share a
// lifetime (and, in Redis, a hash tag).
type userAction struct {
	attempts int
	// held is the slots each named group holds (AdmitRequest.Group);
	// forgiven is the slots given back to deaths in the ledger's lifetime,
	// at most max, the Max of its last take (AttemptPolicy).
	held     map[string]int
	forgiven int
	max      int
	live     int // live reservations
	spend    spendAccount
	expires  time.Time
}

// forgive gives back up to n of group's held slots within the forgiveness
// bound (AttemptPolicy); a group with none left is forgiven nothing.
func (ua *userAction) forgive(group string, n int) {
	n = min(n, ua.held[group], ua.max-ua.forgiven)
	if n <= 0 {
		return
	}
	ua.attempts -= n
	ua.forgiven += n
	ua.held[group] -= n
}

// giveBack returns the slot of a reservation of group that never launched
// (Release): a slot a forgiveness already gave back is not given twice.
func (ua *userAction) giveBack(group string) {
	if group == "" {
		ua.attempts--
		return
	}
	if ua.held[group] > 0 {
		ua.held[group]--
		ua.attempts--
	}
}

// spendAccount holds settled units and units reserved by live reservations.
type spendAccount struct {
	settled  int64
	reserved int64
}

// fits reports whether units more can be reserved under ceiling (0: none).
func (a *spendAccount) fits(units, ceiling int64) bool {
	return ceiling == 0 || a.settled+a.reserved+units <= ceiling
}

type tenantWindowKey struct {
	tenant string
	start  int64 // Unix ms
	length time.Duration
}

// tenantAccount is one tenant's spend in one window, kept until the window
// ends. A reservation that outlives the window holds the account itself, so
// its settlement still lands in the window it was made in.
type tenantAccount struct {
	spendAccount
	expires time.Time
}

// windowKey names a cohort's duplicate-rate window; a window of another
// slot length is another window.
type windowKey struct {
	pool, cohort string
	slot         time.Duration
}

// duplicateWindow is a cohort's sliding window: the primaries and extra
// attempts counted in each live slot, by slot index (WindowSlot).
type duplicateWindow struct {
	slots map[int64]*windowSlot
	// expires is when the last slot counted in leaves every window.
	expires time.Time
}

// windowSlot is one slot's counts. A reservation holds the slot its extra
// attempt was counted in, so a release uncounts it there; a slot that has
// left the window is forgotten, and uncounting it changes nothing.
type windowSlot struct{ primaries, extras int64 }

// sums returns the counts of the window's live slots from slot from on
// (the whole window when from is before its first slot).
func (w *duplicateWindow) sums(from int64) (primaries, extras int64) {
	for i, s := range w.slots {
		if i >= from {
			primaries += s.primaries
			extras += s.extras
		}
	}
	return primaries, extras
}

// slot returns slot cur's counts, created empty.
func (w *duplicateWindow) slot(cur int64) *windowSlot {
	return entry(w.slots, cur, func() *windowSlot { return &windowSlot{} })
}

// entry returns m[k], storing fresh() there first when k has no entry.
func entry[K comparable, V any](m map[K]V, k K, fresh func() V) V {
	v, ok := m[k]
	if !ok {
		v = fresh()
		m[k] = v
	}
	return v
}

// reserveBucket is a pool's refilling token bucket, in microtokens.
type reserveBucket struct {
	level, capacity int64
	refillPerSecond float64 // microtokens
	refilled        time.Time
	used            time.Time
}

// refill adds the tokens earned since the last refill. The refill time only
// moves on when at least one microtoken was earned, so that frequent touches
// at a slow rate do not round every increment away.
func (f *reserveBucket) refill(now time.Time) {
	if f.level >= f.capacity {
		f.level, f.refilled = f.capacity, now
		return
	}
	earned := int64(now.Sub(f.refilled).Seconds() * f.refillPerSecond)
	if earned > 0 {
		f.level, f.refilled = min(f.capacity, f.level+earned), now
	}
}

type routeFlags struct {
	pushbackUntil, quarantineUntil, ejectedUntil time.Time
}

func (f *routeFlags) state(now time.Time) RouteState {
	switch {
	case now.Before(f.quarantineUntil):
		return RouteQuarantined
	case now.Before(f.pushbackUntil):
		return RoutePushback
	case now.Before(f.ejectedUntil):
		return RouteEjected
	}
	return RouteHealthy
}

// reservation is a live spend reservation together with what its decision
// took, so that Release can give it all back.
type reservation struct {
	id      ReservationID
	units   int64
	expires time.Time
	ua      *userAction
	group   string         // the group its ledger slot is held for
	tenant  *tenantAccount // nil without a tenant ceiling
	counted *windowSlot    // where an extra attempt was counted
	reserve *reserveBucket // the reserve that paid for a hedge, if any
	index   int            // in byExpiry
}

// claim collects what a decision has taken so far and how to give it back.
type claim struct {
	ua      *userAction
	group   string
	tenant  *tenantAccount
	counted *windowSlot
	reserve *reserveBucket
	units   int64
	undo    []func()
}

func (c *claim) compensate() {
	for i := len(c.undo) - 1; i >= 0; i-- {
		c.undo[i]()
	}
	c.undo = nil
}

// Admit implements Store.
func (m *Memory) Admit(ctx context.Context, req AdmitRequest) (Admission, error) {
	if err := ctx.Err(); err != nil {
		return Admission{}, fmt.Errorf("budgets: admit: %w", err)
	}
	if err := req.Validate(); err != nil {
		return Admission{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.advance()

	c := &claim{group: req.Group}
	if reason := m.takeSlot(c, req.UserAction, req.Forgive, req.Attempts, now); reason != ReasonNone {
		adm := Admission{Reason: reason}
		if ua := m.userActions[req.UserAction]; ua.forgiven > 0 || ua.live > 0 {
			adm.RetryAfter = ua.expires.Sub(now)
		}
		return adm, nil
	}
	if reason := m.reserveSpend(c, req.Tenant, req.Spend, now); reason != ReasonNone {
		c.compensate()
		return Admission{Reason: reason}, nil
	}
	w, cur := m.duplicateWindow(req.Pool, req.Window, req.Duplicates, now)
	w.slot(cur).primaries++
	res := m.commit(c, req.Attempts, req.Spend, now)
	return Admission{
		Allowed:       true,
		Reservation:   res.id,
		AttemptsUsed:  c.ua.attempts,
		ReservedUnits: res.units,
	}, nil
}

// ReserveExtra implements Store.
func (m *Memory) ReserveExtra(ctx context.Context, req ExtraRequest) (Grant, error) {
	return m.reserveExtra(ctx, req, false)
}

// reserveExtra is ReserveExtra; with prepaid, a hedge its cohort refuses
// is paid by a reserve the caller already took (a gateway's slice of the
// pool's reserve, Sliced) instead of the Memory's own.
func (m *Memory) reserveExtra(ctx context.Context, req ExtraRequest, prepaid bool) (Grant, error) {
	if err := ctx.Err(); err != nil {
		return Grant{}, fmt.Errorf("budgets: reserve extra: %w", err)
	}
	if err := req.Validate(); err != nil {
		return Grant{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.advance()

	if flags, ok := m.routes[req.Route]; ok {
		switch flags.state(now) {
		case RouteQuarantined:
			return Grant{Reason: ReasonRouteQuarantined}, nil
		case RoutePushback:
			return Grant{Reason: ReasonRoutePushback}, nil
		case RouteEjected:
			return Grant{Reason: ReasonRouteEjected}, nil
		}
	}
	c := &claim{group: req.Group}
	if reason := m.takeSlot(c, req.UserAction, "", req.Attempts, now); reason != ReasonNone {
		return Grant{Reason: reason}, nil
	}
	token, ok := m.countExtra(c, req, now, prepaid)
	if !ok {
		c.compensate()
		return Grant{Reason: ReasonDuplicateRate}, nil
	}
	if reason := m.reserveSpend(c, req.Tenant, req.Spend, now); reason != ReasonNone {
		c.compensate()
		return Grant{Reason: reason}, nil
	}
	res := m.commit(c, req.Attempts, req.Spend, now)
	return Grant{
		Allowed:       true,
		Reservation:   res.id,
		AttemptsUsed:  c.ua.attempts,
		ReservedUnits: res.units,
		Token:         token,
	}, nil
}

// takeSlot takes one slot from the user action's ledger for c's group,
// after forgiving the slots the dead group forgive holds (if named).
func (m *Memory) takeSlot(c *claim, id, forgive string, p AttemptPolicy, now time.Time) Reason {
	ua := m.userActions[id]
	if ua == nil || !now.Before(ua.expires) {
		ua = &userAction{held: map[string]int{}}
		m.userActions[id] = ua
	}
	ua.max = p.Max
	if forgive != "" {
		ua.forgive(forgive, p.Max)
	}
	if ua.attempts >= p.Max {
		return ReasonAttempts
	}
	ua.attempts++
	c.ua = ua
	c.undo = append(c.undo, func() { ua.attempts-- })
	if g := c.group; g != "" {
		ua.held[g]++
		c.undo = append(c.undo, func() { ua.held[g]-- })
	}
	return ReasonNone
}

// countExtra counts an extra attempt in its cohort's window: a
// replacement or a continuation always (ExtraRequest.FollowsAnEndedAttempt),
// a hedge when it fits under the window's ceiling or, failing that, when the
// pool's reserve pays a token. ok is false when a hedge fits under neither.
func (m *Memory) countExtra(c *claim, req ExtraRequest, now time.Time, prepaid bool) (token TokenSource, ok bool) {
	w, cur := m.duplicateWindow(req.Pool, req.Window, req.Duplicates, now)
	primaries, extras := w.sums(math.MinInt64)
	burstPrimaries, burstExtras := w.sums(cur - int64(req.Duplicates.BurstSlots) + 1)
	switch {
	case req.FollowsAnEndedAttempt():
		token = TokenNone
	case req.Duplicates.AllowsHedge(primaries, extras) && req.Duplicates.AllowsBurst(burstPrimaries, burstExtras):
		token = TokenCohort
	case prepaid:
		token = TokenReserve
	case req.Reserve.Capacity == 0:
		return TokenNone, false
	default:
		f := m.reserveBucket(req.Pool, req.Reserve, now)
		if f.level < oneToken {
			return TokenNone, false
		}
		f.level -= oneToken
		c.reserve = f
		c.undo = append(c.undo, func() { f.level = min(f.capacity, f.level+oneToken) })
		token = TokenReserve
	}
	s := w.slot(cur)
	s.extras++
	c.counted = s
	c.undo = append(c.undo, func() { s.extras-- })
	return token, true
}

// reserveSpend reserves the policy's units against the user action's ceiling
// and then the tenant's window ceiling.
func (m *Memory) reserveSpend(c *claim, tenant string, p SpendPolicy, now time.Time) Reason {
	units := p.Units()
	ua := c.ua
	if !ua.spend.fits(units, p.UserActionCeiling) {
		return ReasonSpendUserAction
	}
	ua.spend.reserved += units
	c.units = units
	c.undo = append(c.undo, func() { ua.spend.reserved -= units })
	if p.TenantCeiling == 0 {
		return ReasonNone
	}
	start := TenantWindowStart(now, p.TenantWindow)
	key := tenantWindowKey{tenant: tenant, start: start, length: p.TenantWindow}
	acct := entry(m.tenants, key, func() *tenantAccount {
		return &tenantAccount{expires: time.UnixMilli(start).Add(p.TenantWindow)}
	})
	if !acct.fits(units, p.TenantCeiling) {
		return ReasonSpendTenant
	}
	acct.reserved += units
	c.tenant = acct
	c.undo = append(c.undo, func() { acct.reserved -= units })
	return ReasonNone
}

// commit turns an accepted claim into a live reservation and extends the user
// action's lifetime so that it outlives the reservation.
func (m *Memory) commit(c *claim, a AttemptPolicy, p SpendPolicy, now time.Time) *reservation {
	m.seq++
	res := &reservation{
		id:      ReservationID("mem-" + strconv.FormatUint(m.seq, 10)),
		units:   c.units,
		expires: now.Add(p.ReservationTTL),
		ua:      c.ua,
		group:   c.group,
		tenant:  c.tenant,
		counted: c.counted,
		reserve: c.reserve,
	}
	c.ua.expires = latest(c.ua.expires, now.Add(a.TTL), res.expires)
	c.ua.live++
	m.reservations[res.id] = res
	heap.Push(&m.byExpiry, res)
	return res
}

// duplicateWindow returns the cohort's window, holding only the slots of
// the window that ends with now's, and the index of now's slot. The window
// is kept until its last slot is gone.
func (m *Memory) duplicateWindow(pool, cohort string, cfg DuplicateCeiling, now time.Time) (*duplicateWindow, int64) {
	slot := cfg.SlotLength()
	key := windowKey{pool: pool, cohort: cohort, slot: slot}
	w := entry(m.windows, key, func() *duplicateWindow {
		return &duplicateWindow{slots: make(map[int64]*windowSlot)}
	})
	cur := WindowSlot(now, slot)
	for i := range w.slots {
		if i <= cur-int64(cfg.Slots) {
			delete(w.slots, i)
		}
	}
	// The slot ends at (cur+1)·slot; it leaves the last window Slots-1 slots later.
	w.expires = latest(w.expires, time.UnixMilli((cur+int64(cfg.Slots))*slot.Milliseconds()))
	return w, cur
}

// reserveBucket returns the pool's reserve, created full, refilled up to now with
// the request's configuration applied.
func (m *Memory) reserveBucket(pool string, cfg ReserveBucket, now time.Time) *reserveBucket {
	f := m.reserves[pool]
	if f == nil || !now.Before(f.used.Add(BucketIdleTTL)) {
		f = &reserveBucket{level: Microtokens(cfg.Capacity), refilled: now}
		m.reserves[pool] = f
	}
	f.capacity = Microtokens(cfg.Capacity)
	f.refillPerSecond = cfg.RefillPerSecond * 1e6
	f.refill(now)
	f.used = now
	return f
}

// Settle implements Store.
func (m *Memory) Settle(ctx context.Context, id ReservationID, usage schemas.Usage) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("budgets: settle %s: %w", id, err)
	}
	if err := ValidateUsage(usage); err != nil {
		return fmt.Errorf("%w (settle %s)", err, id)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advance()

	res, ok := m.reservations[id]
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknownReservation, id)
	}
	used := usage.InputUnits + usage.OutputUnits
	res.ua.spend.reserved -= res.units
	res.ua.spend.settled += used
	if res.tenant != nil {
		res.tenant.reserved -= res.units
		res.tenant.settled += used
	}
	m.end(res)
	return nil
}

// EndAll implements Store: each ending in turn, as its own call.
func (m *Memory) EndAll(ctx context.Context, ends []Ending) []error {
	errs := make([]error, len(ends))
	for i, e := range ends {
		switch {
		case e.Release:
			errs[i] = m.Release(ctx, e.Reservation)
		case e.Lost:
			errs[i] = m.settleLost(ctx, e.Reservation, e.Usage)
		default:
			errs[i] = m.Settle(ctx, e.Reservation, e.Usage)
		}
	}
	return errs
}

// settleLost settles an attempt lost with its worker and forgives its
// ledger slot (Ending.Lost).
func (m *Memory) settleLost(ctx context.Context, id ReservationID, usage schemas.Usage) error {
	m.mu.Lock()
	res, ok := m.reservations[id]
	m.mu.Unlock()
	if err := m.Settle(ctx, id, usage); err != nil || !ok {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	res.ua.forgive(res.group, 1)
	if res.group == "" && res.ua.forgiven < res.ua.max {
		res.ua.attempts--
		res.ua.forgiven++
	}
	return nil
}

// Release implements Store.
func (m *Memory) Release(ctx context.Context, id ReservationID) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("budgets: release %s: %w", id, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.advance()

	res, ok := m.reservations[id]
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknownReservation, id)
	}
	res.ua.spend.reserved -= res.units
	res.ua.giveBack(res.group)
	if res.tenant != nil {
		res.tenant.reserved -= res.units
	}
	if res.counted != nil {
		res.counted.extras--
	}
	if res.reserve != nil {
		res.reserve.refill(now)
		res.reserve.level = min(res.reserve.capacity, res.reserve.level+oneToken)
	}
	m.end(res)
	return nil
}

// end forgets a reservation that was settled, released or expired.
func (m *Memory) end(res *reservation) {
	res.ua.live--
	delete(m.reservations, res.id)
	heap.Remove(&m.byExpiry, res.index)
}

// MarkRoute implements Store.
func (m *Memory) MarkRoute(ctx context.Context, route string, state RouteState, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("budgets: mark route %s: %w", route, err)
	}
	if err := ValidateRouteMark(route, state, ttl); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.advance()

	flags := entry(m.routes, route, func() *routeFlags { return &routeFlags{} })
	until := now.Add(ttl)
	switch state {
	case RouteQuarantined:
		flags.quarantineUntil = latest(flags.quarantineUntil, until)
	case RouteEjected:
		flags.ejectedUntil = latest(flags.ejectedUntil, until)
	default:
		flags.pushbackUntil = latest(flags.pushbackUntil, until)
	}
	return nil
}

// RouteStates implements Store.
func (m *Memory) RouteStates(ctx context.Context, routes []string) (map[string]RouteState, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("budgets: route states: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.advance()

	states := make(map[string]RouteState, len(routes))
	for _, r := range routes {
		states[r] = RouteHealthy
		if flags, ok := m.routes[r]; ok {
			states[r] = flags.state(now)
		}
	}
	return states, nil
}

// RouteSnapshot implements Store.
func (m *Memory) RouteSnapshot(ctx context.Context, routes []string) (map[string]RouteState, map[string]int, error) {
	states, err := m.RouteStates(ctx, routes)
	if err != nil {
		return nil, nil, err
	}
	counts, err := m.InFlight(ctx, routes)
	if err != nil {
		return nil, nil, err
	}
	return states, counts, nil
}

// AcquireLease implements Store.
func (m *Memory) AcquireLease(ctx context.Context, route, holder string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("budgets: acquire lease on %s: %w", route, err)
	}
	if err := ValidateLease(route, holder, ttl); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.advance()

	holders := entry(m.leases, route, func() map[string]time.Time { return make(map[string]time.Time) })
	holders[holder] = now.Add(ttl)
	return nil
}

// ReleaseLease implements Store.
func (m *Memory) ReleaseLease(ctx context.Context, route, holder string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("budgets: release lease on %s: %w", route, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advance()

	if holders := m.leases[route]; holders != nil {
		delete(holders, holder)
		if len(holders) == 0 {
			delete(m.leases, route)
		}
	}
	return nil
}

// InFlight implements Store.
func (m *Memory) InFlight(ctx context.Context, routes []string) (map[string]int, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("budgets: in flight: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.advance()

	counts := make(map[string]int, len(routes))
	for _, r := range routes {
		n := 0
		for _, expires := range m.leases[r] {
			if now.Before(expires) {
				n++
			}
		}
		counts[r] = n
	}
	return counts, nil
}

// advance reads the clock and applies every expiry up to now: expired
// reservations return their units to the ceilings they were held against,
// and, once per sweepInterval, entities past their lifetime are forgotten.
// The caller holds m.mu.
func (m *Memory) advance() time.Time {
	now := m.now()
	for len(m.byExpiry) > 0 && !now.Before(m.byExpiry[0].expires) {
		res := m.byExpiry[0]
		res.ua.spend.reserved -= res.units
		if res.tenant != nil {
			res.tenant.reserved -= res.units
		}
		m.end(res)
	}
	if now.Before(m.nextSweep) {
		return now
	}
	m.nextSweep = now.Add(sweepInterval)
	for id, ua := range m.userActions {
		if !now.Before(ua.expires) {
			delete(m.userActions, id)
		}
	}
	for key, acct := range m.tenants {
		if !now.Before(acct.expires) {
			delete(m.tenants, key)
		}
	}
	for key, w := range m.windows {
		if !now.Before(w.expires) {
			delete(m.windows, key)
		}
	}
	for pool, f := range m.reserves {
		if !now.Before(f.used.Add(BucketIdleTTL)) {
			delete(m.reserves, pool)
		}
	}
	for route, flags := range m.routes {
		if flags.state(now) == RouteHealthy {
			delete(m.routes, route)
		}
	}
	for route, holders := range m.leases {
		for holder, expires := range holders {
			if !now.Before(expires) {
				delete(holders, holder)
			}
		}
		if len(holders) == 0 {
			delete(m.leases, route)
		}
	}
	return now
}

// entities reports how many user actions, tenant windows, duplicate windows, reserves,
// flagged routes, leased routes and reservations Memory holds; tests use it to
// check that forgotten entities are really gone.
func (m *Memory) entities() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.userActions) + len(m.tenants) + len(m.windows) + len(m.reserves) +
		len(m.routes) + len(m.leases) + len(m.reservations)
}

func latest(ts ...time.Time) time.Time {
	var l time.Time
	for _, t := range ts {
		if t.After(l) {
			l = t
		}
	}
	return l
}

// reservationQueue orders live reservations by expiry (container/heap).
type reservationQueue []*reservation

func (q reservationQueue) Len() int           { return len(q) }
func (q reservationQueue) Less(i, j int) bool { return q[i].expires.Before(q[j].expires) }
func (q reservationQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index = i
	q[j].index = j
}

func (q *reservationQueue) Push(x any) {
	res := x.(*reservation)
	res.index = len(*q)
	*q = append(*q, res)
}

func (q *reservationQueue) Pop() any {
	old := *q
	res := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return res
}
