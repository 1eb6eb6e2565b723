package main

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/hedgerow/hedgerow/internal/node"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

func newFakeLLMCmd() *cobra.Command {
	var (
		flags   processFlags
		listen  string
		cfg     fakellm.Options
		instant int
	)
	cmd := &cobra.Command{
		Use:   "fakellm [--listen ADDR] [--workload NAME | --instant N] [--seed S] [--time-scale X] [--route N] [--open-early]",
		Short: "Serve a simulated LLM route as an OpenAI-compatible HTTP API",
		Long: `fakellm plays one route of a seeded workload model (the simulator's, as hedgerow simulate plays it) in real time:
POST /v1/chat/completions (streaming or not), GET /v1/models, GET /stats and GET /healthz.
Every route of one run must share --workload and --seed and play a different --route, so a
hedged duplicate draws the same answer with its own latency. --time-scale is real seconds per
model second (0.1 runs the model ten times faster than real time). --open-early opens every
stream at once, as real providers do, and sends its first token at the drawn first byte.

Workloads: ` + strings.Join(workload.Names(), ", ") + `.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := flags.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("instant") {
				if cfg.Model, err = fakellm.InstantModel(instant); err != nil {
					return err
				}
				cfg.Workload = fakellm.InstantName
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			f, err := node.StartFakeLLM(listen, cfg, log)
			if err != nil {
				return err
			}
			log.Info("fakellm serving", "http", "http://"+f.Addr().String(), "workload", cfg.Workload,
				"route", cfg.Route, "seed", cfg.Seed, "time_scale", cfg.TimeScale, "open_early", cfg.OpenEarly)
			return flags.runUntilDone(ctx, f, log)
		},
	}
	flags.add(cmd, false)
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:9101", "address to listen on")
	f.StringVar(&cfg.Workload, "workload", workload.GPT4o, "workload model: "+strings.Join(workload.Names(), ", "))
	f.Uint64Var(&cfg.Seed, "seed", 1, "workload seed, shared by every route of a run")
	f.Float64Var(&cfg.TimeScale, "time-scale", 1, "real seconds per model second")
	f.IntVar(&cfg.Route, "route", 0, "which route of the model to play (0..2)")
	f.StringVar(&cfg.ModelID, "model", "", "model id /v1/models lists (default: the workload's name)")
	f.BoolVar(&cfg.OpenEarly, "open-early", false, "open streams at once (headers, the empty role chunk or message_start and ping) and send the first token at the drawn first byte")
	f.IntVar(&instant, "instant", 0, "instead of --workload, answer every request at once, never failing, with exactly N tokens (for hedgerow bench --compare-direct)")
	return cmd
}
