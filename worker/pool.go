package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/worker/upstream"
)

// PoolOptions are the optional settings of StartPool.
type PoolOptions struct {
	// Routes limits the pool to these routes; empty runs every configured
	// route.
	Routes []string
	// Metrics is shared by every worker of the pool; nil counts into
	// collectors no registry sees.
	Metrics *Metrics
	// Logger receives the workers' operational logs; nil discards them.
	Logger *slog.Logger
	// FingerprintKey keys the prompt fingerprints of records; it must be
	// the dispatcher's for records to correlate (see Config).
	FingerprintKey []byte
	// DrainGrace is how long Stop lets in-flight attempts finish; 0 means
	// DefaultDrainGrace.
	DrainGrace time.Duration
	// Leases, when set, is where every worker of the pool records its
	// attempts in flight (see Config.Leases): the shared budget store when
	// redis.url is set.
	Leases Leases
}

// Pool is the set of workers of one process, one per route.
type Pool struct {
	workers []*Worker
}

// StartPool starts one Worker per route of cfg (or of opts.Routes) on nc.
// Each route's adapter gets the route's base_url and model, and the provider
// key read through env from the variable the route names — keys are only
// ever read here, in workers. The workers heartbeat at the shortest
// heartbeat_interval of cfg's policies, so every policy's heartbeat timeout
// is met. Either every worker starts or none is left running.
func StartPool(cfg *config.Config, nc *nats.Conn, env config.LookupEnv, opts PoolOptions) (*Pool, error) {
	if cfg == nil || nc == nil {
		return nil, fmt.Errorf("%w: worker pool needs a config and a NATS connection", ErrInvalidConfig)
	}
	if env == nil {
		env = os.LookupEnv
	}
	routes, err := poolRoutes(cfg, opts.Routes)
	if err != nil {
		return nil, err
	}
	heartbeat := shortestHeartbeat(cfg)
	p := &Pool{}
	for _, r := range routes {
		up, err := newUpstream(r, env)
		if err != nil {
			return nil, err
		}
		w, err := New(Config{
			Route:             r.Name,
			Upstream:          up,
			Conn:              nc,
			MaxInflight:       r.MaxInflight,
			HeartbeatInterval: heartbeat,
			DrainGrace:        opts.DrainGrace,
			Logger:            opts.Logger,
			Metrics:           opts.Metrics,
			FingerprintKey:    opts.FingerprintKey,
			Leases:            opts.Leases,
		})
		if err != nil {
			return nil, fmt.Errorf("route %s: %w", r.Name, err)
		}
		p.workers = append(p.workers, w)
	}
	for i, w := range p.workers {
		if err := w.Start(); err != nil {
			// Unwind what started: those workers hold no attempts worth
			// draining yet, but their subscriptions must go.
			started := &Pool{workers: p.workers[:i]}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return nil, errors.Join(fmt.Errorf("route %s: %w", routes[i].Name, err), started.Stop(ctx))
		}
	}
	return p, nil
}

// poolRoutes returns the configured routes named by names, or all of them.
func poolRoutes(cfg *config.Config, names []string) ([]*config.Route, error) {
	if len(names) == 0 {
		if len(cfg.Routes) == 0 {
			return nil, fmt.Errorf("%w: the configuration has no routes", ErrInvalidConfig)
		}
		return cfg.Routes, nil
	}
	out := make([]*config.Route, 0, len(names))
	seen := map[string]bool{}
	for _, n := range names {
		r, ok := cfg.Route(n)
		if !ok {
			return nil, fmt.Errorf("route %q: %w", n, ErrUnknownRoute)
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, r)
		}
	}
	return out, nil
}

// shortestHeartbeat is the shortest heartbeat interval of the policies, or 0
// (the worker default) when none sets one.
func shortestHeartbeat(cfg *config.Config) time.Duration {
	var d time.Duration
	for _, p := range cfg.Policies {
		if p.HeartbeatInterval > 0 && (d == 0 || p.HeartbeatInterval < d) {
			d = p.HeartbeatInterval
		}
	}
	return d
}

// newUpstream returns the provider adapter of route r.
func newUpstream(r *config.Route, env config.LookupEnv) (upstream.Upstream, error) {
	var key string
	if r.APIKeyEnv != "" {
		v, ok := env(r.APIKeyEnv)
		if !ok || v == "" {
			return nil, fmt.Errorf("route %s: %w: environment variable %s", r.Name, ErrMissingAPIKey, r.APIKeyEnv)
		}
		key = v
	}
	cfg := upstream.Config{BaseURL: r.BaseURL, Model: r.Model, APIKey: key}
	var (
		up  upstream.Upstream
		err error
	)
	switch r.Provider {
	case config.ProviderOpenAI:
		up, err = upstream.NewOpenAI(cfg)
	case config.ProviderAnthropic:
		up, err = upstream.NewAnthropic(upstream.AnthropicConfig{Config: cfg})
	default:
		return nil, fmt.Errorf("route %s: %w: %q", r.Name, ErrProviderNotSupported, r.Provider)
	}
	if err != nil {
		return nil, fmt.Errorf("route %s: %w", r.Name, err)
	}
	return up, nil
}

// Routes lists the routes the pool serves, in configuration order.
func (p *Pool) Routes() []string {
	out := make([]string, len(p.workers))
	for i, w := range p.workers {
		out[i] = w.cfg.Route
	}
	return out
}

// Stop stops every worker of the pool at once (see Worker.Stop), so they
// drain in parallel within ctx, and returns their errors joined.
func (p *Pool) Stop(ctx context.Context) error {
	errs := make([]error, len(p.workers))
	var wg sync.WaitGroup
	for i, w := range p.workers {
		wg.Go(func() {
			if err := w.Stop(ctx); err != nil {
				errs[i] = fmt.Errorf("route %s: %w", w.cfg.Route, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
