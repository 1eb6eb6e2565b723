package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/simulator"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

func newSimulateCmd() *cobra.Command {
	var (
		opts       simulator.Options
		strategies string
		asJSON     bool
		plotPath   string
		quiet      bool
		w          whatIf
		regions    int
	)
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Compare hedge strategies on a seeded workload, or replay your own records (discrete-event simulation)",
		Long: `simulate runs the production hedge engine, delay estimator, guardrail, route picking,
budgets and winner gate on virtual time over a seeded workload model, once per strategy,
and prints their latency percentiles next to what they cost.

Strategies: ` + strings.Join(simulator.StrategyNames(), ", ") + `.
Workloads: ` + strings.Join(workload.Names(), ", ") + `.
Pinned conditions: 30 s deadline (failed groups count at it), Poisson arrivals at 50/s,
cost = input tokens × 1 + output tokens × 4, input billed for every attempt.

What-if on your own traffic: --records FILE.jsonl reads sanitized attempt and group
records (one JSON object per line, as published on hedgerow.events.attempt and
hedgerow.events.group) and replays, per cohort, the recorded primaries' first-byte
distribution (cancelled primaries count as censored), answer lengths, decode speed and
arrival rate through the hedgerow rules of --config (defaults without it). --sweep varies
the delay quantile (--quantiles) and optionally the duplicate ceiling (--ceilings) and
prints the frontier — P99, P99.9, duplicate rate and extra cost per setting — and the
setting with the best P99.9 inside the configured ceilings. --sweep without --records
sweeps the built-in --workload. --export-records writes a run's records in that format.

Regions: --regions N (N ≥ 2) splits two global ceilings (a tenant's 200 requests/s, a
route's 6,000 requests/min) into regional leases with the production lease code on
virtual time: in each region two gateways, each a lease.Region on the region's store
(one renews, holding the renewal lock), over an in-memory authority reached with a
50–150 ms round trip per call and 2 % of write replies lost; arrivals at 1.5× each
ceiling, admitted at the share the gateway's lease.Region answers, demand skewed
(80/20 for two regions) and reversed at a quarter of the run, each region's renewer
leaving at 15 % (another gateway takes the renewals over), the busiest region then
cut off from the authority for 60 s, the authority's tables lost at 80 %. It prints the
authority calls and per ceiling the worst 10 s window of global use against the
ceiling, the time every region takes to reach 90 % of its demand-fair share after the
shift and after the heal, what the cut-off region spent once its lease ran out, each
region's refusals and a timeline. --requests (in all, at least 108,000) and --seed
apply; --json prints one object.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("regions") {
				return runRegions(cmd, regions, opts, asJSON)
			}
			if w.records != "" || w.sweep {
				return w.run(cmd, opts, cmd.Flags().Changed("requests"), asJSON, plotPath, quiet)
			}
			if strategies != "" {
				opts.Strategies = strings.Split(strategies, ",")
			}
			names := opts.Strategies
			if len(names) == 0 {
				names = simulator.StrategyNames()
			}
			var sink *simulator.JSONLines
			if w.export != "" {
				f, err := os.Create(w.export)
				if err != nil {
					return fmt.Errorf("export records: %w", err)
				}
				defer f.Close()
				sink = simulator.NewJSONLines(f)
				opts.Records = sink
			}
			var done func()
			opts.Progress, done = progress(int64(opts.Requests)*int64(len(names)), "simulating", quiet)
			defer done()
			rep, err := simulator.Run(opts)
			if err != nil {
				return err
			}
			if sink != nil {
				if err := sink.Flush(); err != nil {
					return fmt.Errorf("export records: %w", err)
				}
			}
			if plotPath != "" {
				if err := rep.WritePlot(plotPath); err != nil {
					return err
				}
			}
			return printReport(cmd.OutOrStdout(), rep, asJSON)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Workload, "workload", workload.GPT4o, "workload model: "+strings.Join(workload.Names(), ", "))
	f.IntVar(&opts.Requests, "requests", 200_000, "requests per strategy (with --records: in all, shared by the cohorts; default as recorded)")
	f.Uint64Var(&opts.Seed, "seed", 1, "seed of the workload and of every random choice")
	f.BoolVar(&opts.Stream, "stream", false, "measure time to the first committed token instead of the complete answer")
	f.StringVar(&strategies, "strategy", "", "comma-separated strategies (default: all)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object instead of a table")
	f.StringVar(&plotPath, "plot", "", "also draw the latency tails on log scales (with --sweep: the frontier) to this file (.png, .svg or .pdf)")
	f.BoolVar(&quiet, "quiet", false, "no progress bar")
	f.StringVar(&w.records, "records", "", "replay the attempt and group records of this JSONL file")
	f.BoolVar(&w.sweep, "sweep", false, "sweep the delay quantile (and --ceilings) and print the frontier")
	f.StringVar(&w.quantiles, "quantiles", "", "comma-separated delay quantiles to sweep (default 0.5,0.75,0.9,0.95,0.97,0.99)")
	f.StringVar(&w.ceilings, "ceilings", "", "comma-separated duplicate ceilings to sweep with every quantile (default: as configured)")
	f.StringVar(&w.config, "config", "", "take the classes' policies and ceilings from this configuration file (default: the defaults)")
	f.Float64Var(&w.maxExtraCost, "max-extra-cost", 0, "extra cost ratio the recommendation must stay within (default: the duplicate ceiling)")
	f.StringVar(&w.export, "export-records", "", "write the run's attempt and group records to this JSONL file (one strategy)")
	f.IntVar(&regions, "regions", 0, "simulate global ceilings split into leases among this many regions (at least 2)")
	return cmd
}

// regionsFlags are the simulate flags that apply with --regions;
// notWithRegions the others, which are refused with it.
var (
	regionsFlags   = []string{"regions", "requests", "seed", "json", "quiet"}
	notWithRegions = []string{"workload", "stream", "strategy", "plot", "records", "sweep", "quantiles",
		"ceilings", "config", "max-extra-cost", "export-records"}
)

// runRegions runs the regions simulation (issue 29) for --regions.
func runRegions(cmd *cobra.Command, regions int, opts simulator.Options, asJSON bool) error {
	if regions < 2 {
		return fmt.Errorf("--regions %d: a ceiling split among regions needs at least 2", regions)
	}
	flags := cmd.Flags()
	var stray []string
	for _, name := range notWithRegions {
		if flags.Changed(name) {
			stray = append(stray, "--"+name)
		}
	}
	applies := 0
	for _, name := range regionsFlags {
		if flags.Changed(name) {
			applies++
		}
	}
	if len(stray) > 0 || flags.NFlag() > applies {
		if len(stray) == 0 {
			stray = []string{"a flag"}
		}
		return fmt.Errorf("%s: not used with --regions, which takes only --requests, --seed, --json and --quiet",
			strings.Join(stray, ", "))
	}
	o := simulator.RegionsOptions{Regions: regions, Seed: opts.Seed, Requests: opts.Requests}
	rep, err := simulator.SimulateRegions(o)
	if err != nil {
		return fmt.Errorf("simulate --regions: %w", err)
	}
	return printReport(cmd.OutOrStdout(), rep, asJSON)
}

// whatIf holds the flags of a replay or sweep.
type whatIf struct {
	records, quantiles, ceilings, config, export string
	sweep                                        bool
	maxExtraCost                                 float64
}

func (w whatIf) run(cmd *cobra.Command, opts simulator.Options, requestsSet, asJSON bool, plotPath string, quiet bool) error {
	if w.export != "" {
		return errors.New("--export-records writes a strategy run's records; it does not combine with --records or --sweep")
	}
	so := simulator.SweepOptions{Seed: opts.Seed, MaxExtraCostRatio: w.maxExtraCost}
	var err error
	if so.Quantiles, err = parseFractions("--quantiles", w.quantiles); err != nil {
		return err
	}
	if so.Ceilings, err = parseFractions("--ceilings", w.ceilings); err != nil {
		return err
	}
	if w.maxExtraCost < 0 {
		return fmt.Errorf("--max-extra-cost %v must be ≥ 0", w.maxExtraCost)
	}
	if w.config != "" {
		cfg, err := config.Load(w.config, config.RoleGateway, os.LookupEnv)
		if err != nil {
			return err
		}
		so.Policy = cfg.PolicyFor
	}
	// A replay without a sweep runs the configured setting alone.
	so.AsConfigured = !w.sweep
	settings := int64(1)
	if w.sweep {
		quantiles := len(so.Quantiles)
		if quantiles == 0 {
			quantiles = len(simulator.DefaultSweepQuantiles)
		}
		settings = int64(quantiles * max(len(so.Ceilings), 1))
	}
	var frontier *simulator.Frontier
	if w.records == "" {
		var done func()
		so.Progress, done = progress(int64(opts.Requests)*settings, "sweeping", quiet)
		defer done()
		if frontier, err = simulator.SweepWorkload(opts, so); err != nil {
			return err
		}
	} else {
		f, err := os.Open(w.records)
		if err != nil {
			return fmt.Errorf("records: %w", err)
		}
		traffic, err := simulator.ReadTraffic(f, w.records)
		f.Close()
		if err != nil {
			return err
		}
		if requestsSet {
			so.Requests = opts.Requests
		}
		var done func()
		so.Progress, done = progress(int64(max(so.Requests, traffic.Groups()))*settings, "replaying", quiet)
		defer done()
		if frontier, err = simulator.SweepRecords(traffic, w.records, so); err != nil {
			return err
		}
	}
	if plotPath != "" {
		if err := frontier.WritePlot(plotPath); err != nil {
			return err
		}
	}
	return printReport(cmd.OutOrStdout(), frontier, asJSON)
}

// parseFractions parses a comma-separated list of numbers in (0, 1].
func parseFractions(flag, list string) ([]float64, error) {
	if list == "" {
		return nil, nil
	}
	var out []float64
	for _, s := range strings.Split(list, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || !(v > 0 && v <= 1) {
			return nil, fmt.Errorf("%s: %q is not a number in (0, 1]", flag, s)
		}
		out = append(out, v)
	}
	return out, nil
}
