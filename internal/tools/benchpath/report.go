package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hedgerow/hedgerow/internal/tools/loadgen"
)

// summary is what the run found, printed as one table at its end.
type summary struct {
	idle       map[string]time.Duration // CPU per second of each part, unloaded
	latency    *loadRun
	throughput []*searchResult // non-streaming, then streaming
	cancels    []*cancelResult // quiet, then loaded
	profile    *profileResult
	loadEnd    string
}

// ratio is a/b as "4.6×", or "n/a" when b is not positive (a floor lost
// in the noise has no ratio).
func ratio(a, b float64) string {
	if !(b > 0) || math.IsInf(a, 0) || math.IsNaN(a) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// rateText is a sustained rate: "2,000/s", "≥ 16,000/s" when the search
// stopped at its cap, "< 250/s" when not even its floor held.
func rateText(s *stepSearch) string {
	best, capped := s.best()
	switch {
	case best == 0:
		return fmt.Sprintf("< %g/s", s.min)
	case capped:
		return fmt.Sprintf("≥ %g/s", best)
	}
	return fmt.Sprintf("%g/s", best)
}

// write prints the summary table.
func (s *summary) write(w io.Writer, o options) error {
	mode := "full"
	if o.quick {
		mode = "quick"
	}
	fmt.Fprintf(w, "\n=== bench-path summary (%s run); load average at the end %s ===\n", mode, s.loadEnd)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if l := s.latency; l != nil {
		d, h, p := l.report(nameDirect), l.report(nameHedgerow), l.report(nameProxy)
		fmt.Fprintf(tw, "\nadded latency at %g requests/s each, over calling the fake directly (non-streaming, 20 tokens; direct p50 %.3f p99 %.3f p99.9 %.3f ms; load %s)\n",
			l.rate, d.Latency.P50, d.Latency.P99, d.Latency.P999, l.load)
		fmt.Fprintln(tw, "\thedgerow\tproxy\thedgerow ÷ proxy\tissue 31 asks")
		row := func(name string, hv, pv float64, target string) {
			fmt.Fprintf(tw, "  %s\t%+.3f ms\t%+.3f ms\t%s\t%s\n", name, hv, pv, ratio(hv, pv), target)
		}
		row("p50", h.Latency.P50-d.Latency.P50, p.Latency.P50-d.Latency.P50, "≤ 2×")
		row("p99", h.Latency.P99-d.Latency.P99, p.Latency.P99-d.Latency.P99, "≤ 3×")
		row("p99.9", h.Latency.P999-d.Latency.P999, p.Latency.P999-d.Latency.P999, "")
		hc, pc := ms(l.cpuPerRequest("serve", h.Requests)), ms(l.cpuPerRequest("proxyfloor", p.Requests))
		fmt.Fprintf(tw, "  CPU per request\t%.3f ms\t%.3f ms\t%s\t≤ 3×\n", hc, pc, ratio(hc, pc))
		fmt.Fprintf(tw, "  requests (errors, hedged)\t%d (%d, %d)\t%d (%d)\t\t\n", h.Requests, h.Errors, h.Hedged, p.Requests, p.Errors)
		fakeReqs := d.Requests + h.Requests + h.Hedged + p.Requests
		fmt.Fprintf(tw, "  the fake's CPU per request it served: %.3f ms; the load generator's: %.3f ms\n",
			ms(l.cpuPerRequest("fakellm", fakeReqs)), ms(l.cpuPerRequest("bench", d.Requests+h.Requests+p.Requests)))
		fmt.Fprintf(tw, "  CPU per second unloaded, included above: serve %.1f ms, proxyfloor %.1f ms\n", ms(s.idle["serve"]), ms(s.idle["proxyfloor"]))
		if l.commitWait != nil {
			fmt.Fprintf(tw, "  hedgerow's answers each waited for their commit record's ack (sync_interval %s): %v\n", o.syncText(), l.commitWait)
		}
	}
	if len(s.throughput) > 0 {
		fmt.Fprintf(tw, "\nhighest open-loop rate with p99 ≤ %v (no errors, none held back), by step search\n", o.bound)
		fmt.Fprintln(tw, "\thedgerow\tproxy\thedgerow ÷ proxy\tissue 31 asks")
		for _, t := range s.throughput {
			name := "20 tokens"
			if t.stream {
				name = "streams of 20 tokens"
			}
			hb, _ := t.hedgerow.best()
			pb, _ := t.proxy.best()
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t≥ 0.5×\n", name, rateText(t.hedgerow), rateText(t.proxy), ratio(hb, pb))
			hc, pc := cpuAtBest(t, nameHedgerow, "serve"), cpuAtBest(t, nameProxy, "proxyfloor")
			fmt.Fprintf(tw, "    CPU per request there\t%.3f ms\t%.3f ms\t%s\t≤ 3×\n", ms(hc), ms(pc), ratio(ms(hc), ms(pc)))
		}
	}
	if len(s.cancels) > 0 {
		fmt.Fprintln(tw, "\ncancel as the provider sees it: hedgerow from the winner's first token to the loser's disconnect; direct from the client's cancel to the disconnect")
		fmt.Fprintln(tw, "\thedgerow p50 / p99 / max (n)\tdirect p50 / p99 / max (n)\thedgerow ÷ direct at p99\tissue 31 asks")
		for _, c := range s.cancels {
			name := "quiet"
			if c.loaded {
				name = fmt.Sprintf("under %g/s", o.rate)
			}
			h := loadgen.PercentilesOf(append([]time.Duration(nil), c.hedgerow...))
			d := loadgen.PercentilesOf(append([]time.Duration(nil), c.direct...))
			fmt.Fprintf(tw, "  %s (load %s)\t%.3f / %.3f / %.3f ms (%d)\t%.3f / %.3f / %.3f ms (%d)\t%s\t≤ 3×\n", name, c.load,
				h.P50, h.P99, h.Max, len(c.hedgerow), d.P50, d.P99, d.Max, len(c.direct), ratio(h.P99, d.P99))
			fmt.Fprintf(tw, "    parts: dispatcher, deciding reply → cancel published\t%v\n", c.parts.dispatch)
			fmt.Fprintf(tw, "    parts: worker, cancel received → provider call returned\t%v\n", c.parts.worker)
			fmt.Fprintf(tw, "    the rest (token to the dispatcher, cancel to the worker, disconnect seen), at the means\t%.3f ms\n", meanMs(c.hedgerow)-1000*(c.parts.dispatch.mean()+c.parts.worker.mean()))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if p := s.profile; p != nil {
		t := p.run.targets[0]
		fmt.Fprintf(w, "\nserve's CPU profile at %g requests/s (hedgerow p50 %.3f p99 %.3f ms, %d errors; load %s): %s\n",
			p.rate, t.Latency.P50, t.Latency.P99, t.Errors, p.run.load, p.file)
		fmt.Fprintf(w, "\n-- top 10, flat --\n%s\n-- top 10, cumulative --\n%s", strings.TrimRight(p.flat, "\n"), p.cum)
	}
	return nil
}

// meanMs is the mean of ds in milliseconds (NaN when empty).
func meanMs(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return math.NaN()
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return float64(sum) / float64(len(ds)) / float64(time.Millisecond)
}

// cpuAtBest is the part's CPU per request of the target's step at its
// highest sustained rate (0: none sustained).
func cpuAtBest(t *searchResult, name, part string) time.Duration {
	r := t.atBest[name]
	if r == nil {
		return 0
	}
	return r.cpuPerRequest(part, r.targets[0].Requests)
}
