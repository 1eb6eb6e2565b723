package demo

import (
	"fmt"
	"io"

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
	var none, hedged *simulator.StrategyResult
	for i := range rep.Strategies {
		switch rep.Strategies[i].Name {
		case simulator.StrategyNone:
			none = &rep.Strategies[i]
		case simulator.StrategyHedgerow:
			hedged = &rep.Strategies[i]
		}
	}
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
	fmt.Fprintf(w, "times are model time (real ÷ %g) to compare with `hedgerow simulate --stream`; none = primary-only, hedgerow = hedged\n\n",
		rep.TimeScale)
	if err := rep.Report.WriteTable(w); err != nil {
		return err
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "hedged P99 / primary-only P99:  %.3f  (target ≤ %g) %s\n", rep.P99Ratio(), TargetP99Ratio,
		verdict(rep.P99Ratio() > 0 && rep.P99Ratio() <= TargetP99Ratio))
	fmt.Fprintf(w, "cancel latency P99 (real ms):   %.1f  over %d cancelled losers, commit → upstream disconnect (target ≤ %g) %s; P50 %.1f, max %.1f\n",
		rep.CancelLatencyP99Ms, rep.CancelledLosers, TargetCancelLatencyMs, verdict(rep.CancelLatencyP99Ms <= TargetCancelLatencyMs),
		rep.CancelLatencyP50Ms, rep.CancelLatencyMaxMs)
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

func verdict(ok bool) string {
	if ok {
		return "ok"
	}
	return "MISSED"
}
