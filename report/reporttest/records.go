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
// decision, and workers' own records (which a report ignores).
func Records(seed uint64, groups int, start time.Time) ([][]byte, error) {
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
		g := schemas.GroupRecord{EventTime: at, Reporter: schemas.ReporterDispatcher, UserActionID: "ua_" + id,
			HedgeGroupID: id, RouteClass: "chat_equivalent", OperationClass: "chat", ModelClass: "gpt4o",
			CommitPoint: schemas.FirstToken, Stream: stream, OverallDeadlineMs: 30_000,
			ElapsedMs: 200 + rng.Int64N(3000), Outcome: schemas.GroupCommitted, StatusClass: schemas.StatusOK,
			ErrorScope: schemas.ScopeNone, GuardrailDecision: decisions[rng.IntN(len(decisions))],
			HedgeSuppressedReason: reasons[rng.IntN(len(reasons))]}
		if stream {
			g.FirstByteMs = schemas.Millis(time.Duration(50+rng.Int64N(900)) * time.Millisecond)
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
				OperationClass: "chat", ModelClass: "gpt4o", CommitPoint: schemas.FirstToken,
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
