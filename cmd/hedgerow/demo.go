package main

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/hedgerow/hedgerow/internal/tools/demo"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

func newDemoCmd() *cobra.Command {
	opts := demo.DefaultOptions()
	var (
		asJSON bool
		quiet  bool
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the live system under load, primary-only against hedged, and compare",
		Long: `demo starts three fake LLM routes on loopback and serve in front of them, warms the
hedge-delay estimator up, then sends one seeded sequence of streaming requests
(Poisson arrivals, open loop) twice through the HTTP front door: once primary-only,
once hedged. It prints both side by side in the shape of ` + "`hedgerow simulate`" + `
(strategies none and hedgerow, times in model milliseconds: real ÷ time scale),
with the P99 of commit → upstream disconnect of cancelled losers (real ms), the
output tokens billed to losers, and the double commits an independent subscriber
of the records saw. With --open-early the fake routes open every stream at once
and stall until the drawn first byte before the first token, as real providers do.

Workloads: ` + strings.Join(workload.Names(), ", ") + `.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var done func()
			opts.Progress, done = progress(int64(opts.Warmup)+2*int64(opts.Requests), "demo", quiet)
			defer done()
			ctx, stop := signalContext(cmd)
			defer stop()
			rep, err := demo.Run(ctx, opts)
			if err != nil {
				return err
			}
			return printReport(cmd.OutOrStdout(), rep, asJSON)
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Requests, "requests", opts.Requests, "requests per measured run")
	f.IntVar(&opts.Warmup, "warmup", opts.Warmup, "hedged requests before the measured runs, so the hedge delay is learned")
	f.Float64Var(&opts.Rate, "rate", opts.Rate, "Poisson arrival rate, requests per real second")
	f.Float64Var(&opts.TimeScale, "time-scale", opts.TimeScale, "real seconds per model second")
	f.Uint64Var(&opts.Seed, "seed", opts.Seed, "seed of the workload and the arrivals")
	f.StringVar(&opts.Workload, "workload", opts.Workload, "workload model of the fake routes: "+strings.Join(workload.Names(), ", "))
	f.BoolVar(&opts.OpenEarly, "open-early", opts.OpenEarly, "the fake routes open streams at once and stall before the first token, as real providers do")
	f.BoolVar(&asJSON, "json", false, "print one JSON object instead of a table")
	f.BoolVar(&quiet, "quiet", false, "no progress bar")
	return cmd
}
