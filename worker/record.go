package worker

import (
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// publishRecord publishes the attempt's sanitized record on
// schemas.AttemptRecordSubject, live only: the authoritative record of the
// attempt, the one kept in the records stream, is its dispatcher's, which
// takes the same usage from the attempt's result (docs/architecture.md §9).
// It holds ids, classes, times and counts only.
func (r *attemptRun) publishRecord(res schemas.AttemptResult, usage schemas.Usage, cancelAt time.Time, reason schemas.CancelReason) {
	cfg := &r.w.cfg
	fp, err := r.att.Request.Fingerprint(cfg.FingerprintKey)
	if err != nil {
		// A request that decoded always re-encodes; keep the record valid.
		fp = schemas.PromptFingerprint(cfg.FingerprintKey, nil)
		r.w.log.Warn("prompt fingerprint failed", "group_id", r.att.GroupID, "attempt", r.att.Attempt, "error", err)
	}
	rec := schemas.AttemptRecord{
		EventTime:    cfg.Now().UTC(),
		Reporter:     schemas.ReporterWorker,
		UserActionID: r.att.UserActionID,
		HedgeGroupID: r.att.GroupID,
		Attempt:      r.att.Attempt,
		Role:         r.att.Role,
		Route:        cfg.Route,
		// Pools of equivalent routes are keyed by model class (docs/architecture.md §10).
		RouteClass:     r.att.ModelClass,
		OperationClass: r.att.OperationClass,
		ModelClass:     r.att.ModelClass,
		CommitPoint:    r.att.CommitPoint,
		WorkerID:       cfg.WorkerID,
		// The worker never sees the group's start: the budget the attempt
		// arrived with is its view of the overall deadline.
		OverallDeadlineMs:    max(r.att.RemainingMs, 0),
		ElapsedMs:            res.ElapsedMs,
		FirstByteMs:          res.FirstByteMs,
		Outcome:              workerOutcome(res, !cancelAt.IsZero(), reason),
		StatusClass:          res.StatusClass,
		ErrorScope:           res.ErrorScope,
		HTTPStatus:           res.HTTPStatus,
		ContractValid:        false, // the arbiter judges contracts, on the dispatcher
		CancellationSent:     !cancelAt.IsZero(),
		CancellationObserved: res.CancellationObserved,
		UsageInputUnits:      usage.InputUnits,
		UsageOutputUnits:     usage.OutputUnits,
		UsageEstimated:       usage.Estimated,
		CostBand:             schemas.CostBandOf(usage),
		PromptFingerprint:    fp,
	}
	data, err := rec.MarshalJSON()
	if err == nil {
		err = cfg.Conn.Publish(schemas.RegionWire(cfg.Region).AttemptRecordSubject(), data)
	}
	if err != nil {
		r.w.log.Warn("attempt record not published", "group_id", r.att.GroupID, "attempt", r.att.Attempt, "error", err)
	}
}

// workerOutcome is the attempt's outcome as far as the worker can tell. It
// never knows whether an answer won: a complete answer with no cancel is
// OutcomeCompleted, and the dispatcher's record says the rest.
func workerOutcome(res schemas.AttemptResult, cancelled bool, reason schemas.CancelReason) schemas.Outcome {
	lostRace := reason == schemas.CancelLostRace || reason == schemas.CancelAlreadyCommitted
	switch {
	case res.StatusClass == schemas.StatusOK && cancelled && lostRace:
		return schemas.OutcomeLoserLate
	case res.StatusClass == schemas.StatusOK:
		return schemas.OutcomeCompleted
	case !res.CancellationObserved:
		return schemas.OutcomeFailed
	}
	switch {
	case lostRace:
		return schemas.OutcomeLoserCanceled
	case reason == schemas.CancelTimeout || reason == schemas.CancelInvalid:
		return schemas.OutcomeFailed // the dispatcher gave up on this attempt itself
	}
	return schemas.OutcomeCanceled // the group ended without a winner
}
