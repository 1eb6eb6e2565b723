package peers

import (
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"
)

// writeTable prints each condition's contenders side by side, then
// hedgerow's figures over the best peer's.
func writeTable(w io.Writer, o options, reps []*conditionReport) {
	fmt.Fprintf(w, "peers comparison: workload %s, seed %d, time scale %v (deadline %v real), %d requests per contender, "+
		"%v requests/s in all, contenders interleaved by a seeded shuffle; times are real ms, failures count at the deadline\n",
		o.Workload, o.Seed, o.TimeScale, o.deadline(), o.PerContender, o.Rate)
	if o.Oracle {
		fmt.Fprintf(w, "oracle (-peers.oracle): under uneven routes hedgerow's pool leaves the degraded route out; the peers keep all three\n")
	}
	for _, rep := range reps {
		fmt.Fprintf(w, "\n== %s — peers' delay %s ms (%s; the same P95 over none's measured requests was %s ms, "+
			"the model's own %s ms), max %d attempts each; run took %v\n",
			rep.Condition.Name, ms(rep.Delay), rep.DelaySource, ms(rep.RunDelay), ms(rep.ModelDelay), maxAttempts, rep.Elapsed.Round(time.Second))
		upstream := writeContenders(w, rep.Contenders, rep.HedgedArm)
		writeRoutes(w, rep.Condition, rep.Contenders)
		h := rep.Hedgerow
		reasons := slices.Sorted(maps.Keys(h.Suppressed))
		parts := make([]string, len(reasons))
		for i, k := range reasons {
			parts[i] = fmt.Sprintf("%s %.0f", k, h.Suppressed[k])
		}
		roles := slices.Sorted(maps.Keys(h.Attempts))
		attempts := make([]string, len(roles))
		for i, k := range roles {
			attempts[i] = fmt.Sprintf("%s %.0f", k, h.Attempts[k])
		}
		fmt.Fprintf(w, "hedgerow's own metrics: attempts %s; %.0f hedges launched, mean hedge delay armed %s ms; suppressed: %s; "+
			"commit record kept within %s ms (P50), %s ms (P99)\n",
			strings.Join(attempts, ", "), h.HedgesLaunched, ms(h.MeanDelay), strings.Join(parts, ", "), ms(h.CommitWait[0]), ms(h.CommitWait[1]))
		if len(h.Warnings) > 0 {
			msgs := slices.Sorted(maps.Keys(h.Warnings))
			for _, m := range msgs {
				fmt.Fprintf(w, "  live system logged %d× %s\n", h.Warnings[m], m)
			}
		}
		fmt.Fprintf(w, "upstream requests: %d counted by request at the fakes, %d by the fakes' /stats totals\n", upstream, rep.UpstreamRequests)
		r := ratios(rep)
		fmt.Fprintf(w, "hedgerow / best peer: TTFT P99 %.2f×, P99.9 %.2f×; end P99 %.2f×, P99.9 %.2f×; duplicate rate %+.2f points over the lower peer's\n",
			r.TTFTP99, r.TTFTP999, r.EndP99, r.EndP999, r.DupPoints)
		if rep.HedgedArm.Requests > 0 {
			ra := ratiosOf(rep, rep.HedgedArm)
			fmt.Fprintf(w, "hedged arm / best peer: TTFT P99 %.2f×, P99.9 %.2f×; end P99 %.2f×, P99.9 %.2f×; duplicate rate %+.2f points (without the %d control groups: they hedge too, their primary-only baseline measured on the side)\n",
				ra.TTFTP99, ra.TTFTP999, ra.EndP99, ra.EndP999, ra.DupPoints, row(rep.Contenders, contenderHedgerow).Requests-rep.HedgedArm.Requests)
		}
		fmt.Fprintf(w, "hedgerow / none:      TTFT P99 %.2f×, P99.9 %.2f×; end P99 %.2f×, P99.9 %.2f×\n",
			r.NoneTTFTP99, r.NoneTTFTP999, r.NoneEndP99, r.NoneEndP999)
		writeVerdict(w, rep.Condition, r)
		if rep.Tails != nil {
			writeTails(w, rep.Tails, o.PerContender)
		}
	}
}

// writeContenders prints the contenders' table, hedgerow's hedged arm
// under them when measured, and what each one's errors were; it returns the
// upstream requests of all contenders.
func writeContenders(w io.Writer, contenders []contenderReport, hedgedArm contenderReport) (upstream int) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "contender\trequests\terrors\tupstream\tdup rate\tmax/req\t"+
		"TTFT p50\tp90\tp99\tp99.9\tmax\tend p50\tp90\tp99\tp99.9\tmax\t")
	for _, c := range contenders {
		upstream += c.Upstream
		writeRow(tw, c)
	}
	if hedgedArm.Requests > 0 {
		writeRow(tw, hedgedArm)
	}
	_ = tw.Flush()
	for _, c := range contenders {
		if c.Errors > 0 {
			kinds := slices.Sorted(maps.Keys(c.ErrorKinds))
			parts := make([]string, len(kinds))
			for i, k := range kinds {
				parts[i] = fmt.Sprintf("%d %s", c.ErrorKinds[k], k)
			}
			fmt.Fprintf(w, "%s errors: %s\n", c.Name, strings.Join(parts, ", "))
		}
	}
	return upstream
}

// writeRow prints one contender's row of the table.
func writeRow(tw io.Writer, c contenderReport) {
	fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.2f%%\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
		c.Name, c.Requests, c.Errors, c.Upstream, 100*c.DuplicateRate(), c.MaxPerRequest,
		ms(c.TTFT.P50), ms(c.TTFT.P90), ms(c.TTFT.P99), ms(c.TTFT.P999), ms(c.TTFT.Max),
		ms(c.End.P50), ms(c.End.P90), ms(c.End.P99), ms(c.End.P999), ms(c.End.Max))
}

// ratioSet is hedgerow's figures over the best peer's (the lower of the two
// peers, quantile by quantile) and over none's.
type ratioSet struct {
	TTFTP99, TTFTP999, EndP99, EndP999                 float64
	DupPoints                                          float64
	NoneTTFTP99, NoneTTFTP999, NoneEndP99, NoneEndP999 float64
}

func ratios(rep *conditionReport) ratioSet {
	return ratiosOf(rep, row(rep.Contenders, contenderHedgerow))
}

// ratiosOf is ratios with h standing for hedgerow's row.
func ratiosOf(rep *conditionReport, h contenderReport) ratioSet {
	by := map[string]contenderReport{}
	for _, c := range rep.Contenders {
		by[c.Name] = c
	}
	a, b, n := by[contenderHedgedHTTP], by[contenderFailsafe], by[contenderNone]
	over := func(x, y time.Duration) float64 {
		if y == 0 {
			return 0
		}
		return float64(x) / float64(y)
	}
	return ratioSet{
		TTFTP99:      over(h.TTFT.P99, min(a.TTFT.P99, b.TTFT.P99)),
		TTFTP999:     over(h.TTFT.P999, min(a.TTFT.P999, b.TTFT.P999)),
		EndP99:       over(h.End.P99, min(a.End.P99, b.End.P99)),
		EndP999:      over(h.End.P999, min(a.End.P999, b.End.P999)),
		DupPoints:    100 * (h.DuplicateRate() - min(a.DuplicateRate(), b.DuplicateRate())),
		NoneTTFTP99:  over(h.TTFT.P99, n.TTFT.P99),
		NoneTTFTP999: over(h.TTFT.P999, n.TTFT.P999),
		NoneEndP99:   over(h.End.P99, n.End.P99),
		NoneEndP999:  over(h.End.P999, n.End.P999),
	}
}

// writeVerdict prints whether hedgerow met c's target, on the time to
// first token and on the end of the stream.
func writeVerdict(w io.Writer, c condition, r ratioSet) {
	fmt.Fprintf(w, "target (P99 ≤ %.2f× and P99.9 ≤ %.2f× the best peer's, duplicate rate ≤ the lower peer's + 1 point): time to first token %s; end of stream %s\n",
		c.TargetP99, c.TargetP999, verdictAt(c, r.TTFTP99, r.TTFTP999, r.DupPoints), verdictAt(c, r.EndP99, r.EndP999, r.DupPoints))
}

// writeRoutes prints where each contender sent its primaries and its
// duplicates, by fake route, naming the degraded one.
func writeRoutes(w io.Writer, c condition, contenders []contenderReport) {
	label := "by route fake-0/fake-1/fake-2"
	if c.Uneven {
		label += fmt.Sprintf(" (fake-%d degraded; the peers' order %v)", degradedRoute, c.order())
	}
	parts := make([]string, len(contenders))
	for i, cr := range contenders {
		parts[i] = fmt.Sprintf("%s %d/%d/%d + %d/%d/%d", cr.Name, cr.Primaries[0], cr.Primaries[1], cr.Primaries[2],
			cr.Extras[0], cr.Extras[1], cr.Extras[2])
	}
	fmt.Fprintf(w, "primaries + duplicates %s: %s\n", label, strings.Join(parts, "; "))
}

// verdictAt says whether hedgerow met c's target on one latency — P99 and
// P99.9 at most the target times the best peer's, the duplicate rate at
// most a point over the lower peer's — and which part it missed.
func verdictAt(c condition, p99, p999, dupPoints float64) string {
	var missed []string
	if p99 > c.TargetP99 {
		missed = append(missed, "P99")
	}
	if p999 > c.TargetP999 {
		missed = append(missed, "P99.9")
	}
	if dupPoints > 1 {
		missed = append(missed, "duplicate rate")
	}
	if len(missed) == 0 {
		return "met"
	}
	return "not met (" + strings.Join(missed, ", ") + ")"
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }

func TestPoolingSeedsAddsTheirCountsAndJoinsTheirSamples(t *testing.T) {
	run := func(ttft time.Duration, extra int) []*conditionReport {
		rep := &conditionReport{Condition: conditionHeadersAtFirstToken}
		for _, name := range contenderNames {
			samples := []time.Duration{ttft, 2 * ttft}
			rep.Contenders = append(rep.Contenders, contenderReport{Name: name, Requests: 2, Upstream: 2 + extra, Extra: extra,
				ttfts: samples, ends: samples, TTFT: summarize(samples), End: summarize(samples)})
		}
		rep.HedgedArm = rep.Contenders[len(rep.Contenders)-1]
		return []*conditionReport{rep}
	}
	ps := pool([]uint64{1, 2}, [][]*conditionReport{run(100*time.Millisecond, 0), run(300*time.Millisecond, 1)})
	if len(ps) != 1 {
		t.Fatalf("%d pooled conditions, want 1", len(ps))
	}
	h := row(ps[0].Contenders, contenderHedgerow)
	if h.Requests != 4 || h.Extra != 1 || h.Upstream != 5 || len(h.ttfts) != 4 {
		t.Errorf("pooled hedgerow: %d requests, %d extra, %d upstream, %d samples; want 4, 1, 5, 4", h.Requests, h.Extra, h.Upstream, len(h.ttfts))
	}
	if h.TTFT.Max != 600*time.Millisecond || h.TTFT.P50 != 200*time.Millisecond {
		t.Errorf("pooled TTFT max %v, P50 %v; want 600ms and 200ms", h.TTFT.Max, h.TTFT.P50)
	}
	if ps[0].HedgedArm.Requests != 4 {
		t.Errorf("pooled hedged arm %d requests, want 4", ps[0].HedgedArm.Requests)
	}
}

func TestTheRatioIntervalOfOneDistributionAgainstItselfHoldsOne(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	draw := func() []time.Duration {
		out := make([]time.Duration, 5000)
		for i := range out {
			out[i] = time.Duration(r.ExpFloat64() * float64(100*time.Millisecond))
		}
		return out
	}
	h, a, b := draw(), draw(), draw()
	lo, hi := ratioInterval(h, a, b, 0.99, 1)
	if !(lo < 1 && 1 < hi) || hi-lo > 0.5 {
		t.Errorf("interval [%.3f, %.3f] of one distribution against itself: want it to hold 1 and be narrower than 0.5", lo, hi)
	}
	twice := make([]time.Duration, len(h))
	for i, x := range h {
		twice[i] = 2 * x
	}
	if lo, hi := ratioInterval(twice, a, b, 0.99, 1); !(lo > 1.5 && hi < 2.6) {
		t.Errorf("interval [%.3f, %.3f] of a distribution twice as slow: want it around 2", lo, hi)
	}
}
