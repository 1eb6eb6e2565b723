package peers

import (
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// pooled is one condition's contenders over several seeds' runs: counts
// added, samples joined, so the tail quantiles rest on seeds × requests.
type pooled struct {
	Condition  condition
	Seeds      []uint64
	Contenders []contenderReport
	HedgedArm  contenderReport
}

// pool joins, condition by condition, the reports of runs on different
// seeds (runs[i] holds seed i's conditions, all in the same order).
func pool(seeds []uint64, runs [][]*conditionReport) []pooled {
	if len(runs) == 0 {
		return nil
	}
	out := make([]pooled, len(runs[0]))
	for c := range out {
		p := pooled{Condition: runs[0][c].Condition, Seeds: seeds, Contenders: make([]contenderReport, len(contenderNames))}
		for _, run := range runs {
			rep := run[c]
			for k, cr := range rep.Contenders {
				p.Contenders[k] = joinContender(p.Contenders[k], cr)
			}
			p.HedgedArm = joinContender(p.HedgedArm, rep.HedgedArm)
		}
		out[c] = p
	}
	return out
}

func joinContender(a, b contenderReport) contenderReport {
	a.Name = b.Name
	a.Requests += b.Requests
	a.Errors += b.Errors
	a.Upstream += b.Upstream
	a.Extra += b.Extra
	a.MaxPerRequest = max(a.MaxPerRequest, b.MaxPerRequest)
	a.Unreached += b.Unreached
	for r := range routes {
		a.Primaries[r] += b.Primaries[r]
		a.Extras[r] += b.Extras[r]
	}
	for k, n := range b.ErrorKinds {
		if a.ErrorKinds == nil {
			a.ErrorKinds = map[string]int{}
		}
		a.ErrorKinds[k] += n
	}
	a.ttfts = append(slices.Clip(a.ttfts), b.ttfts...)
	a.ends = append(slices.Clip(a.ends), b.ends...)
	a.TTFT, a.End = summarize(a.ttfts), summarize(a.ends)
	return a
}

// bootstrapResamples is how many resamples bound a pooled ratio.
const bootstrapResamples = 400

// ratioInterval is a seeded percentile-bootstrap 95% interval of
// hedgerow's q-quantile over the best peer's (the lower of the two peers'
// q-quantiles), each contender's samples resampled on their own.
func ratioInterval(h, a, b []time.Duration, q float64, seed uint64) (lo, hi float64) {
	r := rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d))
	resampleQuantile := func(xs, buf []time.Duration) time.Duration {
		for i := range buf {
			buf[i] = xs[r.IntN(len(xs))]
		}
		slices.Sort(buf)
		return quantile(buf, q)
	}
	bh, ba, bb := make([]time.Duration, len(h)), make([]time.Duration, len(a)), make([]time.Duration, len(b))
	ratios := make([]float64, bootstrapResamples)
	for i := range ratios {
		best := min(resampleQuantile(a, ba), resampleQuantile(b, bb))
		ratios[i] = float64(resampleQuantile(h, bh)) / float64(max(best, 1))
	}
	slices.Sort(ratios)
	return ratios[int(0.025*float64(len(ratios)))], ratios[int(0.975*float64(len(ratios)))-1]
}

// writePooled prints each condition's pooled table and hedgerow's ratios
// over the best peer with their bootstrap intervals.
func writePooled(w io.Writer, o options, ps []pooled) {
	for _, p := range ps {
		seeds := make([]string, len(p.Seeds))
		for i, s := range p.Seeds {
			seeds[i] = fmt.Sprint(s)
		}
		fmt.Fprintf(w, "\n== %s — pooled over seeds %s (%d requests per contender); times are real ms, failures count at the deadline\n",
			p.Condition.Name, strings.Join(seeds, ", "), p.Contenders[0].Requests)
		writeContenders(w, p.Contenders, p.HedgedArm)
		writeRoutes(w, p.Condition, p.Contenders)
		rep := &conditionReport{Contenders: p.Contenders}
		a, b := row(p.Contenders, contenderHedgedHTTP), row(p.Contenders, contenderFailsafe)
		interval := func(h, x, y []time.Duration, q float64) string {
			lo, hi := ratioInterval(h, x, y, q, o.Seed)
			return fmt.Sprintf("[%.2f, %.2f]", lo, hi)
		}
		for _, arm := range []struct {
			name string
			h    contenderReport
		}{{"hedgerow", row(p.Contenders, contenderHedgerow)}, {"hedged arm", p.HedgedArm}} {
			if arm.h.Requests == 0 {
				continue
			}
			r := ratiosOf(rep, arm.h)
			fmt.Fprintf(w, "%s / best peer: TTFT P99 %.2f× %s, P99.9 %.2f× %s; end P99 %.2f× %s, P99.9 %.2f× %s; duplicate rate %+.2f points over the lower peer's\n",
				arm.name, r.TTFTP99, interval(arm.h.ttfts, a.ttfts, b.ttfts, 0.99), r.TTFTP999, interval(arm.h.ttfts, a.ttfts, b.ttfts, 0.999),
				r.EndP99, interval(arm.h.ends, a.ends, b.ends, 0.99), r.EndP999, interval(arm.h.ends, a.ends, b.ends, 0.999), r.DupPoints)
			if arm.name == "hedgerow" {
				writeVerdict(w, p.Condition, r)
			}
		}
		fmt.Fprintf(w, "(95%% seeded bootstrap intervals, %d resamples of each contender's pooled requests)\n", bootstrapResamples)
	}
}

// writeSummary prints one line per condition: hedgerow's TTFT ratios over
// the best peer with their bootstrap intervals, against the condition's
// target, and every contender's duplicate rate — the figures the uneven
// routes are judged by, pooled over the seeds run (one seed: its own).
func writeSummary(w io.Writer, o options, ps []pooled) {
	fmt.Fprintf(w, "\n== summary over seeds %s: hedgerow's TTFT over the best peer (95%% bootstrap intervals) against the target; duplicate rates counted at the fakes\n",
		strings.Join(seedNames(ps), ", "))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "condition\tP99\tP99.9\ttarget\t")
	for _, name := range contenderNames {
		fmt.Fprintf(tw, "%s dup\t", name)
	}
	fmt.Fprintln(tw, "hedgerow primaries on degraded")
	for _, p := range ps {
		h, a, b := row(p.Contenders, contenderHedgerow), row(p.Contenders, contenderHedgedHTTP), row(p.Contenders, contenderFailsafe)
		r := ratiosOf(&conditionReport{Contenders: p.Contenders}, h)
		lo99, hi99 := ratioInterval(h.ttfts, a.ttfts, b.ttfts, 0.99, o.Seed)
		lo999, hi999 := ratioInterval(h.ttfts, a.ttfts, b.ttfts, 0.999, o.Seed)
		fmt.Fprintf(tw, "%s\t%.2f× [%.2f, %.2f]\t%.2f× [%.2f, %.2f]\t≤ %.2f×, ≤ %.2f×: %s\t",
			p.Condition.Name, r.TTFTP99, lo99, hi99, r.TTFTP999, lo999, hi999,
			p.Condition.TargetP99, p.Condition.TargetP999, verdictAt(p.Condition, r.TTFTP99, r.TTFTP999, r.DupPoints))
		for _, c := range p.Contenders {
			fmt.Fprintf(tw, "%.2f%%\t", 100*c.DuplicateRate())
		}
		if p.Condition.Uneven {
			fmt.Fprintf(tw, "%.1f%%\n", 100*share(h.Primaries[degradedRoute], h.Requests))
		} else {
			fmt.Fprintln(tw, "-")
		}
	}
	_ = tw.Flush()
}

func seedNames(ps []pooled) []string {
	if len(ps) == 0 {
		return nil
	}
	out := make([]string, len(ps[0].Seeds))
	for i, s := range ps[0].Seeds {
		out[i] = fmt.Sprint(s)
	}
	return out
}

func share(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return float64(n) / float64(of)
}
