package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/worker/upstream"
)

// Provider is the API dialect of a route.
type Provider string

// Providers a route may name.
const (
	ProviderOpenAI    Provider = "openai"    // OpenAI-compatible chat completions
	ProviderAnthropic Provider = "anthropic" // Anthropic Messages
)

// Route describes one route a pool serves: where its provider is and how
// to reach it.
type Route struct {
	// Name is the route's subject-safe name (see Options.Route).
	Name     string
	Provider Provider
	BaseURL  string
	// Model is the provider's model name sent upstream.
	Model string
	// APIKeyEnv names the environment variable holding the provider key;
	// empty for endpoints that need none.
	APIKeyEnv string
	// MaxInflight is how many attempts the route's worker runs at once
	// (see Options.MaxInflight).
	MaxInflight int
	// Continuation is how the route's provider continues an answer from
	// partial output (config's routes[].continuation); empty or
	// upstream.ContinueNone refuses continuation attempts.
	Continuation upstream.ContinuationStyle
}

// WorkersOptions are the optional settings of StartWorkers.
type WorkersOptions struct {
	// Routes limits the pool to the routes of these names; empty runs every
	// route given.
	Routes []string
	// Region is the supercluster region the workers serve in (see
	// Options.Region); empty for a deployment of one region.
	Region string
	// LookupEnv reads the provider keys' environment variables; nil means
	// os.LookupEnv.
	LookupEnv func(name string) (string, bool)
	// HeartbeatInterval is the workers' heartbeat period (see
	// Options.HeartbeatInterval); 0 means DefaultHeartbeatInterval.
	HeartbeatInterval time.Duration
	// Metrics is shared by every worker of the pool; nil counts into
	// collectors no registry sees.
	Metrics *Metrics
	// Logger receives the workers' operational logs; nil discards them.
	Logger *slog.Logger
	// FingerprintKey keys the prompt fingerprints of records; it must be
	// the dispatcher's for records to correlate (see Options).
	FingerprintKey []byte
	// DrainGrace is how long Stop lets in-flight attempts finish; 0 means
	// DefaultDrainGrace.
	DrainGrace time.Duration
	// Leases, when set, is where every worker of the pool records its
	// attempts in flight (see Options.Leases): the shared budget store when
	// redis.url is set.
	Leases Leases
}

// Workers is the set of workers of one process, one per route.
type Workers struct {
	workers []*Worker
}

// StartWorkers starts one Worker per route (or per route opts.Routes names) on
// nc. Each route's adapter gets the route's base URL and model, and the
// provider key read through opts.LookupEnv from the variable the route
// names — keys are only ever read here, in workers. Either every worker
// starts or none is left running.
func StartWorkers(routes []Route, nc *nats.Conn, opts WorkersOptions) (*Workers, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: StartWorkers needs a NATS connection", ErrInvalidOptions)
	}
	env := opts.LookupEnv
	if env == nil {
		env = os.LookupEnv
	}
	routes, err := poolRoutes(routes, opts.Routes)
	if err != nil {
		return nil, err
	}
	p := &Workers{}
	for _, r := range routes {
		up, err := newUpstream(r, env)
		if err != nil {
			return nil, err
		}
		w, err := New(Options{
			Route:             r.Name,
			Region:            opts.Region,
			Upstream:          up,
			Conn:              nc,
			MaxInflight:       r.MaxInflight,
			HeartbeatInterval: opts.HeartbeatInterval,
			DrainGrace:        opts.DrainGrace,
			Logger:            opts.Logger,
			Metrics:           opts.Metrics,
			FingerprintKey:    opts.FingerprintKey,
			Leases:            opts.Leases,
		})
		if err != nil {
			return nil, routeError(r.Name, err)
		}
		p.workers = append(p.workers, w)
	}
	for i, w := range p.workers {
		if err := w.Start(); err != nil {
			// Unwind what started: those workers hold no attempts worth
			// draining yet, but their subscriptions must go.
			started := &Workers{workers: p.workers[:i]}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return nil, errors.Join(routeError(routes[i].Name, err), started.Stop(ctx))
		}
	}
	return p, nil
}

// poolRoutes returns the routes named by names, or all of them.
func poolRoutes(routes []Route, names []string) ([]Route, error) {
	if len(names) == 0 {
		if len(routes) == 0 {
			return nil, fmt.Errorf("%w: the pool has no routes", ErrInvalidOptions)
		}
		return routes, nil
	}
	out := make([]Route, 0, len(names))
	seen := map[string]bool{}
	for _, n := range names {
		i := slices.IndexFunc(routes, func(r Route) bool { return r.Name == n })
		if i < 0 {
			return nil, fmt.Errorf("%w: route %q", ErrUnknownRoute, n)
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, routes[i])
		}
	}
	return out, nil
}

// newUpstream returns the provider adapter of route r.
func newUpstream(r Route, env func(string) (string, bool)) (upstream.Upstream, error) {
	var key string
	if r.APIKeyEnv != "" {
		v, ok := env(r.APIKeyEnv)
		if !ok || v == "" {
			return nil, routeError(r.Name, fmt.Errorf("%w: environment variable %s", ErrMissingAPIKey, r.APIKeyEnv))
		}
		key = v
	}
	cfg := upstream.Options{BaseURL: r.BaseURL, Model: r.Model, APIKey: key, Continuation: r.Continuation}
	var (
		up  upstream.Upstream
		err error
	)
	switch r.Provider {
	case ProviderOpenAI:
		up, err = upstream.NewOpenAI(cfg)
	case ProviderAnthropic:
		up, err = upstream.NewAnthropic(upstream.AnthropicOptions{Options: cfg})
	default:
		return nil, routeError(r.Name, fmt.Errorf("%w: %q", ErrProviderNotSupported, r.Provider))
	}
	if err != nil {
		return nil, routeError(r.Name, err)
	}
	return up, nil
}

// Routes lists the routes the pool serves, in configuration order.
func (p *Workers) Routes() []string {
	out := make([]string, len(p.workers))
	for i, w := range p.workers {
		out[i] = w.cfg.Route
	}
	return out
}

// IDs maps each worker's id, as its readiness ping names it (micro
// metadata worker_id), to its route: a gateway in the same process is
// ready only once all of them answer (docs/architecture.md §2).
func (p *Workers) IDs() map[string]string {
	out := make(map[string]string, len(p.workers))
	for _, w := range p.workers {
		out[w.ID()] = w.cfg.Route
	}
	return out
}

// Stop stops every worker of the pool at once (see Worker.Stop), so they
// drain in parallel within ctx, and returns their errors joined.
func (p *Workers) Stop(ctx context.Context) error {
	errs := make([]error, len(p.workers))
	var wg sync.WaitGroup
	for i, w := range p.workers {
		wg.Go(func() {
			if err := w.Stop(ctx); err != nil {
				errs[i] = routeError(w.cfg.Route, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// routeError names the route an error of StartWorkers concerns, reading
// "worker: route <name>: <what>" with one package prefix however err reads;
// errors.Is and errors.As see err.
func routeError(route string, err error) error {
	return &namedRouteError{route: route, err: err}
}

type namedRouteError struct {
	route string
	err   error
}

func (e *namedRouteError) Error() string {
	return "worker: route " + e.route + ": " + strings.TrimPrefix(e.err.Error(), "worker: ")
}

func (e *namedRouteError) Unwrap() error { return e.err }
