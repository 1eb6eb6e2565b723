package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/node"
)

// processFlags are the flags every long-running process takes.
type processFlags struct {
	configPath      string
	logLevel        string
	shutdownTimeout time.Duration
	startTimeout    time.Duration
}

func (f *processFlags) add(cmd *cobra.Command, withConfig bool) {
	if withConfig {
		cmd.Flags().StringVar(&f.configPath, "config", "", "configuration file (required)")
		_ = cmd.MarkFlagRequired("config")
		cmd.Flags().DurationVar(&f.startTimeout, "start-timeout", 0,
			"how long to wait at start for NATS and Redis to answer, retrying with backoff (0: until stopped)")
	}
	cmd.Flags().StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	cmd.Flags().DurationVar(&f.shutdownTimeout, "shutdown-timeout", 30*time.Second,
		"how long a graceful stop (SIGINT, SIGTERM) may take before in-flight work is cut")
}

// logger returns a text logger on the command's standard error.
func (f *processFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})), nil
}

// loadConfig loads the --config file for role and prints its problems (or,
// when it loads, its warnings), one per line as config check does, to
// standard error.
func (f *processFlags) loadConfig(cmd *cobra.Command, role config.Role) (*config.Config, error) {
	cfg, err := config.Load(f.configPath, role, os.LookupEnv)
	var problems config.Problems
	switch {
	case errors.As(err, &problems):
		for _, p := range problems {
			if _, werr := fmt.Fprintln(cmd.ErrOrStderr(), p); werr != nil {
				return nil, werr
			}
		}
		return nil, invalidConfigError{file: f.configPath, problems: problems}
	case err != nil:
		return nil, err
	}
	if err := printWarnings(cmd.ErrOrStderr(), cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// process is a started node: it runs until stopped or until it fails.
type process interface {
	Failed() <-chan error
	Stop(ctx context.Context) error
}

// signalContext is the command's context, ended by SIGINT or SIGTERM.
func signalContext(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
}

// runUntilDone waits for ctx to end (a signal) or p to fail, then stops p
// gracefully within the shutdown timeout.
// connect loads the configuration for role, lets --nats urls override
// nats.urls, and connects to the external cluster as name, then waits for
// Redis when redis.url is set: both retried with backoff while they do
// not answer, until ctx ends (errStoppedWaiting) or --start-timeout
// passes (docs/architecture.md §2, "Patience at start"). Meanwhile the
// process's listeners (listeners of the configuration) answer /healthz 200
// and /readyz 503; they are freed before connect returns.
func (f *processFlags) connect(ctx context.Context, cmd *cobra.Command, role config.Role, urls []string, name string,
	listeners func(*config.Config) []node.Listener) (*config.Config, *nats.Conn, *slog.Logger, error) {
	log, err := f.logger(cmd.ErrOrStderr())
	if err != nil {
		return nil, nil, nil, err
	}
	cfg, err := f.loadConfig(cmd, role)
	if err != nil {
		return nil, nil, nil, err
	}
	if len(urls) > 0 {
		cfg.NATS.URLs = urls
	}
	opts, err := node.ClientOptions(cfg.NATS, role, os.LookupEnv)
	if err != nil {
		return nil, nil, nil, err
	}
	waiting, err := node.ServeWaiting(listeners(cfg), "nats", log)
	if err != nil {
		return nil, nil, nil, err
	}
	nc, err := node.ConnectPatiently(ctx, cfg.NATS.URLs, name, f.startTimeout, log, opts...)
	if err == nil {
		waiting.Set("redis")
		if err = node.WaitForRedis(ctx, cfg.Redis, f.startTimeout, log); err != nil {
			nc.Close()
		}
	}
	if stopErr := waiting.Stop(); err == nil && stopErr != nil {
		nc.Close()
		err = stopErr
	}
	if err != nil {
		return nil, nil, nil, stoppedWaiting(ctx, log, err)
	}
	return cfg, nc, log, nil
}

// errStoppedWaiting is what connect returns when a signal ended its wait:
// the process exits cleanly (status 0), having started nothing.
var errStoppedWaiting = errors.New("stopped while waiting at start")

// stoppedWaiting is err, or errStoppedWaiting when ctx ended the wait.
func stoppedWaiting(ctx context.Context, log *slog.Logger, err error) error {
	if ctx.Err() != nil {
		log.Info("stopped while waiting at start")
		return errStoppedWaiting
	}
	return err
}

// cleanStop maps errStoppedWaiting to a clean exit.
func cleanStop(err error) error {
	if errors.Is(err, errStoppedWaiting) {
		return nil
	}
	return err
}

func (f *processFlags) runUntilDone(ctx context.Context, p process, log *slog.Logger) error {
	var failed error
	select {
	case <-ctx.Done():
		log.Info("stopping", "timeout", f.shutdownTimeout)
	case failed = <-p.Failed():
		log.Error("failed, stopping", "err", failed)
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), f.shutdownTimeout)
	defer cancel()
	if err := errors.Join(failed, p.Stop(stopCtx)); err != nil {
		return err
	}
	log.Info("stopped")
	return nil
}

func newServeCmd() *cobra.Command {
	var flags processFlags
	cmd := &cobra.Command{
		Use:   "serve --config FILE",
		Short: "Run gateway and workers in one process around an embedded NATS server",
		Long: `serve runs everything in one process: an embedded NATS server (in-process only,
unless nats.listen is set so workers of other processes can join), one worker per
configured route and the gateway's OpenAI-compatible HTTP front door on http.listen,
with budgets and the winner gate in memory (or on Redis when redis.url is set, which it waits
for at start, retrying with backoff; --start-timeout bounds the wait).
The embedded server runs JetStream on nats.store_dir (default hedgerow/nats/HOST-PORT
under $XDG_STATE_HOME or ~/.local/state, one per http.listen; a temporary directory
removed at stop when its port is 0): the winner gate's ledger and the records
stream (records.stream) are kept there. serve holds a lock on that directory while
it runs: a second serve on it refuses to start, naming the first one's pid. SIGHUP reloads the gateway's tenants, pools
and policies from the same file without a restart (docs/architecture.md §10).
SIGINT or SIGTERM stops it gracefully.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := flags.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			cfg, err := flags.loadConfig(cmd, config.RoleServe)
			if err != nil {
				return err
			}
			store, err := openServeStore(cfg.NATS.StoreDir, cfg.HTTP.Listen)
			if err != nil {
				return err
			}
			defer store.Close()
			cfg.NATS.StoreDir = store.dir
			ctx, stop := signalContext(cmd)
			defer stop()
			if cfg.Redis.URL != "" {
				waiting, err := node.ServeWaiting(node.GatewayListeners(cfg), "redis", log)
				if err != nil {
					return err
				}
				err = errors.Join(node.WaitForRedis(ctx, cfg.Redis, flags.startTimeout, log), waiting.Stop())
				if err != nil {
					return cleanStop(stoppedWaiting(ctx, log, err))
				}
			}
			s, err := node.StartServe(cfg, node.Options{Logger: log, Version: version})
			if err != nil {
				return err
			}
			nats := s.NATSURL()
			if nats == "" {
				nats = "in-process"
			}
			storeDir := cfg.NATS.StoreDir
			stopReloads := reloadOnHangup(ctx, s, func() (*config.Config, error) {
				cfg, err := config.Load(flags.configPath, config.RoleServe, os.LookupEnv)
				if err == nil && cfg.NATS.StoreDir == "" {
					cfg.NATS.StoreDir = storeDir
				}
				return cfg, err
			})
			defer stopReloads()
			log.Info("serving", "http", "http://"+s.HTTPAddr().String(), "nats", nats, "routes", len(cfg.Routes))
			return flags.runUntilDone(ctx, s, log)
		},
	}
	flags.add(cmd, true)
	return cmd
}
