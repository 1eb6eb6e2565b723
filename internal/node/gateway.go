package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/dispatcher/route"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/replay"
	"github.com/hedgerow/hedgerow/frontdoor/replay/actions"
	"github.com/hedgerow/hedgerow/frontdoor/replay/redisreplay"
	"github.com/hedgerow/hedgerow/frontdoor/tenantlimit"
	"github.com/hedgerow/hedgerow/internal/adapters/records"
	"github.com/hedgerow/hedgerow/internal/adapters/tracing"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/schemas"
)

// Errors of StartGateway that callers may branch on.
var (
	// ErrPayloadTooSmall: the NATS server takes smaller messages than
	// nats.max_payload, so a request at the body limit would not fit in an
	// attempt (docs/architecture.md §8).
	ErrPayloadTooSmall = errors.New("NATS max_payload too small")
)

// Gateway is a running gateway: a dispatcher behind the HTTP front door and
// the NATS one (hedgerow.submit). What a reload rebuilds — the dispatcher,
// its doors and the tenants' limiter — is its current generation
// (reload.go); the listeners, Redis, the records publisher and the replay
// store live as long as the gateway.
type Gateway struct {
	shared     *shared
	ownsShared bool // false when the process opened it (serve): it outlives the gateway
	http       *httpServer
	internal   *httpServer // /readyz and /metrics with http.internal_listen; nil without
	records    *records.Publisher
	tracer     *tracing.Exporter // nil without tracing.endpoint
	replays    replay.Store
	// replayMetrics count the answers the doors could not keep in
	// replays, registered once with the gateway's registry.
	replayMetrics *replay.Metrics
	actions       *actions.Index // the cross-region index of user actions; nil without global.regions
	nc            *nats.Conn
	reg           *prometheus.Registry // the process's metrics; each generation adds its own
	secret        []byte
	log           *slog.Logger
	own           map[string]string // serve's own workers, id → route: readiness waits for them

	reloads *reloadMetrics

	// cur is the generation new requests go to (swapHandler); a reload
	// replaces it at once.
	cur      atomic.Pointer[generation]
	mu       sync.Mutex     // guards cfg and stopped; held through a reload, one at a time
	cfg      *config.Config // the running configuration
	stopped  bool
	retiring sync.WaitGroup // generations a reload replaced, finishing their requests
}

// StartGateway assembles a gateway on nc from cfg and starts serving HTTP on
// http.listen: budgets and winner gate (in memory, or on Redis when
// redis.url is set), the dispatcher, and its
// HTTP front door (httpdoor.New) with the
// configured body limit, tenants and timeouts. Its metrics go to reg, which
// GET /metrics serves (nil: a registry of its own).
func StartGateway(cfg *config.Config, nc *nats.Conn, reg *prometheus.Registry, o Options) (*Gateway, error) {
	return startGateway(cfg, nc, reg, o, nil, nil)
}

// startGateway is StartGateway on sh, the shared state the process opened
// for its workers too (serve), which outlives the gateway; nil opens the
// gateway's own. own are the process's own workers (id → route), which
// must answer the readiness ping for the gateway to be ready; nil for a
// gateway process.
func startGateway(cfg *config.Config, nc *nats.Conn, reg *prometheus.Registry, o Options, sh *shared, own map[string]string) (*Gateway, error) {
	if cfg == nil || nc == nil {
		return nil, errors.New("gateway: a config and a NATS connection are required")
	}
	if err := checkPayload(cfg, nc); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	log := o.logger()
	if reg == nil {
		var err error
		if reg, err = newRegistry(); err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
	}
	secret, err := o.fingerprintKey(cfg)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g := &Gateway{shared: sh, ownsShared: sh == nil, nc: nc, reg: reg, secret: secret, log: log, cfg: cfg, own: own}
	if g.reloads, err = newReloadMetrics(reg); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if g.ownsShared {
		if sh, err = openShared(cfg, nc, reg, log.With("component", "redis")); err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		g.shared = sh
		// serve registers its gateway's and workers' connections itself.
		if err := registerNATS(reg, map[string]*nats.Conn{"gateway": nc}); err != nil {
			return nil, errors.Join(fmt.Errorf("gateway: %w", err), g.closeShared())
		}
	}
	if g.records, err = openRecords(cfg, nc, reg, log.With("component", "records")); err != nil {
		return nil, errors.Join(fmt.Errorf("gateway: %w", err), g.closeShared())
	}
	if g.tracer, err = openTracer(cfg, o, log.With("component", "tracing")); err != nil {
		return nil, errors.Join(fmt.Errorf("gateway: %w", err), g.closeShared())
	}
	if g.replayMetrics, err = replay.NewMetrics(reg); err != nil {
		return nil, errors.Join(fmt.Errorf("gateway: %w", err), g.closeShared())
	}
	if g.replays, err = replayStore(cfg, sh, g.replayMetrics); err != nil {
		return nil, errors.Join(fmt.Errorf("gateway: %w", err), g.closeShared())
	}
	if g.actions, err = openActions(cfg, nc, reg, log.With("component", "actions")); err != nil {
		return nil, errors.Join(fmt.Errorf("gateway: %w", err), g.closeShared())
	}
	gen, err := g.newGeneration(cfg)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("gateway: %w", err), g.closeShared())
	}
	g.cur.Store(gen)
	if gen.internal != nil {
		if g.internal, err = serveHTTP(cfg.HTTP.InternalListen, &http.Server{Handler: internalHandler(swapHandler{g: g, internal: true}, cfg.HTTP.Pprof),
			ReadHeaderTimeout: cfg.HTTP.ReadHeaderTimeout, ReadTimeout: cfg.HTTP.ReadTimeout, WriteTimeout: internalWriteTimeout(cfg.HTTP),
		}, log); err != nil {
			return nil, errors.Join(fmt.Errorf("gateway: %w", err), unwind(g.closeDispatcher))
		}
	}
	g.http, err = serveHTTPTLS(cfg.HTTP.Listen, cfg.HTTP.MaxConnections, cfg.HTTP.TLS.CertFile, cfg.HTTP.TLS.KeyFile, &http.Server{
		Handler:           swapHandler{g: g},
		ReadHeaderTimeout: cfg.HTTP.ReadHeaderTimeout,
		ReadTimeout:       cfg.HTTP.ReadTimeout,
		WriteTimeout:      cfg.HTTP.WriteTimeout,
		IdleTimeout:       cfg.HTTP.IdleTimeout,
		// Above the door's header_limit, so the door answers an oversized
		// header block in the caller's dialect; past this net/http does,
		// in plain text.
		MaxHeaderBytes: int(config.MaxHeaderLimit),
	}, log)
	if err != nil {
		if g.internal != nil {
			_ = g.internal.shutdown(context.Background())
		}
		return nil, errors.Join(fmt.Errorf("gateway: %w", err), unwind(g.closeDispatcher))
	}
	if err := gen.startNATS(g); err != nil {
		return nil, errors.Join(fmt.Errorf("gateway: %w", err), unwind(g.Stop))
	}
	if err := checkPermissions(nc); err != nil {
		return nil, errors.Join(fmt.Errorf("gateway: %w", err), unwind(g.Stop))
	}
	return g, nil
}

// openTracer starts the trace exporter tracing.endpoint names, or none.
func openTracer(cfg *config.Config, o Options, log *slog.Logger) (*tracing.Exporter, error) {
	t := cfg.Tracing
	if t.Endpoint == "" {
		return nil, nil
	}
	var headers map[string]string
	if t.HeadersEnv != "" {
		raw, ok := o.env()(t.HeadersEnv)
		if !ok {
			return nil, fmt.Errorf("tracing.headers_env: environment variable %s is not set", t.HeadersEnv)
		}
		var err error
		if headers, err = tracing.ParseHeaders(raw); err != nil {
			return nil, fmt.Errorf("tracing.headers_env %s: %w", t.HeadersEnv, err)
		}
	}
	return tracing.New(tracing.Options{Endpoint: t.Endpoint, Headers: headers, SampleRatio: t.SampleRatio,
		Service: "hedgerow-gateway", Version: o.Version, Logger: log})
}

// traceRoutes describes cfg's routes as the trace exporter names them.
func traceRoutes(cfg *config.Config) map[string]tracing.Route {
	routes := make(map[string]tracing.Route, len(cfg.Routes))
	for _, r := range cfg.Routes {
		routes[r.Name] = tracing.Route{Provider: string(r.Provider), Model: r.Model}
	}
	return routes
}

// recordsStartTimeout bounds creating or updating the records stream at
// a gateway's start.
const recordsStartTimeout = 10 * time.Second

// openRecords creates or updates the records stream (records.*) on nc's
// JetStream; without JetStream the Publisher keeps nothing and the
// gateway serves (docs/architecture.md §9).
func openRecords(cfg *config.Config, nc *nats.Conn, reg prometheus.Registerer, log *slog.Logger) (*records.Publisher, error) {
	ctx, cancel := context.WithTimeout(context.Background(), recordsStartTimeout)
	defer cancel()
	r := cfg.Records
	var p *records.Publisher
	err := createAtStart(ctx, func(try context.Context) error {
		var err error
		p, err = records.Open(try, nc, records.Options{Stream: r.Stream, Region: cfg.Deployment.Region, MaxAge: r.MaxAge, MaxBytes: int64(r.MaxBytes),
			Replicas: r.Replicas, Duplicates: r.Duplicates, MaxPending: r.MaxPending, CommitTimeout: r.CommitTimeout}, reg, log)
		return err
	})
	return p, err
}

// replayStore is where the doors keep committed answers for replay
// (docs/architecture.md §2): in Redis with the gate when the replicas share
// one, so a retry reaching any replica is replayed (max_total_bytes then
// bounds the answers of every gateway together, refusing new ones past
// it); else in this gateway's memory (max_total_bytes its own, the oldest
// evicted past it).
func replayStore(cfg *config.Config, sh *shared, metrics *replay.Metrics) (replay.Store, error) {
	id := cfg.HTTP.Idempotency
	if sh.client != nil {
		// A lapsed marker is remembered as long as the winner gate holding it
		// left may stand, so the retry that takes it over can clear that.
		return redisreplay.New(sh.client, redisreplay.Options{Prefix: cfg.Redis.KeyPrefix,
			MaxEntryBytes: int(id.MaxEntryBytes), MaxTotalBytes: int(id.MaxTotalBytes), Timeout: cfg.Redis.Timeout, MarkerKeep: gateTTL(cfg)})
	}
	return replay.NewMemory(replay.MemoryOptions{MaxEntryBytes: int(id.MaxEntryBytes), MaxTotalBytes: int(id.MaxTotalBytes), Metrics: metrics})
}

// openActions starts the gateway's side of the index of user actions
// committed across regions (docs/architecture.md §14, "User actions across
// regions"), or nil when the configuration names no regions: a deployment
// of one region publishes and looks up nothing.
func openActions(cfg *config.Config, nc *nats.Conn, reg prometheus.Registerer, log *slog.Logger) (*actions.Index, error) {
	g := cfg.Global
	if len(g.Regions) == 0 {
		return nil, nil
	}
	id := cfg.HTTP.Idempotency
	return actions.New(nc, actions.Options{Region: cfg.Deployment.Region, Regions: g.Regions,
		ReplicateAnswers: g.ReplicateAnswers, RerunAfter: g.RerunAfter,
		MaxAge: id.TTL, MaxBytes: int64(g.IndexMaxBytes), Replicas: cfg.Records.Replicas,
		Registerer: reg, Logger: log})
}

// elsewhere is the doors' replay.Elsewhere: the gateway's index, or none
// (a nil interface, not a nil *actions.Index).
func (g *Gateway) elsewhere() replay.Elsewhere {
	if g.actions == nil {
		return nil
	}
	return g.actions
}

// actionsCloseTimeout bounds the index's last entries when the gateway's
// stop did not give it a context of its own.
const actionsCloseTimeout = 2 * time.Second

// closeActions stops the index's publisher within ctx, after the doors.
func (g *Gateway) closeActions(ctx context.Context) {
	if g.actions != nil {
		g.actions.Close(ctx)
	}
}

// tenantLimiter is the doors' limiter of the tenants' request rates and
// requests in flight (docs/architecture.md §2), spent from the gateway's
// slices: of the region's ceilings on the shared Redis when the replicas
// have one, else of this gateway's own. Nil when no tenant has a limit.
func tenantLimiter(cfg *config.Config, sh *shared, reg prometheus.Registerer) (*tenantlimit.Limiter, error) {
	limits := map[string]tenantlimit.Limit{}
	for name, t := range cfg.Tenants {
		if t == nil {
			continue
		}
		if l := (tenantlimit.Limit{RequestsPerSecond: t.RequestsPerSecond, Burst: t.Burst, MaxConcurrent: t.MaxConcurrent}); !l.IsZero() {
			limits[name] = l
		}
	}
	if len(limits) == 0 {
		return nil, nil
	}
	return tenantlimit.New(sh.slices, tenantlimit.Options{Limits: limits, Registerer: reg})
}

// poolRoutes lists each configured pool's routes, the shape
// httpdoor.Options.Pools takes.
func poolRoutes(cfg *config.Config) map[string][]string {
	out := make(map[string][]string, len(cfg.Pools))
	for name, p := range cfg.Pools {
		out[name] = slices.Clone(p.Routes)
	}
	return out
}

// embeddingPools names the pools of kind embeddings, sorted.
func embeddingPools(cfg *config.Config) []string {
	var out []string
	for name, p := range cfg.Pools {
		if p.IsEmbeddings() {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// keyring is the front doors' keyring of the configured tenants' key hashes.
func keyring(tenants map[string]*config.Tenant) *frontdoor.Keyring {
	hashes := make(map[string][]string, len(tenants))
	for name, t := range tenants {
		if t != nil {
			hashes[name] = t.APIKeyHashes
		}
	}
	return frontdoor.NewKeyring(hashes)
}

// reportRecordLimit bounds the records one report request makes a gateway
// hold: about 140 MB of them (225,000 records, 100,000 groups, took 62 MB
// and 1.8 s, BenchmarkCompute100kGroups), so a report over a whole week of
// a busy stream cannot take the gateway's memory; `hedgerow report --nats`
// reads any span.
const reportRecordLimit = 500_000

// reportTenants are the tenants whose keys may read the records report.
func reportTenants(tenants map[string]*config.Tenant) map[string]bool {
	out := map[string]bool{}
	for name, t := range tenants {
		if t != nil && t.Reports {
			out[name] = true
		}
	}
	return out
}

// DispatcherOptions is the part of a dispatcher's configuration the file
// describes: its routes, pools, policies, tenants and schema cache. The caller adds the
// connection, the store and the gate.
func DispatcherOptions(cfg *config.Config) dispatcher.Options {
	c := dispatcher.Options{
		Region:      cfg.Deployment.Region,
		Routes:      make([]route.Route, 0, len(cfg.Routes)),
		Pools:       make(map[string]dispatcher.Pool, len(cfg.Pools)),
		Policies:    cfg.Policies,
		Tenants:     cfg.Tenants,
		RouteLimits: routeLimits(cfg),
		SchemaCache: arbiter.SchemaCacheLimits{
			MaxBytes:       int64(cfg.SchemaCache.MaxBytes),
			MaxEntries:     cfg.SchemaCache.MaxEntries,
			CompileTimeout: cfg.SchemaCache.CompileTimeout,
		},
	}
	for _, r := range cfg.Routes {
		c.Routes = append(c.Routes, route.Route{Name: r.Name, Labels: r.Labels, Dialect: dialectOf(r.Provider)})
	}
	for name, p := range cfg.Pools {
		c.Pools[name] = dispatcher.Pool{Routes: p.Routes, Models: p.Models, QueueWait: p.QueueWait, MaxTokens: p.MaxTokens, Health: p.OutlierDetection.Health(), Contract: arbiter.ContractSpec{
			RequireComplete:    p.Contract.RequireComplete,
			AllowEmpty:         p.Contract.AllowEmpty,
			AllowTruncated:     p.Contract.AllowTruncated,
			AllowContentFilter: p.Contract.AllowContentFilter,
			MaxOutputTokens:    p.Contract.MaxOutputTokens,
			RequiredFields:     p.Contract.RequiredFields,
			JSONSchema:         p.Contract.JSONSchema.Document,
		}}
		if p.Rescue.Mode == config.RescueContinue {
			pool := c.Pools[name]
			pool.Rescue = p.Rescue.Max
			for _, r := range p.Routes {
				if rt, ok := cfg.Route(r); ok && rt.CanContinue() {
					pool.Continues = append(pool.Continues, r)
				}
			}
			c.Pools[name] = pool
		}
	}
	return c
}

// routeLimits are the routes' published limits (routes[].limits) the
// dispatcher keeps to, by route; nil when no route has one.
func routeLimits(cfg *config.Config) map[string]dispatcher.RouteLimits {
	var out map[string]dispatcher.RouteLimits
	for _, r := range cfg.Routes {
		if r.Limits.IsZero() {
			continue
		}
		if out == nil {
			out = map[string]dispatcher.RouteLimits{}
		}
		out[r.Name] = dispatcher.RouteLimits{RequestsPerMinute: r.Limits.RequestsPerMinute, TokensPerMinute: r.Limits.TokensPerMinute}
	}
	return out
}

// dialectOf is the API a route's provider speaks.
func dialectOf(p config.Provider) schemas.Dialect {
	if p == config.ProviderAnthropic {
		return schemas.DialectAnthropic
	}
	return schemas.DialectOpenAI
}

// checkPayload refuses a NATS server that takes smaller messages than the
// configuration says the cluster takes.
func checkPayload(cfg *config.Config, nc *nats.Conn) error {
	got := config.ByteSize(nc.MaxPayload())
	if got >= cfg.NATS.MaxPayload {
		return nil
	}
	return fmt.Errorf("%w: the NATS server takes messages of up to %v, nats.max_payload is %v "+
		"(http.body_limit %v plus %v for the attempt envelope must fit): raise max_payload on the NATS servers, "+
		"or lower nats.max_payload and http.body_limit", ErrPayloadTooSmall, got, cfg.NATS.MaxPayload,
		cfg.HTTP.BodyLimit, config.PayloadHeadroom)
}

// gateTTL keeps a won claim at least twice the longest deadline, so a late
// claim of the slowest user action still finds its winner.
func gateTTL(cfg *config.Config) time.Duration {
	ttl := arbiter.DefaultGateTTL
	for _, p := range cfg.Policies {
		ttl = max(ttl, 2*p.Deadline)
	}
	return ttl
}

// InternalAddr is the address of the internal listener (/readyz, /metrics;
// http.internal_listen), nil without one.
func (g *Gateway) InternalAddr() net.Addr {
	if g.internal == nil {
		return nil
	}
	return g.internal.Addr()
}

// Addr is the address the HTTP front door listens on.
func (g *Gateway) Addr() net.Addr { return g.http.Addr() }

// Failed delivers an error if the HTTP server stops on its own.
func (g *Gateway) Failed() <-chan error { return g.http.failed }

// Stop shuts the gateway down within ctx: the front door stops accepting
// and lets requests in flight finish, then the dispatcher stops taking
// submissions and waits for its groups (late losers included), as do the
// generations a reload replaced.
func (g *Gateway) Stop(ctx context.Context) error {
	g.mu.Lock()
	g.stopped = true
	g.mu.Unlock()
	gen := g.cur.Load()
	var stopNATS error
	if gen.nats != nil {
		stopNATS = gen.nats.Stop(ctx)
	}
	var stopInternal error
	if g.internal != nil {
		stopInternal = g.internal.shutdown(ctx)
	}
	return errors.Join(g.http.shutdown(ctx), stopInternal, stopNATS, g.closeDispatcher(ctx))
}

// closeDispatcher stops the current generation's dispatcher and waits for
// the retiring ones, then what it shared with other replicas: its last
// settles reach Redis before the client closes.
func (g *Gateway) closeDispatcher(ctx context.Context) error {
	if err := g.cur.Load().closeDispatcher(ctx); err != nil {
		return errors.Join(fmt.Errorf("gateway: close dispatcher: %w", err), g.closeShared())
	}
	if err := waitGroup(ctx, &g.retiring); err != nil {
		return errors.Join(fmt.Errorf("gateway: the configurations a reload replaced: %w", err), g.closeShared())
	}
	g.closeActions(ctx)
	if err := g.records.Flush(ctx); err != nil {
		return errors.Join(fmt.Errorf("gateway: %w", err), g.closeShared())
	}
	if g.tracer != nil {
		// Spans lost here are only spans: the records were kept above.
		if err := g.tracer.Shutdown(ctx); err != nil {
			return errors.Join(fmt.Errorf("gateway: %w", err), g.closeShared())
		}
	}
	if err := g.closeShared(); err != nil {
		return fmt.Errorf("gateway: close redis: %w", err)
	}
	return nil
}

// closeShared closes the shared state if the gateway opened it, and
// otherwise stops only what the gateway started on it (sketch sharing);
// the index of user actions, when a start failed or closeDispatcher did
// not get to it, stops within actionsCloseTimeout.
func (g *Gateway) closeShared() error {
	ctx, cancel := context.WithTimeout(context.Background(), actionsCloseTimeout)
	g.closeActions(ctx)
	cancel()
	if g.ownsShared {
		return g.shared.close()
	}
	g.shared.stopSharing()
	return nil
}
