package schemas

import (
	"encoding/json"
	"strconv"
	"time"
)

// Record events, the "event" field of the sanitized records published on
// hedgerow.events.attempt and hedgerow.events.group and kept under
// StoredRecordPrefix; a SupersededRecord is kept only.
const (
	EventAttemptComplete = "hedge_attempt_complete"
	EventGroupComplete   = "hedge_group_complete"
	// EventGroupCommitted marks a group's record kept at its commit,
	// before its answer left the dispatcher (docs/architecture.md §9): the
	// group's hedge_group_complete record replaces it in the stream. Its
	// usage and loser fields cover the attempts ended by the commit; one
	// still in the stream says the dispatcher stopped before the group
	// ended.
	EventGroupCommitted = "hedge_group_committed"
	// EventGroupSuperseded marks a committed group whose winner gate
	// holding a takeover cleared: its gateway died with no answer kept, so
	// its commit reached no caller whole and the takeover's group answers
	// the user action instead (docs/architecture.md §2, §9). It is a
	// record of its own (SupersededRecord), kept beside the group's
	// record, which stays in the stream with its usage.
	EventGroupSuperseded = "hedge_group_superseded"
)

// StoredRecordPrefix heads the subjects records are kept on: one logical
// subject per attempt and per group, of which a reader keeps the latest
// record, whether the record came in a batch message or on that subject
// itself (docs/architecture.md §8, §9).
const StoredRecordPrefix = "hedgerow.records."

// StoredGroupSubject is the subject group's record is kept on.
func StoredGroupSubject(group string) string { return StoredRecordPrefix + "group." + group }

// StoredGroupID is the message id of group's record for event, as a
// stream of one message per record (before batches) kept it.
func StoredGroupID(group, event string) string { return group + ":" + event }

// StoredSupersededSubject is the subject the SupersededRecord of group, a
// superseded commit, is kept on: a subject of its own, so the record does
// not replace the group's own record and its usage (docs/architecture.md §9).
func StoredSupersededSubject(group string) string { return StoredRecordPrefix + "superseded." + group }

// StoredSupersededID is the message id of group's SupersededRecord.
func StoredSupersededID(group string) string { return group + ":" + EventGroupSuperseded }

// StoredAttemptSubject is the subject attempt n of group is kept on.
func StoredAttemptSubject(group string, n int) string {
	return StoredRecordPrefix + "attempt." + group + "." + strconv.Itoa(n)
}

// StoredAttemptID is the message id of attempt n's record.
func StoredAttemptID(group string, n int) string { return group + ":" + strconv.Itoa(n) }

// Outcome is how one launched attempt ended relative to its group. A hedge
// that was never launched has no attempt record; its suppression reason is
// on the group record.
type Outcome string

const (
	// OutcomeWinner: the attempt was elected and committed.
	OutcomeWinner Outcome = "winner"
	// OutcomeLoserCanceled: another attempt won and this one stopped on the
	// cancel (the worker observed it before completing).
	OutcomeLoserCanceled Outcome = "loser_canceled"
	// OutcomeLoserLate: another attempt won, but this one completed anyway,
	// after the commit or despite the cancel: recorded, never committed.
	OutcomeLoserLate Outcome = "loser_late"
	// OutcomeLostElection: a valid result that lost the winner gate to
	// another group of the same user action.
	OutcomeLostElection Outcome = "lost_election"
	// OutcomeFailed: the attempt ended with its own error (any scope).
	OutcomeFailed Outcome = "failed"
	// OutcomeCanceled: cancelled because the group ended without a winner
	// (deadline, caller gone, group-scoped error).
	OutcomeCanceled Outcome = "canceled"
	// OutcomeCompleted: reported by a worker only, for an attempt that ran
	// to a complete answer with no cancel reaching it. A worker cannot know
	// whether its answer won; the dispatcher's record of the same attempt
	// says winner, loser_late or lost_election.
	OutcomeCompleted Outcome = "completed"
)

// GroupOutcome is how a hedge group ended.
type GroupOutcome string

// The group outcomes.
const (
	GroupCommitted GroupOutcome = "committed"
	GroupFailed    GroupOutcome = "failed" // see the record's ErrorCode
)

// CostBand is a coarse bucket of an attempt's or group's cost, so records
// show spend without exact per-request prices.
type CostBand string

// The cost bands, from the cost in usage units (input + 4 × output at the
// pinned list-price ratio); the thresholds belong to the recorder's config.
const (
	CostLow    CostBand = "low"
	CostMedium CostBand = "medium"
	CostHigh   CostBand = "high"
)

// Thresholds of CostBandOf, in cost units (input + 4 × output).
const (
	CostMediumFrom = 4_000
	CostHighFrom   = 40_000
)

// CostBandOf buckets usage at the pinned list-price ratio (input × 1 +
// output × 4, docs/architecture.md §11): low below CostMediumFrom, high from CostHighFrom.
// With the workload's median request (≈750 input, ≈150 output tokens) a
// single attempt is low; a long answer to a long prompt is medium. Workers
// and dispatchers band with it alike, so their records agree.
func CostBandOf(u Usage) CostBand {
	cost := u.InputUnits + 4*u.OutputUnits
	switch {
	case cost >= CostHighFrom:
		return CostHigh
	case cost >= CostMediumFrom:
		return CostMedium
	}
	return CostLow
}

// GuardrailDecision is what the cohort's hedging guardrail decided for a group.
type GuardrailDecision string

const (
	// GuardrailAllow: hedging enabled for the cohort.
	GuardrailAllow GuardrailDecision = "allow"
	// GuardrailDisable: the guardrail disabled hedging (flat gain, rising
	// errors, or a breached duplicate or spend ceiling).
	GuardrailDisable GuardrailDecision = "disable"
	// GuardrailProbe: hedging is disabled but this group probes re-enabling it.
	GuardrailProbe GuardrailDecision = "probe"
	// GuardrailControl: the group is in the primary-only control fraction.
	GuardrailControl GuardrailDecision = "control"
	// GuardrailIneligible: the cohort is not hedge-eligible (non-idempotent
	// operation, outside the rollout fraction, fewer than two routes).
	GuardrailIneligible GuardrailDecision = "ineligible"
	// GuardrailPushback: a route of the group's pool was in pushback (a
	// provider's 429, 529 or 503 with Retry-After) when it started, and its
	// class's pushback scope is cohort: the group ran primary-only.
	GuardrailPushback GuardrailDecision = "pushback"
)

// Reporter names who published a record. Workers publish their attempt's
// record live (never kept: the dispatcher's record of the attempt, built
// from the same result, is the authoritative one, docs/architecture.md §9);
// the dispatcher publishes attempt and group records; the simulator
// publishes both in virtual time.
type Reporter string

// The reporters.
const (
	ReporterWorker     Reporter = "worker"
	ReporterDispatcher Reporter = "dispatcher"
	ReporterSimulator  Reporter = "simulator"
)

// AttemptRecord is the sanitized record of one launched attempt (docs/architecture.md §9).
// It carries no prompt, output, header, credential or user identifier:
// UserActionID is the gateway's opaque derived id and PromptFingerprint a
// keyed hash.
type AttemptRecord struct {
	V         int       `json:"v"`
	Event     string    `json:"event"` // EventAttemptComplete; set by MarshalJSON when empty
	EventTime time.Time `json:"event_time"`
	Reporter  Reporter  `json:"reporter"`

	UserActionID   string      `json:"user_action_id"`
	HedgeGroupID   string      `json:"hedge_group_id"`
	Attempt        int         `json:"attempt"`
	Role           Role        `json:"role"`
	Route          string      `json:"route"`
	RouteClass     string      `json:"route_class"` // the pool of equivalent routes
	OperationClass string      `json:"operation_class"`
	ModelClass     string      `json:"model_class"`
	CommitPoint    CommitPoint `json:"commit_point"`
	WorkerID       string      `json:"worker_id,omitempty"`
	// Region is the deployment region of the gateway whose dispatcher
	// kept the record (deployment.region, docs/architecture.md §14): an
	// operator's label, so a report can be read per region. Absent in a
	// deployment of one region, whose records are as they were before
	// regions (additive in v1). A worker's own record carries none.
	Region string `json:"region,omitempty"`
	// ContinuedFromUnits is, on a continuation's record kept by the
	// dispatcher, the output units (tokens) of the committed stream it continued from
	// (docs/architecture.md §6, "Rescue"); absent on other records.
	ContinuedFromUnits int64 `json:"continued_from_units,omitempty"`

	HedgeDelayMs      *int64 `json:"hedge_delay_ms,omitempty"` // absent: no hedge timer armed
	OverallDeadlineMs int64  `json:"overall_deadline_ms"`
	ElapsedMs         int64  `json:"elapsed_ms"`
	FirstByteMs       *int64 `json:"first_byte_ms,omitempty"` // absent: no first byte

	Outcome              Outcome     `json:"outcome"`
	StatusClass          StatusClass `json:"status_class"`
	ErrorScope           ErrorScope  `json:"error_scope"`
	HTTPStatus           int         `json:"http_status,omitempty"`
	ContractValid        bool        `json:"contract_valid"`
	CancellationSent     bool        `json:"cancellation_sent"`
	CancellationObserved bool        `json:"cancellation_observed"`

	UsageInputUnits     int64    `json:"usage_input_units"`
	UsageOutputUnits    int64    `json:"usage_output_units"`
	UsageEstimated      bool     `json:"usage_estimated"`
	CostBand            CostBand `json:"cost_band"`
	DuplicateRateWindow float64  `json:"duplicate_rate_window"` // cohort's hedges per primary, rolling window
	PromptFingerprint   string   `json:"prompt_fingerprint"`
}

// Kind names the record's schema.
func (AttemptRecord) Kind() string { return KindAttemptRecord }

// MarshalJSON writes the record with its major version and event.
func (r AttemptRecord) MarshalJSON() ([]byte, error) {
	type wire AttemptRecord
	w := wire(r)
	w.V = stampVersion(r.V)
	if w.Event == "" {
		w.Event = EventAttemptComplete
	}
	return json.Marshal(w)
}

// GroupRecord is the sanitized summary of one hedge group (docs/architecture.md §9): the
// attempt record's group-level fields plus whether a hedge launched, which
// attempt won, whether a loser finished late, total usage of all attempts,
// the terminal error and the guardrail decision.
type GroupRecord struct {
	V         int       `json:"v"`
	Event     string    `json:"event"` // EventGroupComplete; set by MarshalJSON when empty
	EventTime time.Time `json:"event_time"`
	Reporter  Reporter  `json:"reporter"`

	UserActionID   string      `json:"user_action_id"`
	HedgeGroupID   string      `json:"hedge_group_id"`
	RouteClass     string      `json:"route_class"`
	OperationClass string      `json:"operation_class"`
	ModelClass     string      `json:"model_class"`
	CommitPoint    CommitPoint `json:"commit_point"`
	Stream         bool        `json:"stream"`
	// Region is the deployment region of the gateway that ran the group
	// (deployment.region, docs/architecture.md §14), by which `hedgerow
	// report` breaks its figures down; absent in a deployment of one
	// region (additive in v1).
	Region string `json:"region,omitempty"`

	HedgeDelayMs      *int64 `json:"hedge_delay_ms,omitempty"`
	OverallDeadlineMs int64  `json:"overall_deadline_ms"`
	ElapsedMs         int64  `json:"elapsed_ms"`
	FirstByteMs       *int64 `json:"first_byte_ms,omitempty"` // the committed stream's
	// CommittedUnixMs is the wall-clock instant of the commit, unix
	// milliseconds; absent for a failed group. Losers' cancellations are
	// measured from it (commit → upstream disconnect).
	CommittedUnixMs int64 `json:"committed_unix_ms,omitempty"`

	Outcome     GroupOutcome `json:"outcome"`
	StatusClass StatusClass  `json:"status_class"` // the winner's, or the terminal failure's
	ErrorCode   ErrorCode    `json:"error_code,omitempty"`
	ErrorScope  ErrorScope   `json:"error_scope"`

	Attempts              int    `json:"attempts"` // launched, primary included
	HedgeLaunched         bool   `json:"hedge_launched"`
	HedgeSuppressedReason string `json:"hedge_suppressed_reason,omitempty"`
	WinnerAttempt         int    `json:"winner_attempt,omitempty"`
	WinnerRole            Role   `json:"winner_role,omitempty"`
	WinnerRoute           string `json:"winner_route,omitempty"`
	GateEpoch             int64  `json:"gate_epoch,omitempty"`
	// Supersedes names the orphaned group of the same user action whose
	// winner gate holding this group, a takeover, cleared before it
	// claimed (docs/architecture.md §2); that group's SupersededRecord
	// names this one back. Absent when the group superseded nothing.
	Supersedes        string `json:"supersedes,omitempty"`
	LoserFinishedLate bool   `json:"loser_finished_late"`

	UsageInputUnits     int64             `json:"usage_input_units"` // all attempts
	UsageOutputUnits    int64             `json:"usage_output_units"`
	UsageEstimated      bool              `json:"usage_estimated"`
	CostBand            CostBand          `json:"cost_band"`
	DuplicateRateWindow float64           `json:"duplicate_rate_window"`
	PromptFingerprint   string            `json:"prompt_fingerprint"`
	GuardrailDecision   GuardrailDecision `json:"guardrail_decision"`
	// ControlBaselineMs is, for a control group (guardrail_decision
	// control), the latency this record would show had the group run
	// primary-only, read as ElapsedMs and FirstByteMs are: to its
	// baseline's first byte for a stream that had one, else to the
	// baseline's commit point, the deadline when it would have failed
	// (docs/architecture.md §5). A control group hedges; its baseline —
	// the primary, or the replacement that took its place before the
	// hedge — runs on past another attempt's commit, unseen by the
	// caller. Absent for other groups, and when the baseline failed on
	// its own after the hedge launched (what the primary-only group would
	// have done then is unknown).
	ControlBaselineMs *int64 `json:"control_baseline_ms,omitempty"`
}

// Kind names the record's schema.
func (GroupRecord) Kind() string { return KindGroupRecord }

// MarshalJSON writes the record with its major version and event.
func (r GroupRecord) MarshalJSON() ([]byte, error) {
	type wire GroupRecord
	w := wire(r)
	w.V = stampVersion(r.V)
	if w.Event == "" {
		w.Event = EventGroupComplete
	}
	return json.Marshal(w)
}

// SupersededRecord says a committed group was superseded
// (docs/architecture.md §2, §9): a takeover of its user action found its
// commit orphaned — its gateway died, no answer kept — and cleared its
// winner gate holding, compare-and-delete, so that its own group could
// commit. The superseded group's record stays in the stream as it was
// (its attempts' usage was paid); this record, on a subject of its own
// (StoredSupersededSubject), marks it so a reader counts one commit per
// user action. Like every record it carries no prompt, output, header,
// credential or user identifier.
type SupersededRecord struct {
	V         int       `json:"v"`
	Event     string    `json:"event"` // EventGroupSuperseded; set by MarshalJSON when empty
	EventTime time.Time `json:"event_time"`
	Reporter  Reporter  `json:"reporter"`

	UserActionID string `json:"user_action_id"`
	// HedgeGroupID is the superseded group; WinnerAttempt and GateEpoch
	// are its holding as the gate value named them: the epoch fenced off,
	// which an effect executor must refuse once it saw a higher one
	// (docs/architecture.md §6).
	HedgeGroupID  string `json:"hedge_group_id"`
	WinnerAttempt int    `json:"winner_attempt"`
	GateEpoch     int64  `json:"gate_epoch"`
	// SupersededBy is the takeover's group, which cleared the holding;
	// its group record names this group in Supersedes.
	SupersededBy string `json:"superseded_by"`
}

// Kind names the record's schema.
func (SupersededRecord) Kind() string { return KindSupersededRecord }

// MarshalJSON writes the record with its major version and event.
func (r SupersededRecord) MarshalJSON() ([]byte, error) {
	type wire SupersededRecord
	w := wire(r)
	w.V = stampVersion(r.V)
	if w.Event == "" {
		w.Event = EventGroupSuperseded
	}
	return json.Marshal(w)
}

// Millis converts d to whole milliseconds for the optional *_ms fields.
func Millis(d time.Duration) *int64 {
	ms := d.Milliseconds()
	return &ms
}
