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

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/worker"
)

// Workers is a running worker process: one worker per route on one NATS
// connection, and optionally an HTTP server for its metrics.
type Workers struct {
	pool    *worker.Pool
	metrics *httpServer // nil without Options.MetricsListen
}

// StartWorkers starts the workers of o.Routes (all routes when empty) on nc,
// reading each route's provider key through o.Env, and serves their metrics
// on o.MetricsListen when set.
func StartWorkers(cfg *config.Config, nc *nats.Conn, o Options) (*Workers, error) {
	log := o.logger()
	key, err := o.fingerprintKey(cfg)
	if err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	m := worker.NewMetrics()
	pool, err := worker.StartPool(cfg, nc, o.env(), worker.PoolOptions{
		Routes: o.Routes, Metrics: m, Logger: log.With("component", "worker"),
		FingerprintKey: key, DrainGrace: o.DrainGrace,
	})
	if err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	w := &Workers{pool: pool}
	if o.MetricsListen == "" {
		return w, nil
	}
	reg, err := newRegistry()
	if err == nil {
		err = m.Register(reg)
	}
	if err == nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		w.metrics, err = serveHTTP(o.MetricsListen, &http.Server{Handler: mux, ReadTimeout: metricsReadTimeout}, log)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("workers: metrics: %w", err), unwind(pool.Stop))
	}
	return w, nil
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

// Stop stops every worker within ctx (see worker.Pool.Stop), then the
// metrics server.
func (w *Workers) Stop(ctx context.Context) error {
	err := w.pool.Stop(ctx)
	if w.metrics != nil {
		err = errors.Join(err, w.metrics.shutdown(ctx))
	}
	return err
}
