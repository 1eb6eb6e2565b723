package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/worker"
	"github.com/hedgerow/hedgerow/worker/upstream"
)

// Workers is a running worker process: one worker per route on one NATS
// connection, optionally the Redis its workers keep their route leases in,
// and optionally an HTTP server for its metrics.
type Workers struct {
	pool    *worker.Workers
	redis   redis.UniversalClient // nil without redis.url
	metrics *httpServer           // nil without Options.MetricsListen
}

// StartWorkers starts the workers of o.Routes (all routes when empty) on nc,
// reading each route's provider key through o.Env, and serves their metrics
// on o.MetricsListen when set, with GET /healthz (200 while the process
// runs) and GET /readyz (200 while NATS is connected, else 503). With redis.url set, each worker holds a
// route in-flight lease in Redis for every attempt it runs, so every
// gateway's route choice sees this process's load (docs/architecture.md §7).
//
// A worker process never reads the deployment hash key
// (redis.hash_key_env): its records are live only, never kept or counted
// (docs/architecture.md §9), so their prompt fingerprints take
// o.FingerprintKey when an embedding program gives one, else each worker's
// own random key.
func StartWorkers(cfg *config.Config, nc *nats.Conn, o Options) (*Workers, error) {
	log := o.logger()
	w := &Workers{}
	var leases worker.Leases
	if cfg.Redis.URL != "" {
		client, store, err := openRedisStore(cfg.Redis, log.With("component", "redis"))
		if err != nil {
			return nil, fmt.Errorf("workers: %w", err)
		}
		w.redis, leases = client, store
	}
	m := worker.NewMetrics()
	pool, err := worker.StartWorkers(WorkerRoutes(cfg), nc, worker.WorkersOptions{
		Routes: o.Routes, Region: cfg.Deployment.Region, LookupEnv: o.env(), HeartbeatInterval: shortestHeartbeat(cfg),
		Metrics: m, Logger: log.With("component", "worker"),
		FingerprintKey: o.FingerprintKey, DrainGrace: o.DrainGrace, Leases: leases,
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("workers: %w", err), w.closeRedis())
	}
	w.pool = pool
	if err := checkPermissions(nc); err != nil {
		return nil, errors.Join(fmt.Errorf("workers: %w", err), unwind(w.Stop))
	}
	if o.MetricsListen == "" {
		return w, nil
	}
	reg, err := newRegistry()
	if err == nil {
		err = m.Register(reg)
	}
	if err == nil {
		err = registerNATS(reg, map[string]*nats.Conn{"workers": nc})
	}
	if err == nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { writeProbe(w, true) })
		mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { writeProbe(w, nc.IsConnected()) })
		w.metrics, err = serveHTTP(o.MetricsListen, &http.Server{Handler: mux, ReadTimeout: metricsReadTimeout}, log)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("workers: metrics: %w", err), unwind(w.Stop))
	}
	return w, nil
}

// writeProbe answers a probe of the worker's metrics listener: 200 "ok",
// or 503 "not ready" (Kubernetes' liveness and readiness, deploy/k8s).
func writeProbe(w http.ResponseWriter, ok bool) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("not ready: NATS is not connected\n"))
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

// WorkerRoutes describes the configured routes as a worker pool takes them.
func WorkerRoutes(cfg *config.Config) []worker.Route {
	out := make([]worker.Route, 0, len(cfg.Routes))
	for _, r := range cfg.Routes {
		out = append(out, worker.Route{
			Name: r.Name, Provider: worker.Provider(r.Provider), BaseURL: r.BaseURL, Model: r.Model,
			APIKeyEnv: r.APIKeyEnv, MaxInflight: r.MaxInflight,
			Continuation: upstream.ContinuationStyle(r.Continuation),
		})
	}
	return out
}

// shortestHeartbeat is the shortest heartbeat interval of the policies, or 0
// (the worker default) when none sets one: workers heartbeat at it, so every
// policy's heartbeat timeout is met.
func shortestHeartbeat(cfg *config.Config) time.Duration {
	var d time.Duration
	for _, p := range cfg.Policies {
		if p.HeartbeatInterval > 0 && (d == 0 || p.HeartbeatInterval < d) {
			d = p.HeartbeatInterval
		}
	}
	return d
}

// metricsReadTimeout bounds reading a scrape request.
const metricsReadTimeout = 10 * time.Second

// Routes lists the routes served.
func (w *Workers) Routes() []string { return w.pool.Routes() }

// MetricsAddr is the address metrics are served on, or nil.
func (w *Workers) MetricsAddr() net.Addr {
	if w.metrics == nil {
		return nil
	}
	return w.metrics.Addr()
}

// Failed delivers an error if the metrics server stops on its own; it
// never delivers without one.
func (w *Workers) Failed() <-chan error {
	if w.metrics == nil {
		return nil
	}
	return w.metrics.failed
}

// Stop stops every worker within ctx (see worker.Workers.Stop), which gives
// back their route leases, then closes Redis and the metrics server.
func (w *Workers) Stop(ctx context.Context) error {
	err := errors.Join(w.pool.Stop(ctx), w.closeRedis())
	if w.metrics != nil {
		err = errors.Join(err, w.metrics.shutdown(ctx))
	}
	return err
}

// closeRedis closes the Redis client, if there is one.
func (w *Workers) closeRedis() error {
	if w.redis == nil {
		return nil
	}
	if err := w.redis.Close(); err != nil {
		return fmt.Errorf("workers: close redis: %w", err)
	}
	return nil
}
