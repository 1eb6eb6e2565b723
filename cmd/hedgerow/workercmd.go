package main

import (
	"github.com/spf13/cobra"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/node"
	"github.com/hedgerow/hedgerow/schemas"
)

func newWorkerCmd() *cobra.Command {
	var (
		flags         processFlags
		urls, routes  []string
		metricsListen string
	)
	cmd := &cobra.Command{
		Use:   "worker --config FILE [--nats URL,...] [--route NAME,...]",
		Short: "Run workers that call the providers, against an external NATS cluster",
		Long: `worker runs one worker per route (all configured routes, or those named by --route)
on an external NATS cluster. Workers hold the provider keys, read from the environment
variables the routes name. At start they wait for NATS (and Redis, with redis.url) to answer,
retrying with backoff and logging each try (--start-timeout bounds the wait). With redis.url set, each worker holds a lease in Redis
on its route for every attempt it runs (renewed while it runs, expiring if the
process dies), so every gateway's route choice sees the cluster's load; a worker
needs no redis.hash_key_env and never reads it. SIGINT or SIGTERM stops taking
attempts at once and lets those in flight finish within the drain grace. SIGHUP
is logged and ignored: a worker does not reload (routes and keys change with a
restart), and its attempts in flight carry on.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			hup, stopCatching := catchHangups()
			defer stopCatching()
			ctx, stop := signalContext(cmd)
			defer stop()
			cfg, nc, log, err := flags.connect(ctx, cmd, config.RoleWorker, urls, schemas.WorkerServiceName,
				func(*config.Config) []node.Listener { return []node.Listener{{Addr: metricsListen}} })
			if err != nil {
				return cleanStop(err)
			}
			defer nc.Close()
			defer ignoreHangups(ctx, hup, log, flags.configPath)()
			w, err := node.StartWorkers(cfg, nc, node.Options{Logger: log, Routes: routes, MetricsListen: metricsListen})
			if err != nil {
				return err
			}
			attrs := []any{"routes", w.Routes(), "nats", nc.ConnectedUrlRedacted()}
			if a := w.MetricsAddr(); a != nil {
				attrs = append(attrs, "metrics", "http://"+a.String()+"/metrics")
			}
			log.Info("workers serving", attrs...)
			return flags.runUntilDone(ctx, w, log)
		},
	}
	flags.add(cmd, true)
	cmd.Flags().StringSliceVar(&urls, "nats", nil, "NATS servers, comma-separated (overrides nats.urls)")
	cmd.Flags().StringSliceVar(&routes, "route", nil, "routes to serve, comma-separated (default: all)")
	cmd.Flags().StringVar(&metricsListen, "metrics-listen", "", "address to serve GET /metrics on (default: none)")
	return cmd
}
