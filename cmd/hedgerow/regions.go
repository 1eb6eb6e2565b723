package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/hedgerow/hedgerow/internal/tools/regions"
)

func newRegionsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "regions up|down|status|link",
		Short: "Run two regions on one host, joined through a delaying fault proxy (make regions)",
		Long: `regions up starts, in the background, two hedgerow regions on this host
(docs/architecture.md §12, §14), east and west: each its own nats-server
(JetStream, TLS, the region's per-role users and gateway links written by
nats-auth), its own Redis, a worker and a gateway (east's on
http://127.0.0.1:8281, west's on http://127.0.0.1:8282, /metrics on the same
ports; pool general, key local-dev-key), sharing three simulated routes. The
regions form a NATS supercluster whose links pass through fault proxies that
delay them (--delay, 80ms each way) and can cut them: regions link. It returns
once every part is ready. State, logs, credentials and the nats-server
configurations are in --dir; regions down stops exactly what up started.`,
	}
	var dir string
	cmd.PersistentFlags().StringVar(&dir, "dir", "bin/regions", "state directory")
	var (
		natsServer, redisServer string
		delay                   time.Duration
	)
	up := &cobra.Command{
		Use:   "up",
		Short: "Start both regions and wait until every part is ready and the regions are linked",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			self, err := executable()
			if err != nil {
				return err
			}
			if redisServer, err = redisServerPath(redisServer); err != nil {
				return err
			}
			s := regions.Default(dir, self, natsServer, redisServer)
			s.Delay = delay
			return regions.Up(cmd.Context(), s, cmd.OutOrStdout())
		},
	}
	up.Flags().StringVar(&natsServer, "nats-server", "bin/nats-server", "nats-server binary (make nats-server builds it)")
	up.Flags().StringVar(&redisServer, "redis-server", "", "redis-server binary (default: from PATH)")
	up.Flags().DurationVar(&delay, "delay", regions.DefaultDelay, "the link's delay each way")
	down, status := downAndStatusCmds("regions up",
		func(cmd *cobra.Command) error { return regions.Down(dir, cmd.OutOrStdout()) },
		func(cmd *cobra.Command) error { return regions.Status(cmd.Context(), dir, cmd.OutOrStdout()) })
	var cut, heal bool
	var linkDelay time.Duration
	link := &cobra.Command{
		Use:   "link [--delay D] [--cut | --heal]",
		Short: "Set the link's delay, cut it or heal it (both ways), and print its state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cut && heal {
				return errors.New("--cut or --heal, not both")
			}
			m, err := regions.ReadManifest(dir)
			if err != nil {
				return fmt.Errorf("%w (make regions first)", err)
			}
			var state *bool
			if cut || heal {
				state = &cut
			}
			d := time.Duration(-1)
			if cmd.Flags().Changed("delay") {
				if linkDelay < 0 {
					return errors.New("--delay: a duration of 0 or more")
				}
				d = linkDelay
			}
			if err := m.Link(cmd.Context(), d, state); err != nil {
				return err
			}
			s, err := m.LinkState(cmd.Context())
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), "link:", s)
			return err
		},
	}
	link.Flags().DurationVar(&linkDelay, "delay", regions.DefaultDelay, "delay each way")
	link.Flags().BoolVar(&cut, "cut", false, "cut the link both ways (nothing forwarded, as a network dropping packets)")
	link.Flags().BoolVar(&heal, "heal", false, "heal the link")
	cmd.AddCommand(up, down, status, link)
	return cmd
}
