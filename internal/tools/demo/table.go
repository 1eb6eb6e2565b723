package demo

import (
	"fmt"
	"io"

	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/simulator"
)

// The targets the demo is measured against (the demo issue).
const (
	TargetP99Ratio        = 0.5  // hedged P99 ≤ this × primary-only P99
	TargetCancelLatencyMs = 10.0 // cancel_latency_p99_ms ≤ this
)

// P99Ratio is the hedged run's P99 over the primary-only run's; 0 when a
// run is missing.
func (rep *Report) P99Ratio() float64 {
	none, hedged := rep.strategies()
	if none == nil || hedged == nil || none.P99 == 0 {
		return 0
	}
	return hedged.P99 / none.P99
}

// WriteTable prints the two runs side by side, the live system's figures
// against their targets, and each run's bookkeeping.
func (rep *Report) WriteTable(w io.Writer) error {
	opening := "streams open at the first token"
	if rep.OpenEarly {
		opening = "streams open at once, first token at the drawn first byte"
	}
	fmt.Fprintf(w, "hedgerow demo: live serve + 3 fake %s routes, streaming (%s), Poisson %g requests/s (real), %d-request warm-up\n",
		rep.Workload, opening, rep.Rate, rep.Warmup)
	fmt.Fprintf(w, "latencies are model time (real ÷ %g) to compare with `hedgerow simulate --stream`; the duplicate windows are\n"+
		"the gateway's, in real time (below); none = primary-only, hedgerow = hedged\n\n", rep.TimeScale)
	if err := rep.Report.WriteTable(w); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if rep.busyHost() {
		fmt.Fprintf(w, "this host was busier than its cores (load average %.1f on %d at the runs' end): every real ms waiting for CPU\n"+
			"  reads as %.0f model ms, so the latencies below measure the host as much as hedging\n", *rep.LoadAverage, rep.HostCPUs, 1/rep.TimeScale)
	}
	if g := rep.TailGain; g != nil {
		fmt.Fprintf(w, "tail gain, primary-only P99 / hedged P99: %.3f, 95%% bootstrap interval [%.3f, %.3f] (n=%d and %d, %d resamples, seed %d)\n",
			g.Ratio, g.Lower, g.Upper, g.ControlSamples, g.HedgedSamples, g.Resamples, g.Seed)
	} else {
		fmt.Fprintf(w, "tail gain withheld: %s\n", rep.TailGainWithheld)
	}
	fmt.Fprintf(w, "hedged P99 / primary-only P99:  %.3f  (target ≤ %g) %s\n", rep.P99Ratio(), TargetP99Ratio,
		verdict(rep.P99Ratio() > 0 && rep.P99Ratio() <= TargetP99Ratio))
	if why := rep.bodyNote(); why != "" {
		fmt.Fprintln(w, why)
	}
	fmt.Fprintln(w, rep.windowsNote())
	fmt.Fprintf(w, "cancel latency P99 (real ms):   %.1f  over %d cancelled losers, commit → upstream disconnect (target ≤ %g) %s; P50 %.1f, max %.1f\n",
		rep.CancelLatencyP99Ms, rep.CancelledLosers, TargetCancelLatencyMs, verdict(rep.CancelLatencyP99Ms <= TargetCancelLatencyMs),
		rep.CancelLatencyP50Ms, rep.CancelLatencyMaxMs)
	if rep.CancelLatencyP99Ms > TargetCancelLatencyMs {
		fmt.Fprintln(w, rep.cancelNote())
	}
	fmt.Fprintf(w, "loser output tokens billed:     %d  (the fakes' billing, cancellation lag included)\n", rep.LoserOutputTokens)
	fmt.Fprintf(w, "double commits:                 %d  (independent subscriber: %d group, %d attempt records, %d undecodable) %s\n",
		rep.DoubleCommits, rep.GroupRecords, rep.AttemptRecords, rep.BadRecords, verdict(rep.DoubleCommits == 0 && rep.BadRecords == 0))
	fmt.Fprintln(w)
	for _, c := range rep.Runs {
		fmt.Fprintf(w, "run %-8s %5d requests: %d group records, %d upstream records (%d stray), %d client errors, %d sends held by the in-flight cap\n",
			c.Name, c.Requests, c.GroupsSeen, c.UpstreamRecords, c.Stray, c.ClientErrors, c.CapDelayed)
	}
	return nil
}

// strategies returns the primary-only and the hedged run's figures; nil
// when a run is missing.
func (rep *Report) strategies() (none, hedged *simulator.StrategyResult) {
	for i := range rep.Strategies {
		switch rep.Strategies[i].Name {
		case simulator.StrategyNone:
			none = &rep.Strategies[i]
		case simulator.StrategyHedgerow:
			hedged = &rep.Strategies[i]
		}
	}
	return none, hedged
}

// bodyNote says, when the hedged run's P50 or P90 is above the
// primary-only run's, why that is no effect of the hedges on those
// requests; "" otherwise.
func (rep *Report) bodyNote() string {
	none, hedged := rep.strategies()
	if none == nil || hedged == nil || (hedged.P50 <= none.P50 && hedged.P90 <= none.P90) {
		return ""
	}
	return fmt.Sprintf("hedged P50/P90 above primary-only (%.0f/%.0f against %.0f/%.0f ms): a hedge launches only for a request still\n"+
		"  waiting at the hedge delay (median armed: %.0f model ms, the cohort's P95), so the requests below it ran alike in\n"+
		"  both runs but for their route — each route draws its own latency for a request, and the picker chooses by load,\n"+
		"  which the hedges change — and for the hedges' extra work on this host, where every real ms is %.0f model ms",
		hedged.P50, hedged.P90, none.P50, none.P90, hedged.MedianHedgeDelay, 1/rep.TimeScale)
}

// windowsNote says what the worst-window rates were taken over and checks
// the hedge rates against the default ceilings the demo's gateway keeps.
func (rep *Report) windowsNote() string {
	_, hedged := rep.strategies()
	if hedged == nil || rep.Windows.Full == 0 {
		return fmt.Sprintf("duplicate windows: the run holds no full %gs window of real time, the gateway's burst window", rep.Windows.BurstSeconds)
	}
	d := policy.Default().DuplicateRate
	long := fmt.Sprintf("max 1m hedge is the worst %gs", rep.Windows.LongSeconds)
	if rep.Windows.LongIsWholeRun {
		long = fmt.Sprintf("the run is shorter than the %gs window: max 1m hedge is over those", rep.Windows.LongSeconds)
	}
	return fmt.Sprintf("duplicate windows, in real time as the gateway counts them: %d full %gs windows of %.0f groups each; %s\n"+
		"  hedges: worst 10s %.3f against burst_ceiling %g %s, worst 1m %.3f against ceiling %g %s\n"+
		"  (max 10s dup counts replacements too, which no ceiling refuses; a cold or quiet pool's reserve may pass a ceiling)",
		rep.Windows.Full, rep.Windows.BurstSeconds, rep.Windows.GroupsPerBurst, long,
		hedged.MaxWindowHedgeRate, d.BurstCeiling, within(hedged.MaxWindowHedgeRate, d.BurstCeiling),
		hedged.MaxMinuteHedgeRate, d.Ceiling, within(hedged.MaxMinuteHedgeRate, d.Ceiling))
}

// cancelNote hints at the cause of a cancel latency over its target: a
// host with more runnable threads than cores (every part of the demo is
// one process and waits for CPU with the rest), or else the cancel path.
func (rep *Report) cancelNote() string {
	switch {
	case rep.LoadAverage == nil:
		return "  cause: this host keeps no load average to tell a busy host from a slow cancel path"
	case rep.busyHost():
		return fmt.Sprintf("  likely cause: a busy host — load average %.1f on %d cores at the runs' end; serve, its workers, the fake\n"+
			"  routes and the load generator share this one process, and a cancel waits for CPU behind the streams", *rep.LoadAverage, rep.HostCPUs)
	}
	return fmt.Sprintf("  the host was not saturated (load average %.1f on %d cores): the time is on the cancel path — the\n"+
		"  dispatcher's cancel over NATS, the worker ending its upstream request, the route seeing it (docs/architecture.md §8)",
		*rep.LoadAverage, rep.HostCPUs)
}

// busyHost says the host had at least as many runnable threads as cores
// (its 1-minute load average) when the runs ended.
func (rep *Report) busyHost() bool {
	return rep.LoadAverage != nil && *rep.LoadAverage >= float64(rep.HostCPUs)
}

// within is "ok" when rate is within ceiling, else "ABOVE".
func within(rate, ceiling float64) string {
	if rate <= ceiling {
		return "ok"
	}
	return "ABOVE"
}

func verdict(ok bool) string {
	if ok {
		return "ok"
	}
	return "MISSED"
}
