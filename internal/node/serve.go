package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/embednats"
	"github.com/hedgerow/hedgerow/worker"
)

// Serve is a running `hedgerow serve`: an embedded NATS server, a worker
// per route and a gateway, in one process.
type Serve struct {
	nats    *embednats.Server
	tempDir string // JetStream's store when nats.store_dir is empty, removed at Stop
	conns   []*nats.Conn
	shared  *shared // budgets, gate and, on Redis, the workers' route leases
	workers *worker.Workers
	gateway *Gateway
}

// StartServe starts the embedded NATS server (in-process only unless
// nats.listen is set, with nats.max_payload), the workers and the gateway,
// in that order, so the first request finds its workers. Gateway and workers
// have a connection each and share one fingerprint key and one metrics
// registry, served by the gateway. With redis.url set they share one Redis
// store too: the dispatcher's budgets and the workers' route leases.
func StartServe(cfg *config.Config, o Options) (*Serve, error) {
	if cfg == nil {
		return nil, errors.New("serve: a config is required")
	}
	log := o.logger()
	if cfg.NATS.Listen != "" && cfg.NATS.ServerConfig == "" {
		return nil, fmt.Errorf("serve: %w", config.ErrOpenListener)
	}
	// The embedded server's own connections authenticate like any other
	// when it has users: as the serve user, whose permissions are a
	// gateway's and a worker's of every route.
	var auth []nats.Option
	if cfg.NATS.ServerConfig != "" {
		var err error
		if auth, err = authOptions(cfg.NATS, o.env()); err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
	}
	s := &Serve{}
	storeDir := cfg.NATS.StoreDir
	if storeDir == "" {
		dir, err := os.MkdirTemp("", "hedgerow-nats-")
		if err != nil {
			return nil, fmt.Errorf("serve: JetStream store: %w", err)
		}
		s.tempDir, storeDir = dir, dir
	}
	ns, err := embednats.Start(embednats.Options{
		Listen: cfg.NATS.Listen, MaxPayload: int64(cfg.NATS.MaxPayload), Logger: log,
		ConfigFile: cfg.NATS.ServerConfig, StoreDir: storeDir, SyncInterval: time.Duration(cfg.NATS.SyncInterval),
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("serve: %w", err), s.removeTempDir())
	}
	s.nats = ns
	fail := func(err error) (*Serve, error) {
		return nil, errors.Join(fmt.Errorf("serve: %w", err), unwind(s.Stop))
	}
	key, err := o.fingerprintKey(cfg)
	if err != nil {
		return fail(err)
	}
	o.FingerprintKey = key
	workerConn, err := s.connect("hedgerow-serve-workers", log,
		append(slices.Clone(auth), nats.CustomInboxPrefix(inboxPrefix(config.RoleWorker)))...)
	if err != nil {
		return fail(err)
	}
	gatewayConn, err := s.connect("hedgerow-serve-gateway", log,
		append(slices.Clone(auth), nats.CustomInboxPrefix(inboxPrefix(config.RoleGateway)))...)
	if err != nil {
		return fail(err)
	}
	reg, err := newRegistry()
	if err != nil {
		return fail(err)
	}
	if err := registerNATS(reg, map[string]*nats.Conn{"gateway": gatewayConn, "workers": workerConn}); err != nil {
		return fail(err)
	}
	if s.shared, err = openShared(cfg, gatewayConn, reg, log.With("component", "redis")); err != nil {
		return fail(err)
	}
	m := worker.NewMetrics()
	if s.workers, err = worker.StartWorkers(WorkerRoutes(cfg), workerConn, worker.WorkersOptions{
		Region:    cfg.Deployment.Region,
		LookupEnv: o.env(), HeartbeatInterval: shortestHeartbeat(cfg), Metrics: m, Logger: log.With("component", "worker"), FingerprintKey: key, DrainGrace: o.DrainGrace,
		Leases: s.shared.leases(),
	}); err != nil {
		return fail(err)
	}
	if s.gateway, err = startGateway(cfg, gatewayConn, reg, o, s.shared, s.workers.IDs()); err != nil {
		return fail(err)
	}
	if err := m.Register(reg); err != nil {
		return fail(fmt.Errorf("worker metrics: %w", err))
	}
	return s, nil
}

// connect opens an in-process connection that Stop closes.
func (s *Serve) connect(name string, log *slog.Logger, opts ...nats.Option) (*nats.Conn, error) {
	nc, err := s.nats.Connect(name, append(connOptions(log), opts...)...)
	if err != nil {
		return nil, err
	}
	s.conns = append(s.conns, nc)
	return nc, nil
}

// Observe opens an in-process connection to the embedded server for an
// observer in the same process — the peer comparison reads the records of
// the groups it sent (schemas.GroupRecordSubject) — without an open
// listener. The caller closes it; it authenticates as nothing, so it works
// only while the server has no users.
func (s *Serve) Observe(name string) (*nats.Conn, error) { return s.nats.Connect(name) }

// HTTPAddr is the address the HTTP front door listens on.
func (s *Serve) HTTPAddr() net.Addr { return s.gateway.Addr() }

// NATSURL is the URL other processes' workers can join at, or empty when
// the embedded server is in-process only.
func (s *Serve) NATSURL() string { return s.nats.ClientURL() }

// Failed delivers an error if the HTTP server stops on its own.
func (s *Serve) Failed() <-chan error { return s.gateway.Failed() }

// Stop shuts everything down within ctx, front to back: the gateway (HTTP,
// then dispatcher), the workers, the shared state (Redis), the connections,
// the NATS server.
func (s *Serve) Stop(ctx context.Context) error {
	var errs []error
	if s.gateway != nil {
		errs = append(errs, s.gateway.Stop(ctx))
	}
	if s.workers != nil {
		errs = append(errs, s.workers.Stop(ctx))
	}
	if s.shared != nil {
		if err := s.shared.close(); err != nil {
			errs = append(errs, fmt.Errorf("serve: close redis: %w", err))
		}
	}
	for _, nc := range s.conns {
		nc.Close()
	}
	s.nats.Shutdown()
	errs = append(errs, s.removeTempDir())
	return errors.Join(errs...)
}

// removeTempDir removes the JetStream store serve made for itself.
func (s *Serve) removeTempDir() error {
	if s.tempDir == "" {
		return nil
	}
	if err := os.RemoveAll(s.tempDir); err != nil {
		return fmt.Errorf("serve: remove JetStream store: %w", err)
	}
	return nil
}

// Reload takes over the configuration load returns as Gateway.Reload does;
// serve's workers keep the routes they started with, so a change of routes
// takes a restart.
func (s *Serve) Reload(load func() (*config.Config, error)) error {
	return s.gateway.Reload(load, true)
}
