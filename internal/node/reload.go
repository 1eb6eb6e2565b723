package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor/httpdoor"
	"github.com/hedgerow/hedgerow/frontdoor/natsdoor"
	"github.com/hedgerow/hedgerow/frontdoor/tenantlimit"
	"github.com/hedgerow/hedgerow/internal/config"
)

// Errors of Gateway.Reload that callers may branch on.
var (
	// ErrRestartRequired: the new file changes a section a running
	// gateway cannot take over (docs/architecture.md §10, "Reloading").
	ErrRestartRequired = errors.New("needs a restart")
	// ErrStopped: the gateway is stopping.
	ErrStopped = errors.New("gateway stopped")
)

// generation is what a reload rebuilds from the configuration's tenants,
// routes, pools and policies: the dispatcher, the tenants' limiter and
// keyring (inside the doors), the HTTP handlers and the NATS door, with
// metrics of their own. Requests run to their end on the generation that
// took them.
type generation struct {
	cfg      *config.Config
	d        *dispatcher.Dispatcher
	reg      *prometheus.Registry // the dispatcher's and limiter's metrics
	limiter  *tenantlimit.Limiter
	api      http.Handler
	internal http.Handler // nil without http.internal_listen
	nopts    natsdoor.Options
	nats     *natsdoor.Service

	mu       sync.RWMutex // guards retired against enter
	retired  bool
	inflight sync.WaitGroup // HTTP requests that entered
}

// newGeneration builds a generation of cfg on the gateway's connection,
// Redis, records and replay store; its NATS door is started by startNATS.
func (g *Gateway) newGeneration(cfg *config.Config) (*generation, error) {
	gen := &generation{cfg: cfg, reg: prometheus.NewRegistry()}
	dcfg := DispatcherOptions(cfg)
	dcfg.Conn, dcfg.Store, dcfg.Gate, dcfg.Records = g.nc, g.shared.store, g.shared.gate, g.records
	if g.tracer != nil {
		// The generation's spans name its own routes' models and providers.
		dcfg.Tracer = g.tracer.WithRoutes(traceRoutes(cfg))
	}
	dcfg.Secret, dcfg.Registerer, dcfg.Logger = g.secret, gen.reg, g.log.With("component", "dispatcher")
	if dcfg.RouteLimits != nil {
		// The routes' limits are spent from the gateway's slices of the
		// region's ceilings (gatewaySlices, redis.go), which outlive the
		// generation: the region's gateways split each route's limit.
		dcfg.Capacity = g.shared.slices
	}
	d, err := dispatcher.New(dcfg)
	if err != nil {
		return nil, err
	}
	gen.d = d
	if gen.limiter, err = tenantLimiter(cfg, g.shared, gen.reg); err != nil {
		return nil, errors.Join(err, gen.closeDispatcher(context.Background()))
	}
	hopts := httpdoor.Options{
		Conn:           g.nc,
		Region:         cfg.Deployment.Region,
		Pools:          poolRoutes(cfg),
		OwnWorkers:     g.own,
		Gatherer:       prometheus.Gatherers{g.reg, gen.reg},
		Registerer:     gen.reg,
		BodyLimit:      int64(cfg.HTTP.BodyLimit),
		HeaderLimit:    int(cfg.HTTP.HeaderLimit),
		Replays:        g.replays,
		ReplayTTL:      cfg.HTTP.Idempotency.TTL,
		ReplayMaxBytes: int(cfg.HTTP.Idempotency.MaxEntryBytes),
		ReplayLease:    cfg.HTTP.Idempotency.Lease,
		Elsewhere:      g.elsewhere(),
		ReplayMetrics:  g.replayMetrics,
		Logger:         g.log.With("component", "http"),
	}
	// The pools of kind embeddings serve POST /v1/embeddings.
	hopts.EmbeddingPools = embeddingPools(cfg)
	// With no tenants the front door asks for no key (local use); with
	// some, every caller must present one of theirs, compared in constant
	// time.
	if len(cfg.Tenants) > 0 {
		hopts.Keyring = keyring(cfg.Tenants)
	}
	if gen.limiter != nil {
		hopts.Limiter = gen.limiter
	}
	// The report endpoints read the records stream (docs/architecture.md §9).
	reader := g.records.Reader()
	reader.Limit = reportRecordLimit
	hopts.Records, hopts.ReportTenants = reader, reportTenants(cfg.Tenants)
	if cfg.HTTP.InternalListen != "" {
		gen.api, gen.internal, err = httpdoor.NewSplit(d, hopts)
	} else {
		gen.api, err = httpdoor.New(d, hopts)
	}
	if err != nil {
		return nil, errors.Join(err, gen.closeDispatcher(context.Background()))
	}
	gen.nopts = natsdoor.Options{Region: cfg.Deployment.Region, DispatcherID: d.ID(), Logger: g.log.With("component", "nats-submit"),
		Replays: g.replays, ReplayTTL: cfg.HTTP.Idempotency.TTL, ReplayMaxBytes: int(cfg.HTTP.Idempotency.MaxEntryBytes),
		ReplayLease: cfg.HTTP.Idempotency.Lease, Elsewhere: g.elsewhere(), ReplayMetrics: g.replayMetrics, Keyring: hopts.Keyring, Limiter: hopts.Limiter, Registerer: gen.reg}
	if err := g.shared.shareSketches(d, cfg, g.log.With("component", "sketchshare")); err != nil {
		return nil, errors.Join(err, gen.closeDispatcher(context.Background()))
	}
	return gen, nil
}

// startNATS registers the generation's NATS front door (hedgerow.submit).
// Two generations' doors may serve side by side for a moment: they are one
// queue group.
func (gen *generation) startNATS(g *Gateway) error {
	var err error
	gen.nats, err = natsdoor.Start(gen.d, g.nc, gen.nopts)
	return err
}

// enter admits an HTTP request to the generation unless a reload retired
// it; the caller calls leave when the request is answered.
func (gen *generation) enter() bool {
	gen.mu.RLock()
	defer gen.mu.RUnlock()
	if gen.retired {
		return false
	}
	gen.inflight.Add(1)
	return true
}

func (gen *generation) leave() { gen.inflight.Done() }

// retire lets the generation's requests finish, bounded by ctx, then stops
// its NATS door and dispatcher: a reload replaced it.
func (gen *generation) retire(ctx context.Context) error {
	gen.mu.Lock()
	gen.retired = true
	gen.mu.Unlock()
	var errs []error
	if gen.nats != nil {
		errs = append(errs, gen.nats.Stop(ctx))
	}
	errs = append(errs, waitGroup(ctx, &gen.inflight), gen.closeDispatcher(ctx))
	return errors.Join(errs...)
}

// closeDispatcher stops the dispatcher, which waits for its groups (late
// losers included).
func (gen *generation) closeDispatcher(ctx context.Context) error {
	return gen.d.Close(ctx)
}

// swapHandler serves each request on the gateway's current generation,
// which a reload replaces at once; a request that entered a generation
// ends on it.
type swapHandler struct {
	g        *Gateway
	internal bool // the internal listener's handler (/readyz, /metrics)
}

func (h swapHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	for {
		gen := h.g.cur.Load()
		if !gen.enter() {
			continue // retired between the two lines: the next is current
		}
		defer gen.leave()
		if h.internal {
			gen.internal.ServeHTTP(w, r)
		} else {
			gen.api.ServeHTTP(w, r)
		}
		return
	}
}

// reloadMetrics count the reloads by result.
type reloadMetrics struct {
	total       *prometheus.CounterVec
	lastSuccess prometheus.Gauge
}

func newReloadMetrics(reg prometheus.Registerer) (*reloadMetrics, error) {
	m := &reloadMetrics{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hedgerow_config_reloads_total",
			Help: "Configuration reloads (SIGHUP) by result: success, or failure (the running configuration stays)."}, []string{"result"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hedgerow_config_last_reload_success_timestamp_seconds",
			Help: "When the running configuration was loaded: the start, or the last successful reload (Unix seconds)."}),
	}
	for _, c := range []prometheus.Collector{m.total, m.lastSuccess} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	m.total.WithLabelValues("success")
	m.total.WithLabelValues("failure")
	m.lastSuccess.SetToCurrentTime()
	return m, nil
}

// Reload takes over the tenants, routes, pools and policies of the
// configuration load returns (the file the gateway started from, loaded and
// validated as at start) without a restart: requests already taken end on
// the configuration that took them; every later one, over HTTP or NATS,
// gets the new tenants, keys, limits, routes, pools and policies. A file
// that does not load, that changes a section only a restart applies
// (restartOnly), or whose parts do not start leaves the running
// configuration serving; the error says why and is logged with no secret
// value. withWorkers says the process also runs workers of the routes
// (serve), whose routes then take a restart too. Each call counts in
// hedgerow_config_reloads_total.
func (g *Gateway) Reload(load func() (*config.Config, error), withWorkers bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return ErrStopped
	}
	err := g.reload(load, withWorkers)
	if err != nil {
		g.reloads.total.WithLabelValues("failure").Inc()
		g.log.Error("configuration reload failed; the running configuration stays", "err", err)
		return fmt.Errorf("reload: %w", err)
	}
	g.reloads.total.WithLabelValues("success").Inc()
	g.reloads.lastSuccess.SetToCurrentTime()
	g.log.Info("configuration reloaded", "tenants", len(g.cfg.Tenants), "routes", len(g.cfg.Routes),
		"pools", len(g.cfg.Pools), "policies", len(g.cfg.Policies))
	return nil
}

// reload is Reload under g.mu.
func (g *Gateway) reload(load func() (*config.Config, error), withWorkers bool) error {
	cfg, err := load()
	if err != nil {
		return err
	}
	if changed := restartOnly(g.cfg, cfg, withWorkers); len(changed) > 0 {
		return fmt.Errorf("%s changed: that %w (the rest of the file was not applied either)",
			strings.Join(changed, ", "), ErrRestartRequired)
	}
	old := g.cur.Load()
	// One sketch-sharing loop at a time: the old dispatcher's stops, the
	// new one's starts in newGeneration (and the old one's again if that fails).
	g.shared.stopSharing()
	gen, err := g.newGeneration(cfg)
	if err != nil {
		return errors.Join(err, g.shared.shareSketches(old.d, old.cfg, g.log.With("component", "sketchshare")))
	}
	if err := gen.startNATS(g); err != nil {
		g.shared.stopSharing()
		return errors.Join(err, gen.closeDispatcher(context.Background()),
			g.shared.shareSketches(old.d, old.cfg, g.log.With("component", "sketchshare")))
	}
	g.cur.Store(gen)
	g.cfg = cfg
	g.retiring.Add(1)
	go func() {
		defer g.retiring.Done()
		ctx, cancel := context.WithTimeout(context.Background(), retireTimeout(old.cfg))
		defer cancel()
		if err := old.retire(ctx); err != nil {
			g.log.Warn("the replaced configuration's requests did not all end in time", "err", err)
		}
	}()
	return nil
}

// retireTimeout bounds how long a replaced generation's requests may run:
// its longest policy deadline, then the losers' cancel round trip.
func retireTimeout(cfg *config.Config) time.Duration {
	longest := time.Duration(0)
	for _, p := range cfg.Policies {
		longest = max(longest, p.Deadline)
	}
	return longest + 30*time.Second
}

// restartOnly names the sections of next that differ from running and that
// a running gateway cannot take over: its region and its leases of the
// global ceilings, its connections and listeners (nats, redis, http), the
// winner gate and the records stream; with workers in
// the process (serve), the routes too, which they call.
func restartOnly(running, next *config.Config, withWorkers bool) []string {
	var changed []string
	for _, s := range []struct {
		name string
		a, b any
	}{
		{"nats", running.NATS, next.NATS},
		// The region names the wire the doors, the dispatcher and the
		// records stream use (docs/architecture.md §8, "Regions").
		{"deployment", running.Deployment, next.Deployment},
		// The region's leases of the global ceilings are built once, with
		// the shared state (docs/architecture.md §14).
		{"global", running.Global, next.Global},
		{"redis", running.Redis, next.Redis},
		{"gate", running.Gate, next.Gate},
		{"records", running.Records, next.Records},
		{"http", running.HTTP, next.HTTP},
	} {
		if !reflect.DeepEqual(s.a, s.b) {
			changed = append(changed, s.name)
		}
	}
	if withWorkers && !reflect.DeepEqual(workerRoutes(running.Routes), workerRoutes(next.Routes)) {
		changed = append(changed, "routes (serve's workers call them)")
	}
	return slices.Clip(changed)
}

// workerRoutes are routes as workers read them: without their limits,
// which only the gateway keeps to (§7, "Route capacity"), so a reload may
// change those in serve too.
func workerRoutes(routes []*config.Route) []config.Route {
	out := make([]config.Route, 0, len(routes))
	for _, r := range routes {
		if r != nil {
			c := *r
			c.Limits = config.RouteLimits{}
			out = append(out, c)
		}
	}
	return out
}

// waitGroup waits for wg, bounded by ctx.
func waitGroup(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
