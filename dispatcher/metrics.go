package dispatcher

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/schemas"
)

// metrics are the dispatcher's part of docs/architecture.md §9, prefix hedgerow_.
type metrics struct {
	groups        *prometheus.CounterVec
	inFlight      prometheus.Gauge
	groupDuration prometheus.Histogram
	firstByte     prometheus.Histogram
	attempts      *prometheus.CounterVec
	hedges        prometheus.Counter
	suppressed    *prometheus.CounterVec
	rescues       *prometheus.CounterVec
	wins          *prometheus.CounterVec
	hedgeDelay    prometheus.Histogram
	usage         *prometheus.CounterVec
	late          prometheus.Counter
	cancellations *prometheus.CounterVec
	// cancelDispatch is the dispatcher's part of a race's cancel path
	// (docs/architecture.md §12, "Cancels").
	cancelDispatch prometheus.Histogram
	routeState     *prometheus.GaugeVec
	routeMarks     *prometheus.CounterVec
	// Route health (docs/architecture.md §5).
	ejections        *prometheus.CounterVec
	ejectionsSkipped *prometheus.CounterVec
	gateDegraded     prometheus.Counter
	gateRefused      prometheus.Counter
	superseded       prometheus.Counter
	// Ceiling breaches reported to the guardrail (docs/architecture.md §5).
	breaches *prometheus.CounterVec
	// Busy is backpressure (docs/architecture.md §4 rule 4).
	busy      *prometheus.CounterVec
	reoffers  *prometheus.CounterVec
	saturated *prometheus.GaugeVec
	// Offers NATS found no worker for (docs/architecture.md §4 rule 4).
	unserved *prometheus.CounterVec
	// Replies not taken for an attempt (docs/architecture.md §8).
	repliesDropped *prometheus.CounterVec
	// Takes of a route's capacity refused (docs/architecture.md §7, "Route capacity").
	capacityRefused *prometheus.CounterVec
}

// schemaCacheStats is what the metrics read of the dispatcher's
// arbiter.SchemaCache.
type schemaCacheStats interface {
	Bytes() int64
	Entries() int
}

func newMetrics(reg prometheus.Registerer, schemas schemaCacheStats) (*metrics, error) {
	latency := prometheus.ExponentialBuckets(0.01, 1.6, 20)
	m := &metrics{
		groups: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_groups_total",
			Help: "Hedge groups ended, by outcome (committed or the stable error)."}, []string{"outcome"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hedgerow_groups_in_flight",
			Help: "Hedge groups this gateway runs now, streams included: what its autoscaler scales on (CPU undercounts long, idle streams)."}),
		groupDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hedgerow_group_duration_seconds",
			Help: "Time from a group's start to its commit.", Buckets: latency}),
		firstByte: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hedgerow_first_byte_seconds",
			Help: "Time from an attempt's launch to the provider's first byte.", Buckets: latency}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_attempts_total",
			Help: "Attempts launched, by role."}, []string{"role"}),
		hedges: prometheus.NewCounter(prometheus.CounterOpts{Name: "hedgerow_hedges_launched_total",
			Help: "Hedges launched."}),
		suppressed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_hedges_suppressed_total",
			Help: "Hedges and replacements considered and not launched, by reason."}, []string{"reason"}),
		rescues: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_rescues_total",
			Help: "Continuation attempts of committed streams that broke, by outcome: started; won (spliced into the stream); original_won (the stalled attempt resumed first); failed."}, []string{"outcome"}),
		wins: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_wins_total",
			Help: "Committed winners, by role."}, []string{"role"}),
		hedgeDelay: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hedgerow_hedge_delay_seconds",
			Help: "Hedge delays armed.", Buckets: latency}),
		usage: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_usage_units_total",
			Help: "Usage units of every attempt, winners and losers, by role and kind."}, []string{"role", "kind"}),
		late: prometheus.NewCounter(prometheus.CounterOpts{Name: "hedgerow_late_completions_total",
			Help: "Losers that completed after their group was decided."}),
		cancellations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_cancellations_total",
			Help: "Cancels sent, by whether the worker confirmed them."}, []string{"observed"}),
		cancelDispatch: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hedgerow_cancel_dispatch_seconds",
			Help:    "Time from the arrival of the reply that decided a race to the loser's cancel published.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16)}), // 50 µs … ~1.6 s
		routeState: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hedgerow_route_state",
			Help: "1 for the state in force of each route (healthy, pushback, quarantined, ejected), 0 for the others; as this replica sees the shared flags."}, []string{"route", "state"}),
		routeMarks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_route_marks_total",
			Help: "Route flags this replica set, by state (pushback, quarantined, ejected)."}, []string{"route", "state"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_route_ejections_total",
			Help: "Routes this replica ejected (outlier ejection), by reason (consecutive_failures, failure_rate, probe_failed)."}, []string{"route", "reason"}),
		ejectionsSkipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_route_ejections_skipped_total",
			Help: "Ejections the outlier detection asked for that a pool could not spare (its last healthy route, or past max_ejected_percent)."}, []string{"route"}),
		gateDegraded: prometheus.NewCounter(prometheus.CounterOpts{Name: "hedgerow_gate_degraded_total",
			Help: "Elections decided locally because the shared gate was unreachable."}),
		gateRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: "hedgerow_gate_refused_total",
			Help: "Elections no gate store could decide (gate.on_unavailable refuse, or fallback with the ledger down too): the group failed gate_unavailable."}),
		superseded: prometheus.NewCounter(prometheus.CounterOpts{Name: "hedgerow_gate_superseded_total",
			Help: "Winner gate holdings of orphaned requests (their gateway died mid-flight, no answer kept) cleared by a retry's takeover."}),
		breaches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_guardrail_breaches_total",
			Help: "Ceiling breaches this replica reported to a cohort's guardrail, which switched hedging off, by reason (duplicate_ceiling, spend_ceiling)."}, []string{"reason"}),
		busy: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_busy_total",
			Help: "Offers a worker refused at its in-flight limit (Busy), by pool."}, []string{"pool"}),
		reoffers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_reoffers_total",
			Help: "Refused attempts offered again (same attempt, no new slot), by pool."}, []string{"pool"}),
		unserved: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_attempts_unserved_total",
			Help: "Offers of attempts that found no worker on their route (NATS had no responders), by route; each marks the route so the next picks go elsewhere."}, []string{"route"}),
		saturated: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hedgerow_pool_saturated",
			Help: "1 while the pool's last offer came back Busy: no hedge or replacement goes to it."}, []string{"pool"}),
		repliesDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_replies_dropped_total",
			Help: "Messages on reply inboxes not taken for an attempt, by reason: unknown_inbox (a late reply of an ended group, or a guess), malformed, attempt, group, secret, worker (not what the attempt's worker would send: forged or misrouted), status (a no-responders status after an accept), overflow (the group's queue was full)."}, []string{"reason"}),
		capacityRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_route_capacity_refusals_total",
			Help: "Attempts a route's published limit could not take now (its slice of requests_per_minute or tokens_per_minute spent), by route and limit (requests, tokens): each goes to another route, waits, or is refused."}, []string{"route", "limit"}),
	}
	if reg == nil {
		return m, nil
	}
	// The compiled callers' schemas this dispatcher keeps, as measured
	// (docs/architecture.md §6).
	schemaBytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "hedgerow_schema_cache_bytes",
		Help: "Measured size of the compiled response_format schemas kept, bounded by schema_cache.max_bytes."},
		func() float64 { return float64(schemas.Bytes()) })
	schemaEntries := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "hedgerow_schema_cache_entries",
		Help: "Compiled response_format schemas kept, bounded by schema_cache.max_entries."},
		func() float64 { return float64(schemas.Entries()) })
	for _, c := range []prometheus.Collector{schemaBytes, schemaEntries, m.groups, m.inFlight, m.groupDuration, m.firstByte, m.attempts, m.hedges, m.suppressed, m.rescues,
		m.wins, m.hedgeDelay, m.usage, m.late, m.cancellations, m.cancelDispatch, m.routeState, m.routeMarks, m.ejections, m.ejectionsSkipped,
		m.gateDegraded, m.gateRefused, m.superseded, m.breaches,
		m.busy, m.reoffers, m.saturated, m.unserved, m.repliesDropped, m.capacityRefused} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("dispatcher: metrics: %w", err)
		}
	}
	return m, nil
}

// createLabelSets creates, at zero, every label set whose values are known
// before the first request, so a dashboard or an alert finds each series
// from the start (an absent series reads as "no data", not as 0).
func (m *metrics) createLabelSets(pools, routes []string) {
	for _, r := range suppressionReasons() {
		m.suppressed.WithLabelValues(r)
	}
	for _, r := range []delay.GuardrailReason{delay.ReasonDuplicateCeiling, delay.ReasonSpendCeiling} {
		m.breaches.WithLabelValues(string(r))
	}
	m.groups.WithLabelValues("committed")
	for _, o := range []string{rescueStarted, rescueWon, rescueOriginalWon, rescueFailed} {
		m.rescues.WithLabelValues(o)
	}
	for _, role := range []schemas.Role{schemas.RolePrimary, schemas.RoleHedge, schemas.RoleReplacement, schemas.RoleContinuation} {
		m.attempts.WithLabelValues(string(role))
		m.wins.WithLabelValues(string(role))
		m.usage.WithLabelValues(string(role), "input")
		m.usage.WithLabelValues(string(role), "output")
	}
	for _, observed := range []bool{false, true} {
		m.cancellations.WithLabelValues(strconv.FormatBool(observed))
	}
	for _, r := range []string{dropUnknownInbox, dropMalformed, dropAttempt, dropGroup, dropSecret, dropWorker, dropStatus, dropOverflow} {
		m.repliesDropped.WithLabelValues(r)
	}
	for _, r := range routes {
		m.unserved.WithLabelValues(r)
	}
	for _, p := range pools {
		m.busy.WithLabelValues(p)
		m.reoffers.WithLabelValues(p)
		m.saturated.WithLabelValues(p)
	}
}
