package demo

import (
	"runtime"
	"slices"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/internal/tools/hostload"
	"github.com/hedgerow/hedgerow/report"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// The windows the worst duplicate and hedge rates are taken over: the
// gateway's own, in real time, since the demo keeps the budgets' defaults
// unscaled (configYAML) — the burst window that burst_ceiling bounds and
// the window that ceiling bounds. In model time the burst window would
// hold a fiftieth of the groups (about 20 at the default rate), a rate no
// ceiling counts.
var (
	burstWindow    = policy.Default().DuplicateRate.BurstWindow
	duplicateRange = policy.Default().DuplicateRate.Window
)

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
		res, windows := r.strategy(ru, cond)
		rep.Strategies = append(rep.Strategies, res)
		rep.Windows = windows
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
	rep.HostCPUs = runtime.NumCPU()
	if load, err := hostload.OneMinute(); err == nil {
		rep.LoadAverage = &load
	}
	if len(rep.Strategies) == 2 {
		rep.TailGain, rep.TailGainWithheld = report.TailGain(rep.Strategies[1].Latencies, rep.Strategies[0].Latencies, report.Options{})
	}
	return rep
}

// strategy computes one measured run's figures as `hedgerow simulate`
// defines them, latencies in model time; its duplicate and hedge windows
// are the gateway's, in real time (burstWindow, duplicateRange).
func (r *runner) strategy(ru *run, cond workload.Conditions) (simulator.StrategyResult, Windows) {
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
		windowHedges              = map[int64]int{}
		lastWindow                int64
		delays                    []float64 // armed hedge delays, model ms
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
		w := int64(cr.Due / burstWindow)
		if g != nil {
			extra = max(g.Attempts-1, 0)
			if g.HedgeLaunched {
				// max_attempts 2 (the demo's hedged class): one hedge at most.
				windowHedges[w]++
			}
			if g.HedgeDelayMs != nil {
				delays = append(delays, float64(toModel(time.Duration(*g.HedgeDelayMs)*time.Millisecond))/float64(time.Millisecond))
			}
		}
		extras += extra
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
		return res, Windows{}
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
	slices.Sort(delays)
	res.MedianHedgeDelay = quantile(delays, 0.5)
	// Only full windows: the last is cut short by the end of arrivals.
	win := Windows{BurstSeconds: burstWindow.Seconds(), LongSeconds: duplicateRange.Seconds(), Full: int(lastWindow)}
	full := 0
	for w := range lastWindow {
		groups := windowGroups[w]
		full += groups
		if groups > 0 {
			res.MaxWindowDuplicateRate = max(res.MaxWindowDuplicateRate, float64(windowExtras[w])/float64(groups))
			res.MaxWindowHedgeRate = max(res.MaxWindowHedgeRate, float64(windowHedges[w])/float64(groups))
		}
	}
	if lastWindow > 0 {
		win.GroupsPerBurst = float64(full) / float64(lastWindow)
	}
	// The long window slides by a burst window over the full ones; a run
	// shorter than it is one window, the whole run's full windows.
	span := min(int64(duplicateRange/burstWindow), lastWindow)
	win.LongIsWholeRun = span < int64(duplicateRange/burstWindow)
	for first := int64(0); span > 0 && first+span <= lastWindow; first++ {
		groups, hedges := 0, 0
		for w := first; w < first+span; w++ {
			groups, hedges = groups+windowGroups[w], hedges+windowHedges[w]
		}
		if groups > 0 {
			res.MaxMinuteHedgeRate = max(res.MaxMinuteHedgeRate, float64(hedges)/float64(groups))
		}
	}
	return res, win
}

// Windows says what the demo's worst duplicate and hedge rates were taken
// over: Full whole burst windows of real time (the gateway's burst_window,
// BurstSeconds), of GroupsPerBurst groups on average, and the long window
// (its window, LongSeconds) sliding over them — or, when the run is
// shorter than the long window (LongIsWholeRun), the whole run's full
// windows.
type Windows struct {
	BurstSeconds   float64 `json:"burst_window_s"`
	LongSeconds    float64 `json:"window_s"`
	Full           int     `json:"full_burst_windows"`
	GroupsPerBurst float64 `json:"groups_per_burst_window"`
	LongIsWholeRun bool    `json:"window_is_whole_run"`
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
