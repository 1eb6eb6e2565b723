package dispatcher

import (
	"context"
	"errors"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/schemas"
)

// localReservation prefixes the ids of reservations made while the budget
// store was unreachable: the primary went on, and nothing is settled for it.
const localReservation = "local:"

// settleLost settles the reservation of an attempt lost with its worker,
// forgiving its ledger slot, in one store call on the group's goroutine
// (bounded like bookkeeping's): queued behind other groups' endings, it
// could reach the store after the caller's retry was refused.
func (g *group) settleLost(end budgets.Ending) {
	ctx, cancel := context.WithTimeout(context.Background(), bookkeepingTimeout)
	defer cancel()
	if err := g.d.store.EndAll(ctx, []budgets.Ending{end})[0]; err != nil {
		g.d.log.Warn("settle of a lost attempt failed", "group", g.id, "err", err)
	}
}

// reasonBudgetInvalid is the denial reason when the budget store refused a
// decision's figures as invalid (budgets.ErrInvalidRequest): never read as
// the store being unavailable, which would let the attempt run unceilinged.
const reasonBudgetInvalid = "budget_invalid"

// reasonTooLongToContinue refuses a continuation of a stream whose text is
// over schemas.MaxContinuationBytes.
const reasonTooLongToContinue = "too_long_to_continue"

func (g *group) admit(ctx context.Context) hedge.Event {
	d := g.d
	if g.primary == "" { // picked as the group started (startEvent)
		return hedge.Admitted{Allowed: false, Reason: reasonNoRoute, Error: schemas.ErrNoRoute}
	}
	p := g.class.Policy
	adm, err := d.store.Admit(ctx, budgets.AdmitRequest{
		UserAction: g.ua, Tenant: g.sub.Tenant, Pool: g.sub.Pool, Window: g.window,
		// A takeover forgives the ledger slots its dead predecessor holds
		// (docs/architecture.md §2, §7).
		Group: g.id, Forgive: g.sub.Supersedes, Local: g.localUserAction(),
		Attempts:   budgets.AttemptPolicy{Max: p.MaxAttempts, TTL: 2 * g.deadline},
		Spend:      g.spend(),
		Duplicates: p.DuplicateCeiling(),
	})
	switch {
	case errors.Is(err, budgets.ErrInvalidRequest):
		// The store refused the figures themselves (a spend estimate out
		// of its range): the store works, so running on without it would
		// run with no ceiling. The request fails instead.
		d.log.Warn("budget store refused the admission as invalid", "err", err)
		return hedge.Admitted{Allowed: false, Reason: reasonBudgetInvalid, Error: schemas.ErrInvalidRequest}
	case err != nil:
		// The primary goes on without the store; hedges will be refused.
		d.log.Warn("budget store unavailable at admission", "err", err)
		return g.placePrimary(hedge.ReservationID(localReservation + g.id))
	case !adm.Allowed:
		g.denied, g.ledgerAfter = adm.Reason, adm.RetryAfter
		return hedge.Admitted{Allowed: false, Reason: string(adm.Reason), Error: schemas.ErrBudgetExhausted}
	}
	// The route's capacity is spent after the store admitted the primary,
	// so a request the budgets refuse never spends a provider key's limit
	// (docs/architecture.md §7, "Route capacity").
	return g.placePrimary(hedge.ReservationID(adm.Reservation))
}

// localUserAction reports whether no other gateway can know the group's
// user action: the caller sent no Idempotency-Key, so the action is this
// group alone, and a gateway's store may decide it without the region's
// (budgets.AdmitRequest.Local, docs/architecture.md §7 "Slices").
func (g *group) localUserAction() bool {
	return g.sub.IdempotencyKey == "" && g.sub.Supersedes == ""
}

func (g *group) spend() budgets.SpendPolicy {
	p := g.class.Policy
	out := int64(g.sub.Request.MaxTokens)
	if out == 0 && g.sub.Request.Embedding == nil { // an embedding has no output
		out = g.class.OutputEstimate(g.cohort.Key())
	}
	s := budgets.SpendPolicy{
		InputUnits:        estimateInput(g.sub.Request),
		OutputUnits:       out,
		UserActionCeiling: p.Spend.PerUserAction,
		TenantCeiling:     p.Spend.PerTenantWindow,
		TenantWindow:      p.Spend.Window,
		ReservationTTL:    2 * g.deadline,
	}
	if t := g.d.tenants[g.sub.Tenant]; t != nil && t.SpendLimit > 0 {
		// The tenant's own limit spans every class; it replaces the policy's.
		s.TenantCeiling, s.TenantWindow = t.SpendLimit, t.SpendWindow
	}
	if s.TenantCeiling > 0 && g.sub.Tenant == "" {
		s.TenantCeiling = 0
	}
	return s
}

func (g *group) askBudget(ctx context.Context, a hedge.AskHedgeBudget) hedge.Event {
	d := g.d
	// A continuation stands in for the committed stream's broken attempt:
	// no load beyond what the stream needs, so saturation does not refuse it.
	if reason := g.refuseIntoSaturation(); reason != "" && a.Role != schemas.RoleContinuation {
		return hedge.HedgeBudgetDecided{Allowed: false, Reason: reason}
	}
	if a.Role == schemas.RoleContinuation && g.relayed.Len() > schemas.MaxContinuationBytes {
		// More text than an attempt may carry to continue from (§8).
		return hedge.HedgeBudgetDecided{Allowed: false, Reason: reasonTooLongToContinue}
	}
	if a.Role == schemas.RoleHedge && g.class.Policy.PushbackScope != policy.PushbackRoute && d.picker.PushedBack(g.routes, d.now()) {
		// A route of the pool pushed back since the group started: its
		// cohort is primary-only until the Retry-After passes (§4 rule 4).
		// A replacement may still go to a route not in pushback.
		return hedge.HedgeBudgetDecided{Allowed: false, Reason: reasonCohortPushback}
	}
	d.rngMu.Lock()
	target, ok := d.picker.PickHedge(g.candidates(a.Role), a.Exclude, d.now(), d.rng, a.SameRoute)
	d.rngMu.Unlock()
	if !ok {
		return hedge.HedgeBudgetDecided{Allowed: false, Reason: reasonNoRoute}
	}
	p := g.class.Policy
	attempts := p.MaxAttempts
	if a.Role == schemas.RoleContinuation {
		// A continuation may go beyond max_attempts, up to rescue.max.
		attempts += g.d.pools[g.sub.Pool].Rescue
	}
	grant, err := d.store.ReserveExtra(ctx, budgets.ExtraRequest{
		Role: a.Role, UserAction: g.ua, Group: g.id, Tenant: g.sub.Tenant, Route: target, Pool: g.sub.Pool, Window: g.window,
		Local:      g.localUserAction(),
		Attempts:   budgets.AttemptPolicy{Max: attempts, TTL: 2 * g.deadline},
		Spend:      g.spend(),
		Duplicates: p.DuplicateCeiling(),
		Reserve:    p.ReserveBucket(),
	})
	switch {
	case errors.Is(err, budgets.ErrInvalidRequest):
		return hedge.HedgeBudgetDecided{Allowed: false, Reason: reasonBudgetInvalid}
	case err != nil:
		return hedge.HedgeBudgetDecided{Allowed: false, Reason: reasonBudgetUnavailable}
	case !grant.Allowed:
		return hedge.HedgeBudgetDecided{Allowed: false, Reason: string(grant.Reason)}
	}
	// Granted: the target's capacity next (capacity.go), so a refused
	// budget never spends a provider key's limit.
	return g.placeExtra(a, target, hedge.ReservationID(grant.Reservation))
}

// candidates are the routes an extra attempt of role may go to: a
// continuation only to a route that continues an answer (Pool.Continues).
func (g *group) candidates(role schemas.Role) []string {
	if role == schemas.RoleContinuation {
		return g.continues
	}
	return g.routes
}
