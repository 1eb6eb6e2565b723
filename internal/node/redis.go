package node

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/arbiter/sharedgate"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/budgets/lease"
	"github.com/hedgerow/hedgerow/budgets/redisstore"
	"github.com/hedgerow/hedgerow/budgets/slice"
	"github.com/hedgerow/hedgerow/budgets/slice/redisslice"
	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/dispatcher/guardshare"
	"github.com/hedgerow/hedgerow/dispatcher/sketchshare"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/redact"
	"github.com/hedgerow/hedgerow/worker"
)

// shared is what replicas of one deployment share: the budget store, the
// winner gate and the gateway's slices of the region's ceilings, in memory
// for a single replica or on Redis for many, and the loop that shares
// latency sketches through Redis.
type shared struct {
	store  budgets.Store
	gate   arbiter.Gate
	slices *slice.Slices
	region *lease.Region         // the region's leases of the global ceilings; nil with none
	client redis.UniversalClient // nil in memory
	stop   func()                // stops background work; nil when there is none
}

// openShared builds the shared state of cfg: Redis when redis.url is set,
// memory otherwise. An unreachable Redis is not fatal — the dispatcher runs
// degraded (hedges suppressed, elections as gate.on_unavailable says) until
// it answers — but it is logged, so a wrong address shows at start. In
// fallback mode the gate's ledger is opened on nc's JetStream, which must
// answer: without it the guarantee the mode promises does not hold.
func openShared(cfg *config.Config, nc *nats.Conn, reg prometheus.Registerer, log *slog.Logger) (*shared, error) {
	gateTTL := gateTTL(cfg)
	if cfg.Redis.URL == "" {
		gate, err := arbiter.NewLocalGate(arbiter.LocalGateOptions{TTL: gateTTL})
		if err != nil {
			return nil, fmt.Errorf("winner gate: %w", err)
		}
		region, err := openRegion(cfg, nc, nil, reg, log)
		if err != nil {
			return nil, err
		}
		slices, err := gatewaySlices(slice.NewMemory(nil), region, cfg.Redis, reg, log)
		if err != nil {
			region.Close()
			return nil, err
		}
		var store budgets.Store = budgets.NewMemory(nil)
		if region != nil {
			// The tenants' spend windows spent from the slices, which
			// the region's leases scale, as over Redis (§14).
			store = budgets.NewSliced(store, slices, nil)
		}
		return &shared{store: store, gate: gate, slices: slices, region: region}, nil
	}
	client, store, err := openRedisStore(cfg.Redis, log)
	if err != nil {
		return nil, err
	}
	gcfg := sharedgate.RedisGateOptions{
		Prefix: cfg.Redis.KeyPrefix, TTL: gateTTL, Timeout: min(cfg.Redis.Timeout, sharedgate.MaxRedisGateTimeout),
	}
	if gcfg.OnUnavailable, err = sharedgate.ParseUnavailable(cfg.Gate.OnUnavailable); err != nil {
		return nil, errors.Join(fmt.Errorf("gate.on_unavailable: %w", err), client.Close())
	}
	if gcfg.OnUnavailable == sharedgate.UnavailableFallback {
		if gcfg.Ledger, err = openLedger(cfg, nc, gateTTL); err != nil {
			return nil, errors.Join(err, client.Close())
		}
	}
	gate, err := sharedgate.NewRedisGate(client, gcfg)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("redis winner gate: %w", err), client.Close())
	}
	granter, err := redisslice.New(client, redisslice.Options{Prefix: cfg.Redis.KeyPrefix, KeepBudgets: keepBudgets(cfg)})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("redis slices: %w", err), client.Close())
	}
	region, err := openRegion(cfg, nc, client, reg, log)
	if err != nil {
		return nil, errors.Join(err, client.Close())
	}
	slices, err := gatewaySlices(granter, region, cfg.Redis, reg, log)
	if err != nil {
		region.Close()
		return nil, errors.Join(err, client.Close())
	}
	return &shared{store: budgets.NewSliced(store, slices, nil), gate: gate, slices: slices, region: region, client: client}, nil
}

// keepBudgets is how long Redis keeps a spend window's budget past its
// last use: past the longest spend window configured, so a window in use
// is never dropped (a dropped budget would come back full), and at least
// redisslice's default.
func keepBudgets(cfg *config.Config) time.Duration {
	keep := redisslice.DefaultKeepBudgets
	for _, p := range cfg.Policies {
		if p != nil {
			keep = max(keep, 2*p.Spend.Window)
		}
	}
	for _, t := range cfg.Tenants {
		if t != nil {
			keep = max(keep, 2*t.SpendWindow)
		}
	}
	return keep
}

// gatewaySlices are the gateway's slices of the region's ceilings over
// granter (docs/architecture.md §7, "Slices"): its tenants' request rates,
// requests in flight and spend windows, and its routes' published limits
// (the dispatcher's RouteCapacity, §7 "Route capacity"). Their granter
// calls are bounded as every Redis call is.
func gatewaySlices(granter slice.Granter, region *lease.Region, cfg config.Redis, reg prometheus.Registerer, log *slog.Logger) (*slice.Slices, error) {
	opts := slice.Options{Timeout: cfg.Timeout, Registerer: reg, Logger: log}
	if region != nil {
		opts.Leases = region // the global ceilings scaled by the region's leases (§14)
	}
	slices, err := slice.New(granter, opts)
	if err != nil {
		return nil, fmt.Errorf("slices: %w", err)
	}
	return slices, nil
}

// jetStreamTry bounds one try at creating a stream or bucket at start.
const jetStreamTry = 3 * time.Second

// createAtStart runs create, a creation of a JetStream stream or bucket at
// a process's start, and runs it again while ctx allows when a try got no
// answer within jetStreamTry: two replicas creating one replicated stream
// at once on a new cluster can leave one creation unanswered (seen with
// nats-server 2.15.2, docs/architecture.md §12), which a second request
// gets past. Any other error is returned at once.
func createAtStart(ctx context.Context, create func(context.Context) error) error {
	for {
		try, cancel := context.WithTimeout(ctx, jetStreamTry)
		err := create(try)
		cancel()
		unanswered := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
		if err == nil || !unanswered || ctx.Err() != nil {
			return err
		}
	}
}

// ledgerStartTimeout bounds opening the gate's bucket at start.
const ledgerStartTimeout = 10 * time.Second

// openLedger opens the winner gate's ledger bucket (gate.bucket) on nc's
// JetStream, creating it when missing.
func openLedger(cfg *config.Config, nc *nats.Conn, ttl time.Duration) (*sharedgate.KVLedger, error) {
	if nc == nil {
		return nil, errors.New("gate ledger: a NATS connection is required")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("gate ledger: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ledgerStartTimeout)
	defer cancel()
	var l *sharedgate.KVLedger
	err = createAtStart(ctx, func(try context.Context) error {
		var err error
		l, err = sharedgate.OpenLedger(try, js, sharedgate.LedgerOptions{
			Bucket: cfg.Gate.Bucket, Replicas: cfg.Gate.Replicas, TTL: ttl, Timeout: cfg.Gate.Timeout,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%w (gate.on_unavailable fallback keeps every commit in a JetStream bucket: "+
			"enable JetStream on the NATS servers, or set gate.on_unavailable to local or refuse, docs/architecture.md §6)", err)
	}
	return l, nil
}

// leases is where the workers of a process record their attempts in
// flight: the Redis budget store, whose route leases every dispatcher
// replica reads, or nothing in memory — one replica counts its own
// attempts already.
func (s *shared) leases() worker.Leases {
	if s == nil || s.client == nil {
		return nil
	}
	return s.store
}

// openRedisStore opens the Redis that cfg names and the budget store on it,
// for every role that uses Redis: the dispatchers of serve and gateway keep
// their budgets, route flags and winner gate there, the workers of serve
// and worker their route in-flight leases. An unreachable Redis is not
// fatal — callers run degraded until it answers — but it is logged, so a
// wrong address shows at start. The caller closes the client.
func openRedisStore(cfg config.Redis, log *slog.Logger) (redis.UniversalClient, *redisstore.Store, error) {
	client, err := redisClient(cfg, os.Getenv)
	if err != nil {
		return nil, nil, err
	}
	store, err := redisstore.New(client, redisstore.Options{Prefix: cfg.KeyPrefix, Timeout: cfg.Timeout})
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("redis budgets: %w", err), client.Close())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		log.Warn("redis does not answer yet; running degraded until it does", "err", err)
	}
	return client, store, nil
}

// stopSharing stops the background work (the sketch sharing loop), leaving
// the client open for the process's other users.
func (s *shared) stopSharing() {
	if s.stop != nil {
		s.stop()
		s.stop = nil
	}
}

// close stops the background work, gives back what the slices hold and
// closes the Redis client.
func (s *shared) close() error {
	s.stopSharing()
	s.slices.Close()
	s.region.Close()
	if s.client == nil {
		return nil
	}
	return s.client.Close()
}

// redisClient is a client of the Redis cfg names: a standalone server, or a
// Redis Cluster seeded by the URL's host (and its addr= parameters) when
// cluster is set. Calls never retry — a retry would outlast the timeout that
// decides degraded mode — and honour their context's deadline.
func redisClient(cfg config.Redis, getenv func(string) string) (redis.UniversalClient, error) {
	tlsConfig, err := redisTLS(cfg)
	if err != nil {
		return nil, err
	}
	password := ""
	if cfg.PasswordEnv != "" {
		password = getenv(cfg.PasswordEnv)
	}
	if cfg.Cluster {
		opts, err := redis.ParseClusterURL(cfg.URL)
		if err != nil {
			return nil, fmt.Errorf("redis.url: %w", redact.Error(err))
		}
		opts.Username, opts.Password = cfg.Username, password
		opts.TLSConfig = mergeTLS(opts.TLSConfig, tlsConfig, hostOf(opts.Addrs[0]))
		opts.ContextTimeoutEnabled = true
		opts.MaxRetries = -1
		opts.DialTimeout = max(cfg.Timeout, time.Second)
		return redis.NewClusterClient(opts), nil
	}
	opts, err := redis.ParseURL(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("redis.url: %w", redact.Error(err))
	}
	opts.Username, opts.Password = cfg.Username, password
	opts.TLSConfig = mergeTLS(opts.TLSConfig, tlsConfig, hostOf(opts.Addr))
	opts.ContextTimeoutEnabled = true
	opts.MaxRetries = -1
	opts.DialTimeout = max(cfg.Timeout, time.Second)
	return redis.NewClient(opts), nil
}

// redisTLS is the TLS configuration redis.tls asks for; nil when it asks for
// none (a rediss:// URL still turns TLS on with the system's roots).
func redisTLS(cfg config.Redis) (*tls.Config, error) {
	if !cfg.TLS.Enabled && cfg.TLS.CAFile == "" && !cfg.TLS.InsecureSkipVerify {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.TLS.InsecureSkipVerify} //nolint:gosec // the operator's explicit choice
	if cfg.TLS.CAFile != "" {
		pem, err := os.ReadFile(cfg.TLS.CAFile)
		if err != nil {
			return nil, fmt.Errorf("redis.tls.ca_file: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis.tls.ca_file %s: no PEM certificate in it", cfg.TLS.CAFile)
		}
	}
	return tc, nil
}

// mergeTLS keeps the server name a rediss:// URL set (or the URL's host for
// a redis:// URL with tls.enabled) and adds the configured roots and
// verification choice.
func mergeTLS(fromURL, configured *tls.Config, host string) *tls.Config {
	if configured == nil {
		return fromURL
	}
	configured.ServerName = host
	if fromURL != nil {
		configured.ServerName = fromURL.ServerName
	}
	return configured
}

func hostOf(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return host
}

// shareSketches starts the loop that shares d's latency sketches with the
// other replicas through Redis, so every replica computes the same hedge
// delay from the cluster's traffic, and the loop that shares its guardrails'
// disablings (docs/architecture.md §5). It does nothing in memory.
func (s *shared) shareSketches(d *dispatcher.Dispatcher, cfg *config.Config, log *slog.Logger) error {
	if s.client == nil {
		return nil
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return fmt.Errorf("sketch sharing: replica id: %w", err)
	}
	var maxAge time.Duration
	for _, p := range cfg.Policies {
		maxAge = max(maxAge, p.DelayOptions().Window)
	}
	x, err := sketchshare.NewExchange(s.client, sketchshare.ExchangeOptions{
		ReplicaID: hex.EncodeToString(id[:]), Prefix: cfg.Redis.KeyPrefix, MaxAge: maxAge,
	})
	if err != nil {
		return fmt.Errorf("sketch sharing: %w", err)
	}
	estimators := map[string]sketchshare.Estimator{}
	for name, e := range d.Estimators() {
		estimators[name] = e
	}
	syncer, err := sketchshare.NewSyncer(x, estimators, sketchshare.SyncerOptions{Logger: log})
	if err != nil {
		return fmt.Errorf("sketch sharing: %w", err)
	}
	guards := map[string]guardshare.Guardrail{}
	for name, g := range d.Guardrails() {
		guards[name] = g
	}
	sharer, err := guardshare.New(s.client, cfg.Redis.KeyPrefix, guards, log)
	if err != nil {
		return fmt.Errorf("guardrail sharing: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { syncer.Run(ctx) })
	wg.Go(func() { sharer.Run(ctx) })
	s.stop = func() { cancel(); wg.Wait() }
	return nil
}
