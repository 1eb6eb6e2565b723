package dispatcher

import (
	"encoding/json"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/dispatcher/delay"
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
func (g *group) attemptRecord(a *attemptRun, e hedge.AttemptEnded) schemas.AttemptRecord {
	r := schemas.AttemptRecord{
		EventTime: g.d.now(), Reporter: schemas.ReporterDispatcher,
		UserActionID: g.ua, HedgeGroupID: g.id, Attempt: e.Attempt, Role: e.Role, Route: e.Route,
		RouteClass: g.sub.Pool, OperationClass: g.class.Name, ModelClass: g.sub.Pool,
		CommitPoint: g.eng.CommitPoint(), WorkerID: a.workerID, Region: g.d.region,
		HedgeDelayMs: g.hedgeDelayMs(), OverallDeadlineMs: g.deadline.Milliseconds(),
		ElapsedMs: e.Elapsed.Milliseconds(),
		Outcome:   schemas.Outcome(e.Outcome), StatusClass: e.Status, ErrorScope: e.Scope,
		ContractValid: e.ContractValid, CancellationSent: e.CancellationSent, CancellationObserved: e.CancellationObserved,
		UsageInputUnits: e.Usage.InputUnits, UsageOutputUnits: e.Usage.OutputUnits, UsageEstimated: e.Usage.Estimated,
		CostBand: schemas.CostBandOf(e.Usage), PromptFingerprint: g.fingerprint(),
		DuplicateRateWindow: g.duplicateRateWindow(),
	}
	if a.firstByte > 0 {
		// As the wire reported it (group.firstByteCame, the one source of
		// the engine's FirstByte too): a first byte folded into a result
		// (schemas.Attempt.FoldsFirstByte) reached the engine with the
		// result, but came the result's first_byte_ms before it.
		r.FirstByteMs = schemas.Millis(a.firstByte)
	}
	if a.result != nil {
		r.HTTPStatus = a.result.HTTPStatus
	}
	if a.role == schemas.RoleContinuation {
		r.ContinuedFromUnits = int64(a.offset)
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
		CommitPoint: g.eng.CommitPoint(), Stream: g.sub.Request.Stream, Region: g.d.region,
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
	if g.arm == delay.ArmControl {
		r.ControlBaselineMs = g.controlBaselineMs(e)
	}
	return r
}

// controlBaselineMs is a control group's control_baseline_ms: the latency
// its record would show had it run primary-only (e.Baseline), or nil when
// that is unknown.
func (g *group) controlBaselineMs(e hedge.GroupEnded) *int64 {
	b := e.Baseline
	switch {
	case !b.Observed:
		return nil
	case !b.Committed:
		return schemas.Millis(g.deadline)
	}
	if a := g.attempt(b.Attempt); a != nil && g.sub.Request.Stream && a.firstByte > 0 {
		return schemas.Millis(a.launchedAt.Sub(g.start) + a.firstByte)
	}
	return schemas.Millis(b.Latency)
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

// pendingRecord is a record waiting for the caller's delivery to go first:
// published live on subject, kept under stored. data, when set, is rec
// marshalled already (the committed record, kept before the answer).
type pendingRecord struct {
	subject, stored string
	rec             json.Marshaler
	data            []byte
}

// publish queues a record; it is marshalled and published once the event's
// deliveries reached the caller (see deliver), so the caller's answer does
// not wait for the bookkeeping of the group that produced it.
func (g *group) publish(r pendingRecord) { g.records = append(g.records, r) }

// publishRecords publishes the queued records, in order: live on core
// NATS, and to the Recorder when the record has a stored subject.
func (g *group) publishRecords() {
	for i, r := range g.records {
		data := r.data
		var err error
		if data == nil {
			data, err = r.rec.MarshalJSON()
		}
		if err == nil {
			err = g.d.nc.Publish(r.subject, data)
		}
		if err != nil {
			g.d.log.Warn("record not published", "subject", r.subject, "err", err)
		}
		if err == nil && r.stored != "" && g.d.records != nil {
			g.d.records.Publish(r.stored, data)
		}
		g.records[i] = pendingRecord{}
	}
	g.records = g.records[:0]
}

// keepCommit keeps the group's record at its commit, waiting for the store
// (bounded by the Recorder), so no answered group is missing from the
// records when this dispatcher stops right after answering. It returns the
// record marshalled (nil when it could not be), for its live copy.
func (g *group) keepCommit() []byte {
	rec := g.committed
	g.committed = nil
	data, err := rec.MarshalJSON()
	if err == nil && g.d.records != nil {
		err = g.d.records.Commit(schemas.StoredGroupSubject(g.id), data)
	}
	if err != nil {
		// The Recorder counts and logs its failures, at a bounded rate.
		g.d.log.Debug("committed group's record not kept before its answer", "group", g.id, "err", err)
	}
	return data
}
