package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
	"time"
)

// printTable prints each fault's pools side by side, then what the columns
// leave out: why answers were invalid, plain streams given up on, and
// breaks no request explains.
func printTable(out io.Writer, results []faultResult) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "fault\tpool\trequests\ttries\tbreaks hit\troute breaks s+n\trescues s/w/o/f\tstream_interrupted\tinvalid\tP50 end\tP99 end\tbroken: n\tP50 end\tmax end\tload 1m start→end\t")
	for _, r := range results {
		for i, name := range pools {
			p := r.pools[name]
			fault, load := "", ""
			if i == 0 {
				fault, load = string(r.fault), loadAvg1(r.loadStart)+"→"+loadAvg1(r.loadEnd)
			}
			hits, rescues := p.interrupted, "-"
			pool := name
			if name == poolRescued {
				hits = int(r.rescues["started"])
				rescues = fmt.Sprintf("%g/%g/%g/%g", r.rescues["started"], r.rescues["won"], r.rescues["original_won"], r.rescues["failed"])
			} else {
				pool = "plain+retry"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d+%d\t%s\t%d\t%d\t%s\t%s\t%d\t%s\t%s\t%s\t\n", fault, pool, p.requests, p.tries, hits,
				p.routeBreaks[true], p.routeBreaks[false], rescues, p.interrupted, p.invalid,
				quantile(p.streamEnds, 0.5), quantile(p.streamEnds, 0.99),
				len(p.hitEnds), quantile(p.hitEnds, 0.5), quantile(p.hitEnds, 1), load)
		}
	}
	tw.Flush()
	fmt.Fprintln(out, "\nbreaks hit: rescued, hedgerow_rescues_total{outcome=\"started\"}; plain, the streams that ended stream_interrupted "+
		"(each sent again at once).\nroute breaks s+n: the faulty route's broken exchanges of the pool's streaming + non-streaming requests "+
		"(its records; the worker streams from the provider either way).\nrescues s/w/o/f: hedgerow_rescues_total started/won/original_won/failed. "+
		"invalid: answers (the last try's) not exactly the whole answer, other than stream_interrupted.\nP50/P99 end: streams only, "+
		"from the first try's start to the end of the stream that answered (nearest rank: of fewer than 100, P99 is the slowest);\n"+
		"broken: the streams among them the faulty route broke (any try), and their time to the end.")
	for _, r := range results {
		for _, name := range pools {
			p := r.pools[name]
			for _, why := range slices.Sorted(maps.Keys(p.reasons)) {
				fmt.Fprintf(out, "%s %s: %d invalid: %s\n", r.fault, name, p.reasons[why], why)
			}
			if p.lost > 0 {
				fmt.Fprintf(out, "%s %s: %d streams still stream_interrupted after %d tries\n", r.fault, name, p.lost, maxTries)
			}
		}
		if r.unattributed > 0 {
			fmt.Fprintf(out, "%s: %d broken exchanges of no request of the run\n", r.fault, r.unattributed)
		}
		fmt.Fprintf(out, "%s: %v; the routes answered %d continuations (%d completed); non-stream P99 rescued %s, plain %s\n",
			r.fault, r.elapsed.Round(time.Millisecond), r.routeContinuations, r.routeContinuationOK,
			quantile(r.pools[poolRescued].completionEnds, 0.99), quantile(r.pools[poolPlain].completionEnds, 0.99))
	}
}

// quantile formats the q-quantile of ds in milliseconds; "-" for none.
func quantile(ds []time.Duration, q float64) string {
	if len(ds) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fms", float64(percentile(ds, q))/float64(time.Millisecond))
}
