package main

import (
	"github.com/spf13/cobra"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/node"
)

func newGatewayCmd() *cobra.Command {
	var (
		flags processFlags
		urls  []string
	)
	cmd := &cobra.Command{
		Use:   "gateway --config FILE [--nats URL,...]",
		Short: "Run the gateway (dispatcher and HTTP front door) against an external NATS cluster",
		Long: `gateway runs the dispatcher behind the OpenAI-compatible HTTP front door on
http.listen and publishes attempts to the workers over an external NATS cluster. It never
reads provider keys. It refuses a NATS cluster whose max_payload is below nats.max_payload,
and (for now) a configuration with redis.url set. SIGINT or SIGTERM stops it gracefully.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signalContext(cmd)
			defer stop()
			cfg, nc, log, err := flags.connect(cmd, config.RoleGateway, urls, "hedgerow-gateway")
			if err != nil {
				return err
			}
			defer nc.Close()
			g, err := node.StartGateway(cfg, nc, nil, node.Options{Logger: log})
			if err != nil {
				return err
			}
			log.Info("gateway serving", "http", "http://"+g.Addr().String(), "nats", nc.ConnectedUrlRedacted())
			return flags.runUntilDone(ctx, g, log)
		},
	}
	flags.add(cmd, true)
	cmd.Flags().StringSliceVar(&urls, "nats", nil, "NATS servers, comma-separated (overrides nats.urls)")
	return cmd
}
