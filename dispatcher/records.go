package dispatcher

import (
	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/schemas"
)

func (g *group) hedgeDelayMs() *int64 {
	if !g.armed {
		return nil
	}
	return schemas.Millis(g.delay)
}

// fingerprint is the prompt fingerprint the records carry. It is computed
// at the first record, off the path that launches the primary.
func (g *group) fingerprint() string {
	if g.print == "" {
		g.print, _ = g.sub.Request.Fingerprint(g.d.secret)
	}
	return g.print
}

// attemptRecord is the dispatcher's sanitized record of one attempt: no
// prompt, output, header, credential or user identifier.
func (g *group) attemptRecord(a *attemptState, e hedge.AttemptEnded) schemas.AttemptRecord {
	r := schemas.AttemptRecord{
		EventTime: g.d.now(), Reporter: schemas.ReporterDispatcher,
		UserActionID: g.ua, HedgeGroupID: g.id, Attempt: e.Attempt, Role: e.Role, Route: e.Route,
		RouteClass: g.sub.Pool, OperationClass: g.class.Name, ModelClass: g.sub.Pool,
		CommitPoint: g.eng.CommitPoint(), WorkerID: a.workerID,
		HedgeDelayMs: g.hedgeDelayMs(), OverallDeadlineMs: g.deadline.Milliseconds(),
		ElapsedMs: e.Elapsed.Milliseconds(),
		Outcome:   schemas.Outcome(e.Outcome), StatusClass: e.Status, ErrorScope: e.Scope,
		ContractValid: e.ContractValid, CancellationSent: e.CancellationSent, CancellationObserved: e.CancellationObserved,
		UsageInputUnits: e.Usage.InputUnits, UsageOutputUnits: e.Usage.OutputUnits, UsageEstimated: e.Usage.Estimated,
		CostBand: schemas.CostBandOf(e.Usage), PromptFingerprint: g.fingerprint(),
		DuplicateRateWindow: g.duplicateRateWindow(),
	}
	if e.FirstByte > 0 {
		r.FirstByteMs = schemas.Millis(e.FirstByte)
	}
	if a.result != nil {
		r.HTTPStatus = a.result.HTTPStatus
	}
	if r.StatusClass == "" {
		r.StatusClass = schemas.StatusCanceled
	}
	return r
}

// groupRecord is the sanitized summary of the group.
func (g *group) groupRecord(e hedge.GroupEnded) schemas.GroupRecord {
	r := schemas.GroupRecord{
		EventTime: g.d.now(), Reporter: schemas.ReporterDispatcher,
		UserActionID: g.ua, HedgeGroupID: g.id, RouteClass: g.sub.Pool, OperationClass: g.class.Name, ModelClass: g.sub.Pool,
		CommitPoint: g.eng.CommitPoint(), Stream: g.sub.Request.Stream,
		HedgeDelayMs: g.hedgeDelayMs(), OverallDeadlineMs: g.deadline.Milliseconds(), ElapsedMs: e.Latency.Milliseconds(),
		Attempts: e.Attempts, HedgeLaunched: e.HedgeLaunched, HedgeSuppressedReason: e.HedgeSuppressed,
		LoserFinishedLate: e.LoserFinishedLate, Supersedes: g.supersedes,
		UsageInputUnits: e.Usage.InputUnits, UsageOutputUnits: e.Usage.OutputUnits, UsageEstimated: e.Usage.Estimated,
		CostBand: schemas.CostBandOf(e.Usage), PromptFingerprint: g.fingerprint(), GuardrailDecision: g.guard,
		ErrorScope: e.Scope, DuplicateRateWindow: g.duplicateRateWindow(),
	}
	if r.ErrorScope == "" {
		r.ErrorScope = schemas.ScopeNone
	}
	switch {
	case g.voided != "":
		// Committed, then failed before its caller had the answer: the
		// claim was given back (failCommitted), so the group failed, and
		// like any failed group it names no winner.
		r.Outcome, r.ErrorCode = schemas.GroupFailed, g.voided
		r.StatusClass = statusOfError(g.voided)
	case e.Committed:
		r.Outcome, r.StatusClass = schemas.GroupCommitted, schemas.StatusOK
		r.WinnerAttempt = e.Winner
		r.CommittedUnixMs = g.start.Add(e.Latency).UnixMilli()
		if w := g.attempt(e.Winner); w != nil {
			r.WinnerRole, r.WinnerRoute = w.role, w.route
			if w.firstByte > 0 {
				r.FirstByteMs = schemas.Millis(w.launchedAt.Sub(g.start) + w.firstByte)
			}
		}
		if gv, err := arbiter.ParseGateValue(g.gateValue); err == nil {
			r.GateEpoch = gv.Epoch
		}
	default:
		r.Outcome, r.ErrorCode = schemas.GroupFailed, e.Error
		r.StatusClass = statusOfError(e.Error)
	}
	return r
}

func statusOfError(code schemas.ErrorCode) schemas.StatusClass {
	switch code {
	case schemas.ErrDeadlineExceeded:
		return schemas.StatusTimeout
	case schemas.ErrCanceled, schemas.ErrAlreadyCommitted:
		return schemas.StatusCanceled
	case schemas.ErrInvalidRequest:
		return schemas.StatusInvalidRequest
	case schemas.ErrRateLimited:
		return schemas.StatusRateLimited
	case schemas.ErrOverloaded:
		return schemas.StatusBusy
	}
	return schemas.StatusServerError
}
