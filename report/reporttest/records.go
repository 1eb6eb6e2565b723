// Package reporttest generates seeded raw records for the tests of
// `hedgerow report`: the report package's own, the records stream's and
// the command's.
package reporttest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// Records is a seeded set of raw records, one JSON record a line, over
// two cohorts (chat/gpt4o streaming and not), one group a second from
// start: winners and every kind of loser, late completions, cancellations
// observed or not, failed groups, suppression reasons, every guardrail
// decision, and workers' own records (which a report ignores). The
// records name no region, as a deployment of one region keeps them.
func Records(seed uint64, groups int, start time.Time) ([][]byte, error) {
	return RegionRecords(seed, groups, start)
}

// RegionRecords is Records kept by the gateways of regions: group i and
// its attempts carry regions[i mod len(regions)] (no region with none),
// and each region after the first adds 100 ms per place in regions to
// its groups' latencies, so the regions' figures differ. A worker's own
// record carries none, as a worker writes it.
func RegionRecords(seed uint64, groups int, start time.Time, regions ...string) ([][]byte, error) {
	rng := rand.New(rand.NewPCG(seed, 7))
	reasons := []string{"", "", "duplicate_ceiling", "spend_ceiling", "no_second_route"}
	decisions := []schemas.GuardrailDecision{schemas.GuardrailAllow, schemas.GuardrailAllow, schemas.GuardrailAllow,
		schemas.GuardrailControl, schemas.GuardrailProbe, schemas.GuardrailDisable}
	loserOutcomes := []schemas.Outcome{schemas.OutcomeLoserCanceled, schemas.OutcomeLoserLate, schemas.OutcomeFailed, schemas.OutcomeLostElection}
	var lines [][]byte
	var failed error
	add := func(v any) {
		data, err := json.Marshal(v)
		if err != nil && failed == nil {
			failed = fmt.Errorf("reporttest: %w", err)
		}
		lines = append(lines, data)
	}
	for i := range groups {
		id := fmt.Sprintf("hg_%05d", i)
		stream := i%3 == 0
		at := start.Add(time.Duration(i) * time.Second)
		region, slower := "", int64(0)
		if len(regions) > 0 {
			region, slower = regions[i%len(regions)], int64(i%len(regions))*100
		}
		g := schemas.GroupRecord{EventTime: at, Reporter: schemas.ReporterDispatcher, UserActionID: "ua_" + id,
			HedgeGroupID: id, RouteClass: "chat_equivalent", OperationClass: "chat", ModelClass: "gpt4o",
			CommitPoint: schemas.FirstToken, Stream: stream, Region: region, OverallDeadlineMs: 30_000,
			ElapsedMs: slower + 200 + rng.Int64N(3000), Outcome: schemas.GroupCommitted, StatusClass: schemas.StatusOK,
			ErrorScope: schemas.ScopeNone, GuardrailDecision: decisions[rng.IntN(len(decisions))],
			HedgeSuppressedReason: reasons[rng.IntN(len(reasons))]}
		if stream {
			g.FirstByteMs = schemas.Millis(time.Duration(slower+50+rng.Int64N(900)) * time.Millisecond)
		}
		if rng.IntN(20) == 0 {
			g.Outcome, g.StatusClass = schemas.GroupFailed, schemas.StatusServerError
		}
		n := 1
		if g.GuardrailDecision != schemas.GuardrailControl && rng.IntN(4) == 0 {
			n = 2 + rng.IntN(2)
		}
		g.Attempts = n
		for k := 1; k <= n; k++ {
			a := schemas.AttemptRecord{EventTime: at, Reporter: schemas.ReporterDispatcher, UserActionID: "ua_" + id,
				HedgeGroupID: id, Attempt: k, Role: schemas.RolePrimary, Route: "r1", RouteClass: "chat_equivalent",
				OperationClass: "chat", ModelClass: "gpt4o", CommitPoint: schemas.FirstToken, Region: region,
				OverallDeadlineMs: 30_000, ElapsedMs: g.ElapsedMs, StatusClass: schemas.StatusOK, ErrorScope: schemas.ScopeNone,
				UsageInputUnits: rng.Int64N(2000), UsageOutputUnits: rng.Int64N(500), Outcome: schemas.OutcomeWinner}
			if k > 1 {
				a.Role = schemas.RoleHedge
			}
			if k != n || g.Outcome != schemas.GroupCommitted {
				a.Outcome = loserOutcomes[rng.IntN(len(loserOutcomes))]
				a.CancellationSent = rng.IntN(2) == 0
				a.CancellationObserved = a.CancellationSent && rng.IntN(3) > 0
			}
			add(a)
		}
		if rng.IntN(10) == 0 { // a worker's own record: never counted
			add(schemas.AttemptRecord{EventTime: at, Reporter: schemas.ReporterWorker, HedgeGroupID: id, Attempt: 1,
				CommitPoint: schemas.FirstToken, Outcome: schemas.OutcomeCompleted, UsageInputUnits: 1_000_000, StatusClass: schemas.StatusOK, ErrorScope: schemas.ScopeNone})
		}
		add(g)
	}
	return lines, failed
}

// Takeover says what links the two groups of TakeoverRecords' user action.
type Takeover struct {
	// Marked keeps the superseded record of the orphan's commit; Named
	// has the takeover's group record name the orphan (supersedes).
	Marked, Named bool
	// OrphanFailed makes the first group's record a failed one.
	OrphanFailed bool
}

// Orphan and Taker are the groups of TakeoverRecords' user action.
const (
	Orphan = "deaddeadbeef-1"
	Taker  = "0123456789ab-1"
)

// TakeoverRecords is one user action, ua_takeover, at, whose first group
// (Orphan) committed on a gateway that died — its record kept at the
// commit only, its winner's attempt record with usage 100 + 10 — and whose
// takeover (Taker) committed under a higher epoch (winner usage 200 + 20),
// as the records stream keeps them (docs/architecture.md §2, §9). What
// links the two is up to o.
func TakeoverRecords(at time.Time, o Takeover) ([][]byte, error) {
	group := func(id string, epoch int64, failed bool, event string) schemas.GroupRecord {
		g := schemas.GroupRecord{Event: event, EventTime: at, Reporter: schemas.ReporterDispatcher, UserActionID: "ua_takeover",
			HedgeGroupID: id, RouteClass: "general", OperationClass: "chat", ModelClass: "general",
			CommitPoint: schemas.FirstToken, Stream: true, OverallDeadlineMs: 4000, ElapsedMs: 50, Attempts: 1,
			Outcome: schemas.GroupCommitted, StatusClass: schemas.StatusOK, ErrorScope: schemas.ScopeNone,
			WinnerAttempt: 1, WinnerRole: schemas.RolePrimary, WinnerRoute: "a", GateEpoch: epoch,
			CostBand: schemas.CostLow, PromptFingerprint: "0123456789abcdef", GuardrailDecision: schemas.GuardrailIneligible}
		if failed {
			g.Outcome, g.StatusClass, g.ErrorCode = schemas.GroupFailed, schemas.StatusServerError, schemas.ErrStreamInterrupted
			g.WinnerAttempt, g.WinnerRole, g.WinnerRoute, g.GateEpoch = 0, "", "", 0
		}
		return g
	}
	winner := func(id string, in, out int64) schemas.AttemptRecord {
		return schemas.AttemptRecord{EventTime: at, Reporter: schemas.ReporterDispatcher, UserActionID: "ua_takeover",
			HedgeGroupID: id, Attempt: 1, Role: schemas.RolePrimary, Route: "a", RouteClass: "general",
			OperationClass: "chat", ModelClass: "general", CommitPoint: schemas.FirstToken, OverallDeadlineMs: 4000,
			Outcome: schemas.OutcomeWinner, StatusClass: schemas.StatusOK, ErrorScope: schemas.ScopeNone,
			UsageInputUnits: in, UsageOutputUnits: out, CostBand: schemas.CostLow, PromptFingerprint: "0123456789abcdef"}
	}
	taker := group(Taker, 2, false, schemas.EventGroupComplete)
	if o.Named {
		taker.Supersedes = Orphan
	}
	recs := []any{winner(Orphan, 100, 10), group(Orphan, 1, o.OrphanFailed, schemas.EventGroupCommitted),
		winner(Taker, 200, 20), taker}
	if o.Marked {
		recs = append(recs, schemas.SupersededRecord{EventTime: at, Reporter: schemas.ReporterDispatcher,
			UserActionID: "ua_takeover", HedgeGroupID: Orphan, WinnerAttempt: 1, GateEpoch: 1, SupersededBy: Taker})
	}
	lines := make([][]byte, 0, len(recs))
	for _, r := range recs {
		data, err := json.Marshal(r)
		if err != nil {
			return nil, fmt.Errorf("reporttest: %w", err)
		}
		lines = append(lines, data)
	}
	return lines, nil
}
