package main

import (
	"os"

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
reads provider keys. At start it waits for NATS (and Redis, with redis.url) to answer, retrying
with backoff and logging each try, and listens only once they do (--start-timeout bounds the
wait). It refuses a NATS cluster whose max_payload is below nats.max_payload,
and (for now) a configuration with redis.url set. SIGHUP reloads tenants, routes, pools and policies from the same file without a
restart (docs/architecture.md §10); a file with problems leaves the running
configuration serving. SIGINT or SIGTERM stops it gracefully.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signalContext(cmd)
			defer stop()
			cfg, nc, log, err := flags.connect(ctx, cmd, config.RoleGateway, urls, "hedgerow-gateway", node.GatewayListeners)
			if err != nil {
				return cleanStop(err)
			}
			defer nc.Close()
			g, err := node.StartGateway(cfg, nc, nil, node.Options{Logger: log, Version: version})
			if err != nil {
				return err
			}
			stopReloads := reloadOnHangup(ctx, gatewayReloader{g}, func() (*config.Config, error) {
				cfg, err := config.Load(flags.configPath, config.RoleGateway, os.LookupEnv)
				if err == nil && len(urls) > 0 {
					cfg.NATS.URLs = urls
				}
				return cfg, err
			})
			defer stopReloads()
			log.Info("gateway serving", "http", "http://"+g.Addr().String(), "nats", nc.ConnectedUrlRedacted())
			return flags.runUntilDone(ctx, g, log)
		},
	}
	flags.add(cmd, true)
	cmd.Flags().StringSliceVar(&urls, "nats", nil, "NATS servers, comma-separated (overrides nats.urls)")
	return cmd
}

// gatewayReloader reloads a gateway process, which runs no workers.
type gatewayReloader struct{ g *node.Gateway }

func (r gatewayReloader) Reload(load func() (*config.Config, error)) error {
	return r.g.Reload(load, false)
}
