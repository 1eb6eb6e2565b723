package simulator

import (
	"testing"

	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// Uneven routes (issue 27): one route of three with twice its siblings'
// stall share and half their decode speed, for the whole run (uneven) or
// from its midpoint (degrading). Each scenario has teeth — no hedging's P99
// is worse than on three equal routes — and hedgerow holds its duplicate
// ceilings there as on the degraded workload: the worst minute within the
// ceiling + 1 point, the worst 10 s within the burst ceiling + 2 points
// (docs/architecture.md §7, "two windows"). How far hedgerow pulls ahead
// of the peers on these routes is measured live (`make compare-peers
// PEERS_CONDITIONS=uneven`), not asserted here.
func TestUnevenRoutesHaveTeethAndHedgerowHoldsItsCeilings(t *testing.T) {
	if raceEnabled {
		t.Skip("simulates 300,000 groups, minutes under -race on 2 cores: make test runs it without -race " +
			"(go test -run 'TestReplayingAWorkloadsRecordsRecoversItsFrontier|TestUnevenRoutesHaveTeethAndHedgerowHoldsItsCeilings' ./simulator/)")
	}
	const requests, seed = 60_000, 3
	equal := byName(t, run(t, Options{Workload: workload.GPT4o, Requests: requests, Seed: seed, Stream: true,
		Strategies: []string{StrategyNone}}), StrategyNone)
	rate := policy.Default().DuplicateRate
	for _, w := range []string{workload.Uneven, workload.Degrading} {
		t.Run(w, func(t *testing.T) {
			rep := run(t, Options{Workload: w, Requests: requests, Seed: seed, Stream: true, Strategies: []string{StrategyNone, StrategyHedgerow}})
			none, hr := byName(t, rep, StrategyNone), byName(t, rep, StrategyHedgerow)
			if none.P99 <= equal.P99 {
				t.Errorf("no hedging's P99 %.0f ms is no worse than on equal routes (%.0f ms): the scenario has no teeth", none.P99, equal.P99)
			}
			if limit := rate.Ceiling + 0.01; hr.MaxMinuteHedgeRate > limit {
				t.Errorf("hedgerow's worst minute hedges %.3f, above its ceiling + 1 point = %.2f", hr.MaxMinuteHedgeRate, limit)
			}
			if limit := rate.BurstCeiling + 0.02; hr.MaxWindowHedgeRate > limit {
				t.Errorf("hedgerow's worst 10 s hedge %.3f, above its burst ceiling + 2 points = %.2f", hr.MaxWindowHedgeRate, limit)
			}
			t.Logf("%s: none P99 %.0f ms (equal routes %.0f ms); hedgerow P99 %.0f ms, P99.9 %.0f ms, duplicate rate %.3f, "+
				"worst minute hedges %.3f (ceiling %.2f), worst 10 s %.3f (burst ceiling %.2f)",
				w, none.P99, equal.P99, hr.P99, hr.P999, hr.DuplicateRate, hr.MaxMinuteHedgeRate, rate.Ceiling, hr.MaxWindowHedgeRate, rate.BurstCeiling)
		})
	}
}
