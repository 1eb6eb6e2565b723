package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"time"

	"github.com/spf13/cobra"

	"github.com/hedgerow/hedgerow/internal/tools/cluster"
	"github.com/hedgerow/hedgerow/internal/tools/faultproxy"
)

func newClusterCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster up|down",
		Short: "Run a local, production-shaped cluster from binaries (make cluster)",
		Long: `cluster up starts, in the background, a local hedgerow deployment shaped like
production (docs/architecture.md §12): three nats-server nodes (clustered,
JetStream, per-role users and TLS written by nats-auth), Redis with AOF, three
simulated routes (fakellm), workers, two gateways sharing Redis (the first
through a fault proxy) and Prometheus scraping them; it returns once every part
is ready. Its state, logs, credentials and pid files (<part>.pid) are in --dir.
cluster down stops exactly what up started.`,
	}
	var dir string
	cmd.PersistentFlags().StringVar(&dir, "dir", "bin/cluster", "state directory")
	var (
		natsServer, redisServer, prometheus, alerts string
		natsPorts, gatewayPorts                     []int
		redisPort, promPort                         int
	)
	up := &cobra.Command{
		Use:   "up",
		Short: "Start the cluster and wait until every part is ready",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			self, err := executable()
			if err != nil {
				return err
			}
			if redisServer, err = redisServerPath(redisServer); err != nil {
				return err
			}
			if prometheus == "auto" {
				if prometheus, err = exec.LookPath("prometheus"); err != nil {
					return errors.New("prometheus not found (make prometheus installs it; --prometheus '' runs none)")
				}
			}
			s := cluster.Default(dir, self, natsServer, redisServer, prometheus)
			s.Alerts = alerts
			if len(natsPorts) > 0 {
				s.Ports.NATS = natsPorts
			}
			if len(gatewayPorts) > 0 {
				s.Ports.Gateways = gatewayPorts
			}
			s.Ports.Redis, s.Ports.Prometheus = redisPort, promPort
			return cluster.Up(cmd.Context(), s, cmd.OutOrStdout())
		},
	}
	f := up.Flags()
	def := cluster.DefaultPorts()
	f.StringVar(&natsServer, "nats-server", "bin/nats-server", "nats-server binary")
	f.StringVar(&redisServer, "redis-server", "", "redis-server binary (default: from PATH)")
	f.StringVar(&prometheus, "prometheus", "auto", "prometheus binary (auto: from PATH; empty: none)")
	f.StringVar(&alerts, "alerts", "", "Prometheus alert rule file to load (required to load when given)")
	f.IntSliceVar(&natsPorts, "nats-ports", def.NATS, "NATS client ports, one per node")
	f.IntSliceVar(&gatewayPorts, "gateway-ports", def.Gateways, "gateway API ports")
	f.IntVar(&redisPort, "redis-port", def.Redis, "Redis port")
	f.IntVar(&promPort, "prometheus-port", def.Prometheus, "Prometheus port")
	down, status := downAndStatusCmds("cluster up",
		func(cmd *cobra.Command) error { return cluster.Down(dir, cmd.OutOrStdout()) },
		func(cmd *cobra.Command) error { return cluster.Status(dir, cluster.ManifestFile, cmd.OutOrStdout()) })
	cmd.AddCommand(up, down, status)
	return cmd
}

// redisServerPath is the redis-server binary a local deployment runs: the
// flag's, else the one on PATH.
func redisServerPath(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return "", errors.New("redis-server not found (make redis installs it)")
	}
	return path, nil
}

// downAndStatusCmds are the down and status subcommands of a local
// deployment that starter (e.g. "cluster up") started.
func downAndStatusCmds(starter string, down, status func(*cobra.Command) error) (*cobra.Command, *cobra.Command) {
	return &cobra.Command{
			Use:   "down",
			Short: "Stop every part " + starter + " started and check their ports are free",
			Args:  cobra.NoArgs,
			RunE:  func(cmd *cobra.Command, _ []string) error { return down(cmd) },
		}, &cobra.Command{
			Use:   "status",
			Short: "Print each part and whether it runs; exit 1 unless every part runs",
			Args:  cobra.NoArgs,
			RunE:  func(cmd *cobra.Command, _ []string) error { return status(cmd) },
		}
}

// newFaultProxyCmd is the cluster's fault-injecting TCP proxy (hidden: the
// cluster runs it in front of Redis for its first gateway).
func newFaultProxyCmd() *cobra.Command {
	var listen, upstream, control string
	var delay time.Duration
	cmd := &cobra.Command{
		Use:    "faultproxy --listen ADDR --upstream ADDR --control ADDR",
		Short:  "TCP proxy that partitions its clients from the upstream on POST /partition and delays what it forwards",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signalContext(cmd)
			defer stop()
			p, err := faultproxy.Listen(listen, upstream)
			if err != nil {
				return err
			}
			defer p.Close()
			p.SetDelay(delay)
			srv := &http.Server{Addr: control, Handler: p.Handler(), ReadHeaderTimeout: 5 * time.Second}
			errc := make(chan error, 1)
			go func() { errc <- srv.ListenAndServe() }()
			select {
			case err := <-errc:
				return fmt.Errorf("faultproxy: control: %w", err)
			case <-ctx.Done():
			}
			return srv.Shutdown(context.Background())
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "", "address clients connect to")
	cmd.Flags().StringVar(&upstream, "upstream", "", "address to forward to")
	cmd.Flags().StringVar(&control, "control", "", "address of the control API (POST /partition, POST /heal, POST /delay?d=80ms)")
	cmd.Flags().DurationVar(&delay, "delay", 0, "hold each read this long before forwarding it, each way")
	for _, f := range []string{"listen", "upstream", "control"} {
		_ = cmd.MarkFlagRequired(f)
	}
	return cmd
}

// executable is this binary's path: the cluster runs its gateways,
// workers, routes and proxy from it.
func executable() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("cluster: this binary's path: %w", err)
	}
	return self, nil
}
