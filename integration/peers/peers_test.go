package peers

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/simulator/workload"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// hedgedhttp runs its attempts on a package-level pool whose
		// workers linger 10 s after their last task.
		goleak.IgnoreTopFunction("github.com/cristalhq/hedgedhttp.runInPool.func1"),
		goleak.IgnoreAnyFunction("github.com/cristalhq/hedgedhttp.runInPool.func1"),
	)
}

// The full comparison's settings, as `make compare-peers` passes them.
var (
	flagRequests   = flag.Int("peers.requests", 6000, "measured streaming requests per contender")
	flagWarmup     = flag.Int("peers.warmup", 1000, "unmeasured warm-up requests for hedgerow (none sends three times as many)")
	flagRate       = flag.Float64("peers.rate", 100, "Poisson arrivals per real second, all contenders together")
	flagScale      = flag.Float64("peers.scale", 0.2, "time scale: real seconds per model second")
	flagDelay      = flag.Duration("peers.delay", 0, "pin the peers' hedge delay (real time); 0: the P95 of none's time to first token over the warm-up's second half")
	flagDelayFrom  = flag.String("peers.delay-from", "warm-up", "where the peers' delay comes from unless pinned: warm-up (the P95 of none's time to first token) or hedgerow (the median delay hedgerow's groups armed in the warm-up)")
	flagOracle     = flag.Bool("peers.oracle", false, "under uneven routes, leave the degraded route out of hedgerow's pool: the bound any route choice can reach")
	flagSeed       = flag.Uint64("peers.seed", 1, "seed of the workload, the arrivals and the interleaving")
	flagSeeds      = flag.String("peers.seeds", "", "comma-separated seeds to run one after the other and pool (overrides -peers.seed)")
	flagWorkload   = flag.String("peers.workload", workload.GPT4o, "the fake routes' workload model")
	flagConditions = flag.String("peers.conditions", "both", "first-token (headers at the first token), open-early, both (those two), "+
		"uneven (one degraded route, first and then last in the peers' order; also uneven-first, uneven-last), or all (both, then uneven)")
)

// conditionsOf reads -peers.conditions: both keeps its meaning (the two
// equal-route conditions); all runs every condition.
func conditionsOf(name string) ([]condition, error) {
	switch name {
	case "both":
		return []condition{conditionHeadersAtFirstToken, conditionOpenEarly}, nil
	case "first-token":
		return []condition{conditionHeadersAtFirstToken}, nil
	case "open-early":
		return []condition{conditionOpenEarly}, nil
	case "uneven":
		return []condition{conditionUnevenFirst, conditionUnevenLast}, nil
	case "uneven-first":
		return []condition{conditionUnevenFirst}, nil
	case "uneven-last":
		return []condition{conditionUnevenLast}, nil
	case "all":
		return []condition{conditionHeadersAtFirstToken, conditionOpenEarly, conditionUnevenFirst, conditionUnevenLast}, nil
	}
	return nil, fmt.Errorf("-peers.conditions: unknown conditions %q: want first-token, open-early, both, uneven, uneven-first, uneven-last or all", name)
}

// BenchmarkComparePeers is the full comparison: every contender on the same
// live fakes, one seeded interleaved load per condition, the table printed
// to standard output. Each iteration is a whole comparison (minutes), so
// run it with -benchtime 1x; its metrics are the first condition's ratios
// and duplicate rates.
func BenchmarkComparePeers(b *testing.B) {
	conds, err := conditionsOf(*flagConditions)
	if err != nil {
		b.Fatal(err)
	}
	seeds, err := seedsOf(*flagSeeds, *flagSeed)
	if err != nil {
		b.Fatal(err)
	}
	if *flagDelayFrom != "warm-up" && *flagDelayFrom != "hedgerow" {
		b.Fatalf("-peers.delay-from %q: want warm-up or hedgerow", *flagDelayFrom)
	}
	o := options{
		PerContender: *flagRequests, Warmup: *flagWarmup, Rate: *flagRate, TimeScale: *flagScale, Delay: *flagDelay,
		DelayFromHedgerow: *flagDelayFrom == "hedgerow", Oracle: *flagOracle, Workload: *flagWorkload, Conditions: conds,
		Log: func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
		},
	}
	for range b.N {
		var runs [][]*conditionReport
		for _, seed := range seeds {
			o.Seed = seed
			reps, err := compare(context.Background(), o)
			if err != nil {
				b.Fatal(err)
			}
			writeTable(os.Stdout, o, reps)
			runs = append(runs, reps)
		}
		o.Seed = seeds[0]
		pools := pool(seeds, runs)
		if len(seeds) > 1 {
			writePooled(os.Stdout, o, pools)
		}
		writeSummary(os.Stdout, o, pools)
		r := ratiosOf(&conditionReport{Contenders: pools[0].Contenders}, row(pools[0].Contenders, contenderHedgerow))
		b.ReportMetric(r.TTFTP99, "ttft-p99/best-peer")
		b.ReportMetric(r.TTFTP999, "ttft-p99.9/best-peer")
		b.ReportMetric(r.EndP999, "end-p99.9/best-peer")
		b.ReportMetric(r.DupPoints, "dup-points-over-peer")
	}
}

// seedsOf reads -peers.seeds, or falls back to the single seed.
func seedsOf(list string, single uint64) ([]uint64, error) {
	if strings.TrimSpace(list) == "" {
		return []uint64{single}, nil
	}
	var out []uint64
	for _, f := range strings.Split(list, ",") {
		s, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("-peers.seeds %q: %w", list, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// A small interleaved run of every contender, headers at the first token
// (open early only changes the fakes' OpenEarly flag), on equal routes and
// on uneven ones with the degraded route first: the harness works — every
// contender answers, the duplicates counted by request at the fakes add up
// to the fakes' own totals and to the counts by route, nobody sends more
// than max_attempts to the providers, none never sends a duplicate, and on
// uneven routes the direct contenders send every primary to the first
// route of their order. Timing figures are the benchmark's, not this
// test's.
func TestSmokeRunEveryContenderAnswersAndUpstreamCountsAddUp(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the live system")
	}
	o := options{
		// A slow model (time scale 0.2: a 6 s deadline) at a low rate so
		// the race detector's slowdown on a busy machine does not turn the
		// run into timeouts.
		PerContender: 25, Warmup: 30, Rate: 40, TimeScale: 0.2, Seed: 7, Workload: workload.GPT4o,
		Conditions: []condition{conditionHeadersAtFirstToken, conditionUnevenFirst},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	reps, err := compare(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != len(o.Conditions) {
		t.Fatalf("%d condition reports, want %d", len(reps), len(o.Conditions))
	}
	for _, rep := range reps {
		if rep.Delay <= 0 || rep.Delay > o.deadline() {
			t.Errorf("%s: peers' delay %v, want within (0, %v]", rep.Condition.Name, rep.Delay, o.deadline())
		}
		upstream := 0
		for i, c := range rep.Contenders {
			upstream += c.Upstream
			if c.Name != contenderNames[i] || c.Requests != o.PerContender {
				t.Errorf("%s: contender %d is %q with %d requests, want %q with %d",
					rep.Condition.Name, i, c.Name, c.Requests, contenderNames[i], o.PerContender)
			}
			// Every contender answers; how many of its requests fail on a
			// loaded machine is a figure for the benchmark, not a rule.
			if c.Errors >= c.Requests {
				t.Errorf("%s: %s answered none of its %d requests: %v", rep.Condition.Name, c.Name, c.Requests, c.ErrorKinds)
			}
			if c.Unreached != 0 || c.MaxPerRequest > maxAttempts {
				t.Errorf("%s: %s: %d requests never reached a fake, up to %d upstream requests for one; want 0 and ≤ %d",
					rep.Condition.Name, c.Name, c.Unreached, c.MaxPerRequest, maxAttempts)
			}
			if c.Upstream != c.Requests+c.Extra {
				t.Errorf("%s: %s: %d upstream requests for %d requests and %d extra", rep.Condition.Name, c.Name, c.Upstream, c.Requests, c.Extra)
			}
			primaries, extras := 0, 0
			for r := range routes {
				primaries += c.Primaries[r]
				extras += c.Extras[r]
			}
			if primaries != c.Requests-c.Unreached || primaries+extras != c.Upstream {
				t.Errorf("%s: %s: %v primaries and %v duplicates by route for %d requests reaching a fake, %d upstream",
					rep.Condition.Name, c.Name, c.Primaries, c.Extras, c.Requests-c.Unreached, c.Upstream)
			}
			if first := rep.Condition.order()[0]; rep.Condition.Uneven && c.Name != contenderHedgerow && c.Primaries[first] != primaries {
				t.Errorf("%s: %s sent primaries %v by route, want all on route %d, the first of its order",
					rep.Condition.Name, c.Name, c.Primaries, first)
			}
		}
		if int64(upstream) != rep.UpstreamRequests {
			t.Errorf("%s: %d upstream requests counted by request, the fakes' totals say %d",
				rep.Condition.Name, upstream, rep.UpstreamRequests)
		}
		if none := rep.Contenders[0]; none.Extra != 0 {
			t.Errorf("%s: none sent %d duplicates, want 0", rep.Condition.Name, none.Extra)
		}
	}
	var b strings.Builder
	writeTable(&b, o, reps)
	writeSummary(&b, o, pool([]uint64{o.Seed}, [][]*conditionReport{reps}))
	for _, name := range contenderNames {
		if !strings.Contains(b.String(), name) {
			t.Errorf("table has no row for %s:\n%s", name, b.String())
		}
	}
	t.Log("\n" + b.String())
}

func TestPeersConditionsKeepBothAndAddTheUnevenOrders(t *testing.T) {
	tests := []struct {
		name string
		want []condition
	}{
		{"both", []condition{conditionHeadersAtFirstToken, conditionOpenEarly}},
		{"uneven", []condition{conditionUnevenFirst, conditionUnevenLast}},
		{"uneven-last", []condition{conditionUnevenLast}},
		{"all", []condition{conditionHeadersAtFirstToken, conditionOpenEarly, conditionUnevenFirst, conditionUnevenLast}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := conditionsOf(tt.name)
			if err != nil || !slices.Equal(got, tt.want) {
				t.Errorf("conditionsOf(%q) = %v, %v; want %v", tt.name, got, err, tt.want)
			}
		})
	}
	if _, err := conditionsOf("lopsided"); err == nil || !strings.Contains(err.Error(), "-peers.conditions") {
		t.Errorf("an unknown condition gave %v, want an error naming -peers.conditions", err)
	}
	if first, last := conditionUnevenFirst.order(), conditionUnevenLast.order(); first[0] != degradedRoute || last[routes-1] != degradedRoute {
		t.Errorf("route orders %v and %v: want the degraded route %d first and then last", first, last, degradedRoute)
	}
}

// The oracle leaves exactly the degraded route out of hedgerow's pool, and
// only under uneven routes; the peers' order never changes.
func TestTheOracleLeavesOnlyTheDegradedRouteOutOfHedgerowsPool(t *testing.T) {
	tests := []struct {
		c    condition
		want []int
	}{
		{conditionHeadersAtFirstToken, conditionHeadersAtFirstToken.order()},
		{conditionOpenEarly, conditionOpenEarly.order()},
		{conditionUnevenFirst, []int{1, 2}},
		{conditionUnevenLast, []int{1, 2}},
	}
	for _, tt := range tests {
		if got := (options{}).hedgerowOrder(tt.c); !slices.Equal(got, tt.c.order()) {
			t.Errorf("%s without the oracle: hedgerow's order %v, want the peers' %v", tt.c.Name, got, tt.c.order())
		}
		if got := (options{Oracle: true}).hedgerowOrder(tt.c); !slices.Equal(got, tt.want) {
			t.Errorf("%s with the oracle: hedgerow's order %v, want %v", tt.c.Name, got, tt.want)
		}
	}
}
