package hedge

// Reasons the engine itself gives in HedgeSuppressed and
// GroupEnded.HedgeSuppressed. A driver adds its own: Start.NotEligibleReason
// and HedgeBudgetDecided.Reason are passed through as given.
const (
	// ReasonNotAdmitted: the primary was not admitted, so nothing could hedge.
	ReasonNotAdmitted = "not_admitted"
	// ReasonNotEligible: the group was not eligible and the driver gave no reason.
	ReasonNotEligible = "not_eligible"
	// ReasonDelayPastDeadline: the hedge delay ends too close to the deadline
	// for a hedge to be of use; no hedge timer was armed.
	ReasonDelayPastDeadline = "delay_past_deadline"
	// ReasonValidResult: an attempt holds an answer being elected or valid so far.
	ReasonValidResult = "valid_result"
	// ReasonNotStalled: the first_byte trigger fired after the primary's
	// first byte: a long answer, not a stall.
	ReasonNotStalled = "not_stalled"
	// ReasonDecided: the group was decided while the budget was asked.
	ReasonDecided = "decided"
	// ReasonNothingToHedge: no attempt is running.
	ReasonNothingToHedge = "nothing_to_hedge"
	// ReasonReplacementPending: a budget request is already in flight.
	ReasonReplacementPending = "replacement_pending"
	// ReasonOverloaded: the pool is saturated (a worker answered Busy).
	ReasonOverloaded = "overloaded"
	// ReasonRouteCapacity: the driver found no route of the pool with
	// capacity left for the attempt (a provider key's published limits,
	// docs/architecture.md §7 "Route capacity"). Like ReasonOverloaded, a
	// group left with nothing because its replacement was refused for it
	// fails overloaded: its routes are full, not failed.
	ReasonRouteCapacity = "route_capacity"
	// ReasonPushback: an attempt of the group met a provider's pushback.
	ReasonPushback = "pushback"
	// ReasonNoTime: less than the minimum useful time is left before the deadline.
	ReasonNoTime = "no_time"
	// ReasonNoSlot: every attempt slot of the group is taken.
	ReasonNoSlot = "no_slot"
	// ReasonBudget: the driver refused the budget and gave no reason.
	ReasonBudget = "budget"
)

// SuppressionReasons are the engine's own suppression reasons, so a driver
// can create a metric's label set for each before the first is counted.
func SuppressionReasons() []string {
	return []string{ReasonNotAdmitted, ReasonNotEligible, ReasonDelayPastDeadline, ReasonValidResult,
		ReasonNotStalled, ReasonDecided, ReasonNothingToHedge, ReasonReplacementPending, ReasonOverloaded, ReasonRouteCapacity, ReasonPushback, ReasonNoTime,
		ReasonNoSlot, ReasonBudget}
}
