package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/schemas"
)

// Results of takeScript.
const (
	takeGranted  = 0
	takeAttempts = 1
	takeCeiling  = 2
)

// decision is one request-path decision in the making: the reservation it
// would create, the clock reading all its scripts share, and which entities
// granted their part, so that a denial can give those parts back.
type decision struct {
	s     *Store
	r     reservation
	now   time.Time
	nowMs int64
	units int64

	uaGranted     bool
	tenantGranted bool
	counted       bool   // a primary was counted in its cohort's window
	windowKey     string // the cohort's window
	slot          int64  // now's slot in it
}

func (s *Store) newDecision(userAction, group string, units int64) *decision {
	now := s.now()
	r := reservation{nonce: newNonce(), ua: entityHash(userAction)}
	if group != "" {
		r.group = entityHash(group)
	}
	return &decision{
		s:     s,
		r:     r,
		now:   now,
		nowMs: now.UnixMilli(),
		units: units,
	}
}

// takeAccounts queues the user action's take (slot and spend) and, with a
// tenant ceiling, the tenant window's.
func (d *decision) takeAccounts(ctx context.Context, b *batch, tenant, forgive string, a budgets.AttemptPolicy, p budgets.SpendPolicy) (ua, tn *scriptCall) {
	resExp := d.nowMs + millisCeil(p.ReservationTTL)
	dead := ""
	if forgive != "" {
		dead = entityHash(forgive)
	}
	ua = b.eval(ctx, takeScript, d.s.keys.userAction(d.r.ua),
		d.nowMs, d.r.nonce, a.Max, d.units, p.UserActionCeiling, resExp, d.nowMs+millisCeil(a.TTL), graceMs, d.r.group, dead)
	if p.TenantCeiling == 0 {
		return ua, nil
	}
	d.r.tenant = entityHash(tenant)
	d.r.winLen = p.TenantWindow.Milliseconds()
	d.r.winAt = budgets.TenantWindowStart(d.now, p.TenantWindow)
	tn = b.eval(ctx, takeScript, d.s.keys.tenantWindow(d.r.tenant, d.r.winLen, d.r.winAt),
		d.nowMs, d.r.nonce, 0, d.units, p.TenantCeiling, resExp, d.r.winAt+d.r.winLen, graceMs, "", "")
	return ua, tn
}

// takeResult reads a takeScript reply: its code, the attempts used, and
// when a full ledger lapses if a retry may then be admitted (ms).
func takeResult(c *scriptCall) (code int64, attempts int, retryAfterMs int64, err error) {
	if c == nil {
		return takeGranted, 0, 0, nil
	}
	v, err := c.cmd.Int64Slice()
	if err != nil {
		return 0, 0, 0, err
	}
	if len(v) != 3 {
		return 0, 0, 0, fmt.Errorf("take script answered %v", v)
	}
	return v[0], int(v[1]), v[2], nil
}

// takes is what the calls takeAccounts queued answered.
type takes struct {
	ua, tenant   int64 // takeScript results; takeGranted for no tenant call
	attempts     int
	retryAfterMs int64
}

// readTakes reads the answers to takeAccounts' calls and records which
// of them granted their part.
func (d *decision) readTakes(ua, tn *scriptCall) (takes, error) {
	uaCode, attempts, retryAfterMs, uaErr := takeResult(ua)
	tenantCode, _, _, tenantErr := takeResult(tn)
	d.uaGranted = uaErr == nil && uaCode == takeGranted
	d.tenantGranted = tn != nil && tenantErr == nil && tenantCode == takeGranted
	return takes{ua: uaCode, tenant: tenantCode, attempts: attempts, retryAfterMs: retryAfterMs}, errors.Join(uaErr, tenantErr)
}

// compensate gives back, in one more round trip, every part a denied or
// failed decision was granted. Parts Redis did not answer for are left to
// their expiry.
func (d *decision) compensate(parent, ctx context.Context) error {
	b := newBatch(d.s.client)
	if d.uaGranted {
		d.endUserAction(ctx, b, false, 0)
	}
	if d.tenantGranted {
		d.endTenant(ctx, b, false, 0)
	}
	if d.counted {
		b.eval(ctx, uncountScript, []string{d.windowKey}, "p:"+strconv.FormatInt(d.slot, 10))
	}
	if d.r.source != srcNone {
		d.endToken(ctx, b, false)
	}
	d.s.send(parent, ctx, b)
	var errs []error
	for _, c := range b.calls {
		if err := c.cmd.Err(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// endUserAction queues the end of the reservation's share of its user
// action; a release gives back the attempt slot too.
func (d *decision) endUserAction(ctx context.Context, b *batch, settle bool, used int64) *scriptCall {
	return d.endUserActionLost(ctx, b, settle, false, used)
}

// endUserActionLost is endUserAction for a settle that may be of an
// attempt lost with its worker, whose slot is then forgiven.
func (d *decision) endUserActionLost(ctx context.Context, b *batch, settle, lost bool, used int64) *scriptCall {
	return b.eval(ctx, endScript, d.s.keys.userAction(d.r.ua), d.nowMs, d.r.nonce, flag(settle), used, 1, d.r.group, flag(settle && lost))
}

// endTenant queues the end of the reservation's share of its tenant window.
func (d *decision) endTenant(ctx context.Context, b *batch, settle bool, used int64) *scriptCall {
	return b.eval(ctx, endScript, d.s.keys.tenantWindow(d.r.tenant, d.r.winLen, d.r.winAt),
		d.nowMs, d.r.nonce, flag(settle), used, 0, "", 0)
}

// endToken queues the end of the reservation's count in its cohort's
// duplicate-rate window (and reserve token).
func (d *decision) endToken(ctx context.Context, b *batch, settle bool) *scriptCall {
	k := d.s.keys
	return b.eval(ctx, poolEndScript,
		[]string{k.window(d.r.pool, d.r.cohort, d.r.slotMs), k.reserve(d.r.pool), k.poolTokens(d.r.pool)},
		d.nowMs, d.r.nonce, d.r.source, flag(!settle), d.r.slot, idleMs)
}

// windowTTL is how long a window key is kept after its last count: until
// that count's slot has left the window, and a grace period.
func windowTTL(c budgets.DuplicateCeiling) int64 {
	return c.SlotLength().Milliseconds()*int64(c.Slots) + graceMs
}

func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Admit implements budgets.Store in one round trip: the user action's take,
// the tenant's take and the primary's count in its cohort's window are
// pipelined together; a denial
// costs a second round trip that gives back what the others granted.
func (s *Store) Admit(ctx context.Context, req budgets.AdmitRequest) (budgets.Admission, error) {
	parent := ctx
	ctx, cancel, err := s.begin(ctx, "admit", checkRequest(req, "admit request", req.Spend))
	if err != nil {
		return budgets.Admission{}, err
	}
	defer cancel()

	d := s.newDecision(req.UserAction, req.Group, req.Spend.Units())
	slotLen := req.Duplicates.SlotLength()
	d.windowKey = s.keys.window(entityHash(req.Pool), entityHash(req.Window), slotLen.Milliseconds())
	d.slot = budgets.WindowSlot(d.now, slotLen)
	b := newBatch(s.client)
	uaCall, tenantCall := d.takeAccounts(ctx, b, req.Tenant, req.Forgive, req.Attempts, req.Spend)
	count := b.eval(ctx, countScript, []string{d.windowKey}, d.slot, req.Duplicates.Slots, windowTTL(req.Duplicates))
	s.send(parent, ctx, b)

	t, takeErr := d.readTakes(uaCall, tenantCall)
	countErr := count.cmd.Err()
	d.counted = countErr == nil
	if err := errors.Join(takeErr, countErr); err != nil {
		return budgets.Admission{}, d.fail(parent, ctx, "admit", err)
	}

	reason := budgets.ReasonNone
	switch {
	case t.ua == takeAttempts:
		reason = budgets.ReasonAttempts
	case t.ua == takeCeiling:
		reason = budgets.ReasonSpendUserAction
	case t.tenant != takeGranted:
		reason = budgets.ReasonSpendTenant
	}
	if reason != budgets.ReasonNone {
		if err := d.compensate(parent, ctx); err != nil {
			return budgets.Admission{}, failure(parent, "admit: giving back a denied primary's grants", err)
		}
		adm := budgets.Admission{Reason: reason}
		if reason == budgets.ReasonAttempts {
			adm.RetryAfter = time.Duration(t.retryAfterMs) * time.Millisecond
		}
		return adm, nil
	}
	return budgets.Admission{
		Allowed:       true,
		Reservation:   d.r.id(),
		AttemptsUsed:  t.attempts,
		ReservedUnits: d.units,
	}, nil
}

// checkRequest is a decision's check of its request: the request's own
// validation, then checkExact of its spend.
func checkRequest(req interface{ Validate() error }, what string, spend budgets.SpendPolicy) error {
	if err := req.Validate(); err != nil {
		return err
	}
	return checkExact(what, spend)
}

// fail compensates what a decision whose batch partly failed was granted,
// as far as the call's time allows, and returns err as a failure.
func (d *decision) fail(parent, ctx context.Context, op string, err error) error {
	if ctx.Err() == nil {
		if cerr := d.compensate(parent, ctx); cerr != nil {
			err = errors.Join(err, fmt.Errorf("giving back the granted parts: %w", cerr))
		}
	}
	return failure(parent, op, err)
}

// ReserveExtra implements budgets.Store in one round trip: the route's
// flags, the user action's take, the count in the cohort's window (or the
// pool's reserve token) and the tenant's take are
// pipelined together; a denial costs a second round trip that gives back
// what the others granted.
func (s *Store) ReserveExtra(ctx context.Context, req budgets.ExtraRequest) (budgets.Grant, error) {
	parent := ctx
	ctx, cancel, err := s.begin(ctx, "reserve extra", checkRequest(req, "extra request", req.Spend))
	if err != nil {
		return budgets.Grant{}, err
	}
	defer cancel()

	d := s.newDecision(req.UserAction, req.Group, req.Spend.Units())
	b := newBatch(s.client)
	flags := b.pipe.HMGet(ctx, s.keys.routeFlags(entityHash(req.Route)), "q", "p", "e")
	uaCall, tenantCall := d.takeAccounts(ctx, b, req.Tenant, "", req.Attempts, req.Spend)
	poolHash, cohortHash := entityHash(req.Pool), entityHash(req.Window)
	slotLen := req.Duplicates.SlotLength()
	slot := budgets.WindowSlot(d.now, slotLen)
	tokenCall := b.eval(ctx, poolCountScript,
		[]string{s.keys.window(poolHash, cohortHash, slotLen.Milliseconds()), s.keys.reserve(poolHash), s.keys.poolTokens(poolHash)},
		d.nowMs, d.r.nonce, slot, req.Duplicates.Slots,
		budgets.Microtokens(req.Duplicates.Ceiling), budgets.Microtokens(req.Duplicates.ReplacementReserve),
		flag(req.FollowsAnEndedAttempt()),
		budgets.Microtokens(req.Reserve.Capacity), strconv.FormatFloat(req.Reserve.RefillPerSecond*1e6, 'g', -1, 64),
		d.nowMs+millisCeil(req.Spend.ReservationTTL), idleMs, graceMs, windowTTL(req.Duplicates),
		req.Duplicates.BurstSlots, budgets.Microtokens(req.Duplicates.BurstCeiling))
	s.send(parent, ctx, b)

	t, takeErr := d.readTakes(uaCall, tenantCall)
	source, tokenErr := tokenCall.cmd.Int64()
	if tokenErr == nil && source >= srcCohort && source <= srcReplacement {
		d.r.source, d.r.pool, d.r.cohort = int(source), poolHash, cohortHash
		d.r.slotMs, d.r.slot = slotLen.Milliseconds(), slot
	}
	flagVals, flagsErr := flags.Result()
	if err := errors.Join(flagsErr, takeErr, tokenErr); err != nil {
		return budgets.Grant{}, d.fail(parent, ctx, "reserve extra", err)
	}

	reason := budgets.ReasonNone
	switch {
	case d.nowMs < untilField(flagVals, 0):
		reason = budgets.ReasonRouteQuarantined
	case d.nowMs < untilField(flagVals, 1):
		reason = budgets.ReasonRoutePushback
	case d.nowMs < untilField(flagVals, 2):
		reason = budgets.ReasonRouteEjected
	case t.ua == takeAttempts:
		reason = budgets.ReasonAttempts
	case d.r.source == srcNone:
		reason = budgets.ReasonDuplicateRate
	case t.ua == takeCeiling:
		reason = budgets.ReasonSpendUserAction
	case t.tenant != takeGranted:
		reason = budgets.ReasonSpendTenant
	}
	if reason != budgets.ReasonNone {
		if err := d.compensate(parent, ctx); err != nil {
			return budgets.Grant{}, failure(parent, "reserve extra: giving back a denied attempt's grants", err)
		}
		return budgets.Grant{Reason: reason}, nil
	}
	token := budgets.TokenNone
	switch d.r.source {
	case srcCohort:
		token = budgets.TokenCohort
	case srcReserve:
		token = budgets.TokenReserve
	}
	return budgets.Grant{
		Allowed:       true,
		Reservation:   d.r.id(),
		AttemptsUsed:  t.attempts,
		ReservedUnits: d.units,
		Token:         token,
	}, nil
}

// untilField reads field i of an HMGET of route flags as Unix ms (0 when
// absent or unreadable).
func untilField(vals []any, i int) int64 {
	if i >= len(vals) {
		return 0
	}
	s, ok := vals[i].(string)
	if !ok {
		return 0
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// Settle implements budgets.Store in one round trip.
func (s *Store) Settle(ctx context.Context, id budgets.ReservationID, usage schemas.Usage) error {
	return s.EndAll(ctx, []budgets.Ending{{Reservation: id, Usage: usage}})[0]
}

// Release implements budgets.Store in one round trip.
func (s *Store) Release(ctx context.Context, id budgets.ReservationID) error {
	return s.EndAll(ctx, []budgets.Ending{{Reservation: id, Release: true}})[0]
}

// ending is one valid ending of an EndAll batch: calls[first:last] are its
// scripts, ua the user action's, whose answer says whether it was live.
type ending struct {
	index       int
	op          string
	nonce       string
	ua          *scriptCall
	first, last int
}

// EndAll implements budgets.Store in one round trip: every share of every
// reservation — the user action's, the tenant window's and the token's —
// in one batch. Each entity ends its own share at most once; the user
// action's answer decides whether the reservation was live. An ending that
// is invalid on its face (usage, id) fails alone, without a round trip.
func (s *Store) EndAll(ctx context.Context, ends []budgets.Ending) []error {
	errs := make([]error, len(ends))
	setAll := func(err error) []error {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		return errs
	}
	op := func(e budgets.Ending) string {
		if e.Release {
			return "release"
		}
		return "settle"
	}
	if len(ends) == 0 {
		return errs
	}
	if err := ended(ctx, op(ends[0])); err != nil {
		return setAll(err)
	}
	type valid struct {
		ending
		r      reservation
		settle bool
		lost   bool
		used   int64
	}
	checked := make([]valid, 0, len(ends))
	for i, e := range ends {
		used, err := usedUnits(e)
		if err != nil {
			errs[i] = err
			continue
		}
		r, ok := parseReservation(e.Reservation)
		if !ok {
			errs[i] = fmt.Errorf("redisstore: %s: %w", op(e), budgets.ErrUnknownReservation)
			continue
		}
		checked = append(checked, valid{ending: ending{index: i, op: op(e), nonce: r.nonce}, r: r, settle: !e.Release, lost: e.Lost, used: used})
	}
	if len(checked) == 0 {
		return errs
	}
	parent := ctx
	ctx, cancel, err := s.start(ctx, checked[0].op)
	if err != nil {
		return setAll(err)
	}
	defer cancel()

	now := s.now()
	b := newBatch(s.client)
	sent := make([]ending, 0, len(checked))
	for _, v := range checked {
		d := &decision{s: s, r: v.r, now: now, nowMs: now.UnixMilli()}
		en := v.ending
		en.first = len(b.calls)
		en.ua = d.endUserActionLost(ctx, b, v.settle, v.lost, v.used)
		if v.r.tenant != "" {
			d.endTenant(ctx, b, v.settle, v.used)
		}
		if v.r.source != srcNone {
			d.endToken(ctx, b, v.settle)
		}
		en.last = len(b.calls)
		sent = append(sent, en)
	}
	s.send(parent, ctx, b)
	for _, en := range sent {
		var callErrs []error
		for _, c := range b.calls[en.first:en.last] {
			callErrs = append(callErrs, c.cmd.Err())
		}
		switch live, _ := en.ua.cmd.Int64(); {
		case errors.Join(callErrs...) != nil:
			errs[en.index] = failure(parent, en.op+" reservation "+en.nonce, errors.Join(callErrs...))
		case live != 1:
			errs[en.index] = fmt.Errorf("redisstore: %s reservation %s: %w", en.op, en.nonce, budgets.ErrUnknownReservation)
		}
	}
	return errs
}

// usedUnits is what a settle charges (0 for a release), refused when the
// usage is invalid or too large for the scripts to hold exactly.
func usedUnits(e budgets.Ending) (int64, error) {
	if e.Release {
		return 0, nil
	}
	if err := budgets.ValidateUsage(e.Usage); err != nil {
		return 0, fmt.Errorf("settle: %w", err)
	}
	u := e.Usage
	used := u.InputUnits + u.OutputUnits
	if u.InputUnits >= maxExact || u.OutputUnits >= maxExact || used >= maxExact {
		return 0, fmt.Errorf("settle: %w: usage %+v reaches 2^53 units", budgets.ErrInvalidRequest, u)
	}
	return used, nil
}
