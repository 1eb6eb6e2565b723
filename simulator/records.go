package simulator

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/schemas"
)

// RecordSink receives the sanitized records of a simulated run as the
// dispatcher would publish them (docs/architecture.md §9), stamped in
// virtual time with reporter "simulator": one attempt record per launched
// attempt, one group record per group. A what-if replay
// (`simulate --records`) reads them back.
type RecordSink interface {
	AttemptRecord(schemas.AttemptRecord) error
	GroupRecord(schemas.GroupRecord) error
}

// fingerprint stands for the prompt fingerprint: a simulated request has no
// prompt, so its id, in the field's 16 hex digits, identifies it.
func (g *simGroup) fingerprint() string { return fmt.Sprintf("%016x", g.req.ID) }

func (r *runner) hedgeDelayMs(g *simGroup) *int64 {
	if g.hedgeDelay <= 0 {
		return nil
	}
	return schemas.Millis(g.hedgeDelay)
}

func (r *runner) recordAttempt(g *simGroup, e hedge.AttemptEnded) error {
	if r.records == nil {
		return nil
	}
	rec := schemas.AttemptRecord{
		EventTime: r.at(), Reporter: schemas.ReporterSimulator,
		UserActionID: "ua_" + g.id, HedgeGroupID: g.id, Attempt: e.Attempt, Role: e.Role, Route: e.Route,
		RouteClass: pool, OperationClass: g.cohort.Operation, ModelClass: g.cohort.Model,
		CommitPoint: g.eng.CommitPoint(), HedgeDelayMs: r.hedgeDelayMs(g),
		OverallDeadlineMs: r.cond.Deadline.Milliseconds(), ElapsedMs: e.Elapsed.Milliseconds(),
		Outcome: schemas.Outcome(e.Outcome), StatusClass: e.Status, ErrorScope: e.Scope,
		ContractValid: e.ContractValid, CancellationSent: e.CancellationSent, CancellationObserved: e.CancellationObserved,
		UsageInputUnits: e.Usage.InputUnits, UsageOutputUnits: e.Usage.OutputUnits, UsageEstimated: e.Usage.Estimated,
		CostBand: schemas.CostBandOf(e.Usage), PromptFingerprint: g.fingerprint(),
	}
	if e.FirstByte > 0 {
		rec.FirstByteMs = schemas.Millis(e.FirstByte)
	}
	if rec.StatusClass == "" {
		rec.StatusClass = schemas.StatusCanceled
	}
	if rec.ErrorScope == "" {
		rec.ErrorScope = schemas.ScopeNone
	}
	return r.records.AttemptRecord(rec)
}

func (r *runner) recordGroup(g *simGroup, e hedge.GroupEnded) error {
	if r.records == nil {
		return nil
	}
	rec := schemas.GroupRecord{
		EventTime: r.at(), Reporter: schemas.ReporterSimulator,
		UserActionID: "ua_" + g.id, HedgeGroupID: g.id, RouteClass: pool,
		OperationClass: g.cohort.Operation, ModelClass: g.cohort.Model,
		CommitPoint: g.eng.CommitPoint(), Stream: r.stream, HedgeDelayMs: r.hedgeDelayMs(g),
		OverallDeadlineMs: r.cond.Deadline.Milliseconds(), ElapsedMs: e.Latency.Milliseconds(),
		ErrorScope: e.Scope, Attempts: e.Attempts, HedgeLaunched: e.HedgeLaunched,
		HedgeSuppressedReason: e.HedgeSuppressed, LoserFinishedLate: e.LoserFinishedLate,
		UsageInputUnits: e.Usage.InputUnits, UsageOutputUnits: e.Usage.OutputUnits, UsageEstimated: e.Usage.Estimated,
		CostBand: schemas.CostBandOf(e.Usage), PromptFingerprint: g.fingerprint(), GuardrailDecision: g.guard,
	}
	if rec.ErrorScope == "" {
		rec.ErrorScope = schemas.ScopeNone
	}
	if e.Committed {
		rec.Outcome, rec.StatusClass, rec.WinnerAttempt = schemas.GroupCommitted, schemas.StatusOK, e.Winner
		rec.CommittedUnixMs = epoch.Add(g.arrival + e.Latency).UnixMilli()
		w := g.attempts[e.Winner-1]
		rec.WinnerRole, rec.WinnerRoute = w.role, r.routes[w.route]
		if w.draw.FirstByte != 0 && w.draw.FirstByte < w.draw.End {
			rec.FirstByteMs = schemas.Millis(w.start + w.draw.FirstByte + workerLatency - g.arrival)
		}
	} else {
		rec.Outcome, rec.ErrorCode = schemas.GroupFailed, e.Error
		rec.StatusClass = schemas.StatusServerError
		if e.Error == schemas.ErrDeadlineExceeded {
			rec.StatusClass = schemas.StatusTimeout
		}
	}
	if g.arm == delay.ArmControl {
		rec.ControlBaselineMs = r.controlBaselineMs(g, e)
	}
	return r.records.GroupRecord(rec)
}

// controlBaselineMs is a control group's control_baseline_ms, as the
// dispatcher's: the latency its record would show had it run
// primary-only (e.Baseline), or nil when that is unknown.
func (r *runner) controlBaselineMs(g *simGroup, e hedge.GroupEnded) *int64 {
	b := e.Baseline
	switch {
	case !b.Observed:
		return nil
	case !b.Committed:
		return schemas.Millis(r.cond.Deadline)
	}
	if w := g.attempts[b.Attempt-1]; r.stream && w.draw.FirstByte != 0 && w.draw.FirstByte < w.draw.End {
		return schemas.Millis(w.start + w.draw.FirstByte + workerLatency - g.arrival)
	}
	return schemas.Millis(b.Latency)
}

// JSONLines is a RecordSink that writes each record as one JSON object per
// line, the format ReadTraffic reads. It is safe for concurrent use; Flush
// writes out what is buffered.
type JSONLines struct {
	mu sync.Mutex
	w  *bufio.Writer
}

// NewJSONLines returns a JSONLines writing to w.
func NewJSONLines(w io.Writer) *JSONLines { return &JSONLines{w: bufio.NewWriter(w)} }

// AttemptRecord writes one attempt record.
func (j *JSONLines) AttemptRecord(r schemas.AttemptRecord) error { return j.write(r) }

// GroupRecord writes one group record.
func (j *JSONLines) GroupRecord(r schemas.GroupRecord) error { return j.write(r) }

func (j *JSONLines) write(v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode record: %w", err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, err := j.w.Write(append(data, '\n')); err != nil {
		return fmt.Errorf("write record: %w", err)
	}
	return nil
}

// Flush writes out the buffered records.
func (j *JSONLines) Flush() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.w.Flush()
}
