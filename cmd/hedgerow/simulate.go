package main

import (
	"strings"

	"github.com/spf13/cobra"

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
	)
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Compare hedge strategies on a seeded workload (discrete-event simulation)",
		Long: `simulate runs the production hedge engine, delay estimator, guardrail, route picking,
budgets and winner gate on virtual time over a seeded workload model, once per strategy,
and prints their latency percentiles next to what they cost.

Strategies: ` + strings.Join(simulator.StrategyNames(), ", ") + `.
Workloads: ` + strings.Join(workload.Names(), ", ") + `.
Pinned conditions: 30 s deadline (failed groups count at it), Poisson arrivals at 50/s,
cost = input tokens × 1 + output tokens × 4, input billed for every attempt.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if strategies != "" {
				opts.Strategies = strings.Split(strategies, ",")
			}
			names := opts.Strategies
			if len(names) == 0 {
				names = simulator.StrategyNames()
			}
			var done func()
			opts.Progress, done = progress(int64(opts.Requests)*int64(len(names)), "simulating", quiet)
			defer done()
			rep, err := simulator.Run(opts)
			if err != nil {
				return err
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
	f.IntVar(&opts.Requests, "requests", 200_000, "requests per strategy")
	f.Uint64Var(&opts.Seed, "seed", 1, "seed of the workload and of every random choice")
	f.BoolVar(&opts.Stream, "stream", false, "measure time to the first committed token instead of the complete answer")
	f.StringVar(&strategies, "strategy", "", "comma-separated strategies (default: all)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object instead of a table")
	f.StringVar(&plotPath, "plot", "", "also draw the latency CDFs to this file (.png, .svg or .pdf)")
	f.BoolVar(&quiet, "quiet", false, "no progress bar")
	return cmd
}
