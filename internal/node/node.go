package node

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/redact"
	"github.com/hedgerow/hedgerow/schemas"
)

// Options are the settings of a process that do not come from its
// configuration file.
type Options struct {
	// Env looks up the environment variables the configuration names (the
	// routes' provider keys); nil means os.LookupEnv.
	Env config.LookupEnv
	// Logger receives operational logs; nil discards them.
	Logger *slog.Logger
	// FingerprintKey keys the prompt fingerprints and user action ids of
	// records. In a gateway or serve, nil takes the key redis.hash_key_env
	// names, or draws a random key per process (serve shares its key
	// between its gateway and workers); a worker process never reads the
	// hash key, and nil there gives each worker a random key of its own
	// (StartWorkers).
	FingerprintKey []byte
	// Routes limits a worker process to these routes; empty serves all.
	Routes []string
	// MetricsListen is the address a worker process serves GET /metrics on;
	// empty serves none. (Gateways serve /metrics next to their API.)
	MetricsListen string
	// DrainGrace is how long stopping workers let attempts finish before
	// cancelling them; 0 means worker.DefaultDrainGrace.
	DrainGrace time.Duration
	// Version is the build's version, which traces name as service.version.
	Version string
}

func (o Options) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Logger
}

func (o Options) env() config.LookupEnv {
	if o.Env == nil {
		return os.LookupEnv
	}
	return o.Env
}

// Connect connects to an external NATS cluster at urls, as gateway and
// worker processes do. It fails at once when no server answers, so a wrong
// address is seen at start; once connected it reconnects forever, across
// the cluster's servers, logging each disconnect and reconnect.
//
// opts (ClientOptions) come after the defaults.
func Connect(urls []string, name string, log *slog.Logger, opts ...nats.Option) (*nats.Conn, error) {
	// An empty URL would make nats.go dial its default, 127.0.0.1:4222:
	// whatever server happens to run there, never the one meant.
	if len(urls) == 0 || slices.Contains(urls, "") {
		return nil, errors.New("nats: no server URLs (set nats.urls or --nats)")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	all := append(connOptions(log),
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", redact.Error(err))
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "server", nc.ConnectedUrlRedacted())
		}),
	)
	all = append(all, opts...)
	nc, err := nats.Connect(strings.Join(urls, ","), all...)
	if err != nil {
		// Both the URLs and nats.Connect's error (it quotes a URL it cannot
		// parse) may hold a password: docs/architecture.md §9.
		return nil, fmt.Errorf("nats: connect to %s: %w", redact.URLs(urls), redact.Error(err))
	}
	return nc, nil
}

// ClientOptions are the options of a connection of role to NATS: its
// inbox prefix (natsauth: the only inboxes the role's user may read) and,
// as nats configures them, its credentials and TLS
// (docs/architecture.md §13). A password comes from the environment
// variable nats.password_env names, read through env; a missing one is an
// error naming the variable, never a value.
func ClientOptions(n config.NATS, role config.Role, env config.LookupEnv) ([]nats.Option, error) {
	if env == nil {
		env = os.LookupEnv
	}
	opts, err := authOptions(n, env)
	if err != nil {
		return nil, err
	}
	if n.TLS.Enabled() {
		opts = append(opts, nats.Secure(&tls.Config{ServerName: n.TLS.ServerName, MinVersion: tls.VersionTLS12}))
		if n.TLS.CAFile != "" {
			opts = append(opts, nats.RootCAs(n.TLS.CAFile))
		}
		if n.TLS.CertFile != "" {
			opts = append(opts, nats.ClientCert(n.TLS.CertFile, n.TLS.KeyFile))
		}
	}
	return append(opts, nats.CustomInboxPrefix(inboxPrefix(role))), nil
}

// authOptions are the credentials of a connection: none, a user and the
// password from the environment, an nkey seed file or a creds file.
func authOptions(n config.NATS, env config.LookupEnv) ([]nats.Option, error) {
	switch {
	case n.User != "":
		pw, ok := env(n.PasswordEnv)
		if !ok || pw == "" {
			return nil, fmt.Errorf("nats: environment variable %s (nats.password_env) is not set", n.PasswordEnv)
		}
		return []nats.Option{nats.UserInfo(n.User, pw)}, nil
	case n.NKeySeedFile != "":
		opt, err := nats.NkeyOptionFromSeed(n.NKeySeedFile)
		if err != nil {
			// nats.go's error names the file, never the seed.
			return nil, fmt.Errorf("nats: nats.nkey_seed_file: %w", err)
		}
		return []nats.Option{opt}, nil
	case n.CredsFile != "":
		if _, err := os.Stat(n.CredsFile); err != nil {
			return nil, fmt.Errorf("nats: nats.creds_file: %w", err)
		}
		return []nats.Option{nats.UserCredentials(n.CredsFile)}, nil
	}
	return nil, nil
}

// inboxPrefix is the inbox prefix of role's connections; serve's gateway
// connection is a gateway's.
func inboxPrefix(role config.Role) string {
	if role == config.RoleWorker {
		return schemas.WorkerInboxPrefix
	}
	return schemas.GatewayInboxPrefix
}

// checkPermissions fails when the server refused anything the process
// asked of it so far: a user whose permissions do not cover what this
// process serves (a worker user of other routes) would otherwise start
// and never take an attempt. The server answers a refused subscription
// before the flush's PONG, so one flush sees it.
func checkPermissions(nc *nats.Conn) error {
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("nats: flush: %w", err)
	}
	if err := nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) {
		return fmt.Errorf("%w (the NATS user's permissions do not cover this process: regenerate them with `hedgerow nats-auth`, e.g. --worker NAME=ROUTE,ROUTE for the routes it serves)", err)
	}
	return nil
}

// connOptions are the options of every connection a process opens.
func connOptions(log *slog.Logger) []nats.Option {
	return []nats.Option{
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			log.Warn("nats async error", "subject", subject, "err", redact.Error(err))
		}),
	}
}

// newRegistry returns a registry holding the Go runtime and process
// collectors, which every process exports next to its own metrics.
func newRegistry() (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return reg, nil
}

// fingerprintKey returns o's key, or a fresh random one.
func (o Options) fingerprintKey(cfg *config.Config) ([]byte, error) {
	if len(o.FingerprintKey) > 0 {
		return o.FingerprintKey, nil
	}
	if name := cfg.Redis.HashKeyEnv; name != "" {
		// Replicas sharing one Redis must hash an Idempotency-Key to the
		// same user action id; config validation saw the variable set.
		if v, ok := o.env()(name); ok && v != "" {
			return []byte(v), nil
		}
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("fingerprint key: %w", err)
	}
	return key, nil
}

// unwindTimeout bounds releasing what a failed Start had already started;
// nothing has served a request yet, so there is nothing worth waiting for.
const unwindTimeout = 5 * time.Second

// unwind runs stop bounded by unwindTimeout.
func unwind(stop func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), unwindTimeout)
	defer cancel()
	return stop(ctx)
}
