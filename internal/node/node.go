package node

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/redact"
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
	// records. Gateways and workers that should correlate must share it;
	// nil takes the key redis.hash_key_env names, or draws a random key per
	// process (serve shares its key between its gateway and workers).
	FingerprintKey []byte
	// Routes limits a worker process to these routes; empty serves all.
	Routes []string
	// MetricsListen is the address a worker process serves GET /metrics on;
	// empty serves none. (Gateways serve /metrics next to their API.)
	MetricsListen string
	// DrainGrace is how long stopping workers let attempts finish before
	// cancelling them; 0 means worker.DefaultDrainGrace.
	DrainGrace time.Duration
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
func Connect(urls []string, name string, log *slog.Logger) (*nats.Conn, error) {
	if len(urls) == 0 {
		return nil, errors.New("nats: no server URLs (set nats.urls or --nats)")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opts := append(connOptions(log),
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
	nc, err := nats.Connect(strings.Join(urls, ","), opts...)
	if err != nil {
		// Both the URLs and nats.Connect's error (it quotes a URL it cannot
		// parse) may hold a password: docs/architecture.md §9.
		return nil, fmt.Errorf("nats: connect to %s: %w", redact.URLs(urls), redact.Error(err))
	}
	return nc, nil
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
