package demo

import (
	"slices"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// windowModel is the width, in model time, of the windows the worst
// duplicate rate is taken over (as `hedgerow simulate` does).
const windowModel = 10 * time.Second

// report assembles the report from the runs; the warm-up contributes only
// to the bookkeeping and the double-commit count.
func (r *runner) report(runs []*run) *Report {
	cond := workload.PinnedConditions()
	rep := &Report{
		Report: simulator.Report{
			Workload: r.o.Workload, Requests: r.o.Requests, Seed: r.o.Seed, Stream: true,
			Conditions: simulator.Conditions{
				Deadline: modelDeadline, DeadlineMs: modelDeadline.Milliseconds(),
				// Arrivals in model time, like every other figure.
				ArrivalRate:       r.o.Rate * r.o.TimeScale,
				InputCostPerToken: cond.InputCostPerToken, OutputCostPerToken: cond.OutputCostPerToken,
				FailedCountAt: "deadline",
			},
		},
		TimeScale: r.o.TimeScale, OpenEarly: r.o.OpenEarly, Warmup: r.o.Warmup, Rate: r.o.Rate,
		DoubleCommits: r.rec.doubleCommits(),
	}
	rep.GroupRecords, rep.AttemptRecords, rep.BadRecords = r.rec.counts()
	var cancels []float64
	for _, ru := range runs {
		rep.Runs = append(rep.Runs, ru.check)
		if ru.name != simulator.StrategyNone && ru.name != simulator.StrategyHedgerow {
			continue
		}
		rep.Strategies = append(rep.Strategies, r.strategy(ru, cond))
		for i := range ru.groups {
			c, tokens := losers(ru.groups[i], ru.upstream[i])
			cancels = append(cancels, c...)
			rep.LoserOutputTokens += tokens
		}
	}
	slices.Sort(cancels)
	rep.CancelledLosers = len(cancels)
	rep.CancelLatencyP50Ms = quantile(cancels, 0.50)
	rep.CancelLatencyP99Ms = quantile(cancels, 0.99)
	rep.CancelLatencyMaxMs = quantile(cancels, 1)
	return rep
}

// strategy computes one measured run's figures as `hedgerow simulate`
// defines them, in model time.
func (r *runner) strategy(ru *run, cond workload.Conditions) simulator.StrategyResult {
	toModel := func(d time.Duration) time.Duration { return time.Duration(float64(d) / r.o.TimeScale) }
	res := simulator.StrategyResult{Name: ru.name}
	var (
		latencies                 []float64
		extras                    int
		misses, errs              int
		winnerTokens, extraTokens float64
		winnerCost, extraCost     float64
		windowGroups              = map[int64]int{}
		windowExtras              = map[int64]int{}
		lastWindow                int64
	)
	for i, cr := range ru.sum.Results {
		g := ru.groups[i]
		committed := g != nil && g.Outcome == schemas.GroupCommitted
		// The caller's view: time from the request's arrival to its first
		// committed token; a failed group counts at the deadline.
		latency := modelDeadline
		if committed && cr.FirstToken > 0 {
			latency = cond.LatencyAtDeadline(toModel(cr.FirstToken), false)
		}
		latencies = append(latencies, float64(latency)/float64(time.Millisecond))
		switch {
		case committed:
		case g != nil && g.ErrorCode == schemas.ErrDeadlineExceeded:
			misses++
		default:
			errs++
		}
		extra := 0
		if g != nil {
			extra = max(g.Attempts-1, 0)
		}
		extras += extra
		w := int64(toModel(cr.Due) / windowModel)
		windowGroups[w]++
		windowExtras[w] += extra
		lastWindow = max(lastWindow, w)

		win := winner(g, ru.upstream[i])
		for k, u := range ru.upstream[i] {
			billed := schemas.Usage{InputUnits: u.BilledInputTokens, OutputUnits: u.BilledOutputTokens}
			tokens, cost := float64(billed.InputUnits+billed.OutputUnits), cond.Cost(billed)
			if k == win {
				winnerTokens += tokens
				winnerCost += cost
			} else {
				extraTokens += tokens
				extraCost += cost
			}
		}
	}
	n := float64(len(latencies))
	if n == 0 {
		return res
	}
	slices.Sort(latencies)
	var sum float64
	for _, l := range latencies {
		sum += l
	}
	res.Groups, res.Latencies = len(latencies), latencies
	res.Mean = sum / n
	res.P50, res.P90 = quantile(latencies, 0.50), quantile(latencies, 0.90)
	res.P99, res.P999 = quantile(latencies, 0.99), quantile(latencies, 0.999)
	res.DuplicateRate = float64(extras) / n
	res.DeadlineMissRate, res.ErrorRate = float64(misses)/n, float64(errs)/n
	if winnerTokens > 0 {
		res.ExtraTokensRatio = extraTokens / winnerTokens
	}
	if winnerCost > 0 {
		res.ExtraCostRatio = extraCost / winnerCost
	}
	// Only full windows: the last is cut short by the end of arrivals.
	for w, groups := range windowGroups {
		if w < lastWindow && groups > 0 {
			res.MaxWindowDuplicateRate = max(res.MaxWindowDuplicateRate, float64(windowExtras[w])/float64(groups))
		}
	}
	return res
}

// winner returns the index in recs of the committed attempt's upstream
// record — the completed answer on the winner's route — or -1 when the group
// did not commit or the provider has no such record.
func winner(g *schemas.GroupRecord, recs []fakellm.Record) int {
	if g == nil || g.Outcome != schemas.GroupCommitted {
		return -1
	}
	route, ok := routeIndex(g.WinnerRoute)
	if !ok {
		return -1
	}
	win := -1
	for k, u := range recs {
		if u.Route != route {
			continue
		}
		// A route served the group twice only if a replacement went back
		// to it; the completed answer is the one that won.
		if win < 0 || u.End == fakellm.EndCompleted && recs[win].End != fakellm.EndCompleted {
			win = k
		}
	}
	return win
}

// losers returns, for one request, the commit → disconnect latency (real
// ms) of every loser the provider saw disconnect after a commit, and the
// output tokens billed to every attempt that did not win.
func losers(g *schemas.GroupRecord, recs []fakellm.Record) (cancels []float64, outputTokens int64) {
	win := winner(g, recs)
	for k, u := range recs {
		if k == win {
			continue
		}
		outputTokens += u.BilledOutputTokens
		if win < 0 || g.CommittedUnixMs == 0 || u.DisconnectUnixMs == nil || u.End != fakellm.EndDisconnected {
			continue
		}
		// Both clocks are whole milliseconds, so a disconnect can read up
		// to 1 ms before the commit that caused it; one earlier than that
		// was not caused by the commit (e.g. an attempt dropped as invalid).
		d := *u.DisconnectUnixMs - g.CommittedUnixMs
		if d < -1 {
			continue
		}
		cancels = append(cancels, float64(max(d, 0)))
	}
	return cancels, outputTokens
}

// quantile is the nearest-rank quantile of sorted values, as `hedgerow
// simulate` takes it.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
