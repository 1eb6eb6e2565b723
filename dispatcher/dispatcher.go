// Package dispatcher is hedgerow's gateway runtime: it runs each request as a
// hedge group — the pure engine of dispatcher/hedge fed by real events — over
// NATS to stateless workers, with budgets, the winner gate, delay estimation
// and route choice at its edges. The front doors callers use (package
// frontdoor and below) submit to it; it serves none itself.
package dispatcher

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/dispatcher/route"
	"github.com/hedgerow/hedgerow/schemas"
)

// Budgets is what a dispatcher asks of the shared budgets: admission and
// reservations on the request path, route flags it marks, and the route
// snapshot its picker reads. Any budgets.Store is one; a dispatcher holds no
// leases (workers do).
type Budgets interface {
	budgets.Reservations
	budgets.RouteFlags
	RouteSnapshot(ctx context.Context, routes []string) (map[string]budgets.RouteState, map[string]int, error)
}

// Options wires a Dispatcher to its edges.
type Options struct {
	// Conn is the NATS connection attempts are published on.
	Conn *nats.Conn
	// Region is the supercluster region the dispatcher serves in (config's
	// deployment.region, docs/architecture.md §14): its attempts and live
	// records go on the region's subjects (schemas.RegionWire), so only the
	// region's workers take them — a route with no worker in the region is
	// not served by another's: its attempt finds no responder and fails
	// over as it does today —, and every attempt and group record carries
	// it, so a report reads per region. Empty: a deployment of one region,
	// today's wire, records without a region field.
	Region string
	// Store holds the shared budgets; Gate elects winners.
	Store Budgets
	Gate  arbiter.Gate
	// Routes are the routes attempts may go to, with the labels route
	// choice spreads hedges over.
	Routes []route.Route
	// Pools are the model classes callers name, by name.
	Pools map[string]Pool
	// Policies are the operation classes' policies, by name; the one named
	// policy.DefaultName applies to requests that name no class.
	Policies map[string]*policy.Policy
	// Tenants are the callers with a spend limit of their own, by name.
	Tenants map[string]*policy.Tenant
	// RouteLimits are the provider keys' published limits on the routes,
	// by route name (config's routes[].limits); a route not named has
	// none. Capacity spends them: without it they are not checked.
	RouteLimits map[string]RouteLimits
	// Capacity is the gateway's slices of the routes' limits, which every
	// gateway of the region splits between them (docs/architecture.md §7,
	// "Route capacity"); nil checks no route's capacity.
	Capacity RouteCapacity
	// SchemaCache bounds the work and memory of callers' response_format
	// schemas (docs/architecture.md §6); zero fields take the arbiter's
	// defaults.
	SchemaCache arbiter.SchemaCacheLimits
	// Secret keys the user action ids and prompt fingerprints derived from
	// callers' data, so records never carry the data itself.
	Secret []byte
	// Records keeps the attempt and group records beyond their live
	// publication on core NATS (docs/architecture.md §9); nil keeps none.
	Records Recorder
	// Tracer exports each ended group's timeline as a trace
	// (docs/architecture.md §9, "Traces"); nil exports none.
	Tracer Tracer
	// Registerer receives the dispatcher's metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Recorder keeps records, each under its own logical subject
// (schemas.StoredGroupSubject, schemas.StoredAttemptSubject).
// internal/adapters/records.Publisher is one; it keeps them in batches
// under its region's prefix (schemas.Wire.StoredSubject), and holds data
// until its batch is sent: data must not change after the call.
type Recorder interface {
	// Publish queues a record without waiting for it to be kept.
	Publish(subject string, data []byte)
	// Commit keeps a record before returning, within its own bound; an
	// error says it may not be kept.
	Commit(subject string, data []byte) error
}

// Tracer receives the timeline of every group that ended, with its
// attempts'. It is called on the group's goroutine after the group's last
// event, so it must not block; internal/adapters/tracing's exporter queues spans.
type Tracer interface {
	GroupEnded(GroupTimeline)
}

// GroupTimeline is one ended group as a trace shows it: its span from the
// submission to its last attempt's end, and one child per attempt. The
// records carry what the spans say; nothing else of the request does.
type GroupTimeline struct {
	Start, End time.Time
	// TraceParent is the caller's W3C traceparent (Submission.TraceParent).
	TraceParent string
	// Embeddings says the group answered an embeddings request, not a
	// chat (completions, Messages or Responses) one.
	Embeddings bool
	Group      schemas.GroupRecord
	Attempts   []AttemptTimeline // in launch order
}

// AttemptTimeline is one attempt of a GroupTimeline.
type AttemptTimeline struct {
	Launched, Ended time.Time
	Record          schemas.AttemptRecord
}

// Pool is a model class: routes whose answers are interchangeable under one
// contract.
type Pool struct {
	Routes   []string
	Contract arbiter.ContractSpec
	// Models are the model names the pool answers to besides its own name
	// (aliases such as "gpt-4o"; schemas.CheckModelName), unique across the
	// pools. A submission may name the pool by any of them; records,
	// cohorts, budgets and subjects always use the pool's own name.
	Models []string
	// QueueWait bounds the re-offers of an attempt a worker refused Busy
	// before the group fails overloaded (docs/architecture.md §4 rule 4);
	// zero means hedge.DefaultOptions's (1 s), as config's pools.*.queue_wait.
	QueueWait time.Duration
	// Health is the pool's outlier detection (docs/architecture.md §5,
	// "Route health"); the zero value ejects nothing, as config's
	// pools.*.outlier_detection with both triggers off.
	Health route.HealthOptions
	// Rescue is how many continuation attempts a committed stream that
	// breaks may get (config's pools.*.rescue with mode continue; 0: off),
	// and Continues the pool's routes that can continue an answer from
	// partial output (routes[].continuation not none): a continuation goes
	// only to one of them (docs/architecture.md §6, "Rescue").
	Rescue    int
	Continues []string
	// MaxTokens is the largest output limit (max_tokens) a request may
	// ask of the pool: the most its routes can produce, as config's
	// pools.*.max_tokens. Zero means DefaultMaxTokens. A request over it is
	// refused before anything runs (ErrMaxTokens): its figure would be
	// reserved against the spend ceilings and could only fail upstream.
	MaxTokens int
}

// DefaultMaxTokens is a pool's MaxTokens when it sets none: above every
// provider's output limit today, far below what could overflow the budget
// stores' arithmetic (budgets.MaxUnits).
const DefaultMaxTokens = 1_000_000

// ErrMaxTokens is wrapped, with ErrBadRequest, by Submit for a request whose
// max_tokens is over its pool's MaxTokens. The door's 400 quotes its text,
// so it has no "dispatcher: " prefix (docs/architecture.md §3, "Names").
var ErrMaxTokens = errors.New("max_tokens is over the model's limit")

// Model is one model name callers may send, and the pool answering to it.
type Model struct {
	Name string
	Pool string
}

// Dispatcher runs hedge groups. It is safe for concurrent use.
type Dispatcher struct {
	nc        *nats.Conn
	wire      schemas.Wire // the region's subjects
	records   Recorder     // nil: records are published live only
	tracer    Tracer       // nil: no traces
	store     Budgets
	gate      arbiter.Gate
	routes    []string // every route's name
	pools     map[string]Pool
	models    map[string]string // every model name callers may send → its pool
	listing   []Model           // the same, in Models' order
	tenants   map[string]*policy.Tenant
	secret    []byte
	region    string // stamped on records (Options.Region)
	log       *slog.Logger
	now       func() time.Time
	id        string
	picker    *route.Picker
	health    map[string]*route.Health // each pool's outlier detection, when enabled
	ejectMu   sync.Mutex               // serialises ejection decisions (health.go)
	contracts map[string]*arbiter.Contract
	specs     map[string]arbiter.ContractSpec // the pools' contracts, for requests that add a response_format
	// schemas compiles the contracts of requests with a response_format
	// once per distinct schema: the door's check and the group's start
	// share one compile (docs/architecture.md §6).
	schemaCache   *arbiter.SchemaCache
	dialects      map[string][]schemas.Dialect // the dialects each pool's routes speak
	routeDialects map[string]schemas.Dialect   // each route's (route.Route.Dialect)
	classes       map[string]*policy.Class
	metrics       *metrics
	books         *bookkeeping
	replies       replyMux       // routes every group's replies from one subscription
	overload      overload       // which pools' last offer came back Busy (§4 rule 4)
	unservedFor   time.Duration  // how long a route without a worker is passed over (overload.go)
	dupRates      duplicateRates // each class and pool's duplicate window as this replica counts it (opsmetrics.go)
	// capacity spends the limited routes' capRates (capacity.go); nil
	// when no route has limits or no Capacity was given.
	capacity RouteCapacity
	capRates map[string]routeRates

	// embeddingClasses run the embeddings requests of each class (trigger
	// total, cohorts of their own; embeddings.go).
	embeddingClasses map[string]*policy.Class

	rngMu sync.Mutex
	rng   *mrand.Rand

	closeOnce sync.Once
	closeDone chan struct{} // closed once groups and bookkeeping are done

	mu      sync.Mutex
	closed  bool
	groups  sync.WaitGroup
	nextSeq uint64
}

// New builds a Dispatcher from its configuration.
func New(c Options) (*Dispatcher, error) {
	if c.Conn == nil || c.Store == nil || c.Gate == nil {
		return nil, errors.New("dispatcher: Conn, Store and Gate are required")
	}
	if c.Policies[policy.DefaultName] == nil {
		return nil, fmt.Errorf("dispatcher: no policy named %q", policy.DefaultName)
	}
	d := &Dispatcher{
		nc: c.Conn, wire: schemas.RegionWire(c.Region), records: c.Records, tracer: c.Tracer, store: c.Store, gate: c.Gate, pools: c.Pools, tenants: c.Tenants, secret: c.Secret,
		region: c.Region, log: c.Logger, now: c.Now, unservedFor: unservedFor,
		contracts:   map[string]*arbiter.Contract{},
		schemaCache: arbiter.NewSchemaCache(c.SchemaCache),
		specs:       map[string]arbiter.ContractSpec{},
		classes:     map[string]*policy.Class{},

		embeddingClasses: map[string]*policy.Class{},
	}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if d.now == nil {
		d.now = time.Now
	}
	var seed [16]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return nil, fmt.Errorf("dispatcher: seed: %w", err)
	}
	d.id = hex.EncodeToString(seed[:6])
	d.rng = mrand.New(mrand.NewPCG(beUint64(seed[:8]), beUint64(seed[8:])))
	if len(d.secret) == 0 {
		d.secret = seed[:]
	}
	for _, r := range c.Routes {
		d.routes = append(d.routes, r.Name)
	}
	d.dialects = poolDialects(c.Routes, c.Pools)
	d.routeDialects = make(map[string]schemas.Dialect, len(c.Routes))
	for _, r := range c.Routes {
		d.routeDialects[r.Name] = r.Dialect
	}
	var err error
	if d.capRates, err = newRouteRates(c.RouteLimits, d.routes); err != nil {
		return nil, err
	}
	if c.Capacity != nil && len(d.capRates) > 0 {
		d.capacity = c.Capacity
	}
	if d.picker, err = route.NewPicker(c.Routes, route.Options{}); err != nil {
		return nil, fmt.Errorf("dispatcher: routes: %w", err)
	}
	for name, p := range c.Pools {
		if d.contracts[name], err = arbiter.NewContract(p.Contract); err != nil {
			return nil, fmt.Errorf("dispatcher: pool %s contract: %w", name, err)
		}
		d.specs[name] = p.Contract
		if p.Rescue < 0 || p.Rescue > hedge.MaxRescues {
			return nil, fmt.Errorf("dispatcher: pool %s rescue %d: want 0..%d", name, p.Rescue, hedge.MaxRescues)
		}
		for _, r := range p.Continues {
			if !slices.Contains(p.Routes, r) {
				return nil, fmt.Errorf("dispatcher: pool %s: continuing route %q is not one of its routes", name, r)
			}
		}
	}
	if d.health, err = newHealth(c.Pools); err != nil {
		return nil, err
	}
	if d.models, d.listing, err = modelNames(c.Pools); err != nil {
		return nil, err
	}
	for name, p := range c.Policies {
		if d.classes[name], err = policy.NewClass(name, p); err != nil {
			return nil, fmt.Errorf("dispatcher: %w", err)
		}
		d.embeddingClasses[name] = d.classes[name].ForEmbeddings()
	}
	if d.metrics, err = newMetrics(c.Registerer, d.schemaCache); err != nil {
		return nil, err
	}
	d.metrics.createLabelSets(slices.Sorted(maps.Keys(c.Pools)), d.routes)
	if d.capacity != nil {
		for _, name := range slices.Sorted(maps.Keys(d.capRates)) {
			if d.capRates[name].requests.Key != "" {
				d.metrics.capacityRefused.WithLabelValues(name, "requests")
			}
			if d.capRates[name].tokens.Key != "" {
				d.metrics.capacityRefused.WithLabelValues(name, "tokens")
			}
		}
	}
	// Every route's state exists from the start, before the first refresh
	// of the shared flags (a round trip to Redis) sets it.
	for _, name := range d.routes {
		d.exportRouteState(name, d.now())
	}
	if c.Registerer != nil {
		if err := c.Registerer.Register(newCohortCollector(d)); err != nil {
			return nil, fmt.Errorf("dispatcher: metrics: %w", err)
		}
	}
	d.replies.dropped = d.dropReply
	d.books = startBookkeeping(d)
	return d, nil
}

// dropReply counts a reply not taken for an attempt. It never logs the
// message: a forger could fill the logs, and a reply may carry a secret.
func (d *Dispatcher) dropReply(reason string) {
	d.metrics.repliesDropped.WithLabelValues(reason).Inc()
}

func beUint64(b []byte) uint64 {
	var v uint64
	for _, x := range b {
		v = v<<8 | uint64(x)
	}
	return v
}

// Submission is one request of one user action.
type Submission struct {
	// Operation names the policy; empty means the default policy.
	Operation string
	// Pool is the model the caller named: a pool's own name or one of the
	// model names it answers to (Pool.Models). The group runs on the pool.
	Pool string
	// Tenant and IdempotencyKey identify the user action; an empty key makes
	// a fresh one. Neither is ever recorded: both are hashed.
	Tenant         string
	IdempotencyKey string
	// Deadline overrides the policy's deadline when positive (never longer).
	Deadline time.Duration
	Request  schemas.ChatRequest
	// GroupID is the group's id when the caller reserved it (NewGroupID);
	// empty: a new one.
	GroupID string
	// Supersedes names the group (ID) of a request of this user action that
	// was orphaned: its gateway died mid-flight with no answer kept, as the
	// door's in-flight marker proved (docs/architecture.md §2). A winner
	// gate held by that group is cleared (compare-and-delete) when this
	// group's election meets it, so this try commits instead of answering
	// already_committed.
	Supersedes string
	// AwaitTotalUsage holds the final answer until every attempt of the
	// group ended, so Response.TotalUsage carries the losers' usage too
	// (the NATS door's total_usage). It costs the caller the losers' cancel
	// round trip, bounded by the policy's cancel grace; the HTTP doors,
	// whose answers have no such field, leave it off. A control group's
	// baseline, kept running past the commit to measure it
	// (docs/architecture.md §5), is not waited for: it counts at what it
	// had used by the time the other attempts ended, estimated as a
	// cancelled loser's (hedge.Answered).
	AwaitTotalUsage bool
	// TraceParent is the caller's W3C trace context (the traceparent
	// header), so the group's trace continues the caller's; empty or
	// malformed starts a trace of its own. It is never recorded.
	TraceParent string
}

// Response is a committed answer.
type Response struct {
	UserActionID string
	GroupID      string
	Content      string
	ToolCalls    []byte
	// Refusal is the model's refusal, when it refused (OpenAI's refusal
	// field); a streaming caller gets it only here, after the stream.
	Refusal string
	// Embeddings holds the vectors of an embeddings request: the OpenAI
	// embedding objects, one per input, in input order
	// (schemas.AttemptResult.Embeddings).
	Embeddings   []byte
	FinishReason string
	// Usage is the winner's, as far as known when the response was returned.
	// In the commit a CommitSink is handed before the winner's result is in,
	// the input is the dispatcher's estimate of the request (Estimated set)
	// and the output zero: a provider reports its count at the end.
	Usage schemas.Usage
	// TotalUsage is every attempt's usage, winner and losers, estimates
	// for cancelled ones included; set only with Submission.AwaitTotalUsage.
	TotalUsage  schemas.Usage
	Attempts    int
	Hedged      bool
	Winner      int
	WinnerRoute string
	Gate        string
}

// Delta is a piece of the committed stream.
type Delta struct {
	Content   string
	ToolCalls []byte
}

// Sink receives the committed stream of a streaming submission, in order.
// An error from Delta means the caller went away: the group is cancelled.
type Sink interface {
	Delta(Delta) error
}

// CommitSink is a Sink that also wants to know of the commit before the first
// delta, e.g. to send the winner's route and gate value as response headers.
type CommitSink interface {
	Sink
	Committed(*Response)
}

// GroupError is the one stable error a failed group returns.
type GroupError struct {
	// Group is the failed group's id, as its records name it.
	Group string
	// Pool is the pool the group ran in, which no_workers names.
	Pool  string
	Code  schemas.ErrorCode
	Scope schemas.ErrorScope
	// Holder is the gate value of the committed winner (already_committed).
	Holder string
	// Refused is why nothing was left to try when the group failed after
	// an attempt's failure (hedge.Fail.Refused): RefusedMaxAttempts,
	// RefusedNoRoute, RefusedNoTime or another suppression reason of its
	// last refused replacement; "" when no replacement was refused.
	Refused string
	// Streamed is set when the failure came after bytes reached the caller.
	Streamed bool
	// RetryAfter, when positive, is how long the caller should wait before
	// a retry can succeed: the routes' pushback (rate_limited), or the rest
	// of the tenant's spend window (budget_exhausted), or the pool's queue
	// wait (overloaded).
	RetryAfter time.Duration
}

// Why a failed group had nothing left to try (GroupError.Refused).
const (
	// RefusedMaxAttempts: the group's max_attempts were spent.
	RefusedMaxAttempts = hedge.ReasonNoSlot
	// RefusedNoRoute: every route of the pool was tried or is unhealthy.
	RefusedNoRoute = reasonNoRoute
	// RefusedNoTime: too little time was left before the deadline.
	RefusedNoTime = hedge.ReasonNoTime
)

func (e *GroupError) Error() string {
	if e.Holder != "" {
		return fmt.Sprintf("%s (committed by %s)", e.Code, e.Holder)
	}
	return string(e.Code)
}

// Errors of the submission itself, before any group runs.
var (
	ErrUnknownPool  = errors.New("dispatcher: unknown model")
	ErrBadRequest   = errors.New("dispatcher: invalid request")
	ErrShuttingDown = errors.New("dispatcher: shutting down")
)

// Estimators returns each operation class's hedge-delay estimator, keyed
// by class name, so a sync loop can share their sketches with the other
// replicas (dispatcher/sketchshare).
func (d *Dispatcher) Estimators() map[string]*delay.Estimator {
	out := make(map[string]*delay.Estimator, len(d.classes))
	for name, cl := range d.classes {
		out[name] = cl.Estimator
	}
	return out
}

// Guardrails returns each class's guardrail by class name; its embeddings
// class shares it.
func (d *Dispatcher) Guardrails() map[string]*delay.Guardrail {
	out := make(map[string]*delay.Guardrail, len(d.classes))
	for name, cl := range d.classes {
		out[name] = cl.Guardrail
	}
	return out
}

// Pools lists the pools' own names.
func (d *Dispatcher) Pools() []string {
	out := make([]string, 0, len(d.pools))
	for name := range d.pools {
		out = append(out, name)
	}
	return out
}

// Models lists every model name callers may send: the chat pools in name
// order, each pool's own name followed by its aliases as configured. The
// front doors list them in GET /v1/models as they are given.
func (d *Dispatcher) Models() []Model { return slices.Clone(d.listing) }

// resolve is the pool a model name a caller sent names: a pool's own name
// or one of its aliases.
func (d *Dispatcher) resolve(model string) (string, bool) {
	pool, ok := d.models[model]
	return pool, ok
}

// modelNames indexes every model name of the pools, refusing a name that is
// not one (schemas.CheckModelName) or that two pools answer to.
func modelNames(pools map[string]Pool) (map[string]string, []Model, error) {
	names := slices.Sorted(maps.Keys(pools))
	index := make(map[string]string, len(pools))
	for _, name := range names {
		index[name] = name
	}
	listing := make([]Model, 0, len(index))
	for _, name := range names {
		listing = append(listing, Model{Name: name, Pool: name})
		for _, alias := range pools[name].Models {
			if err := schemas.CheckModelName(alias); err != nil {
				return nil, nil, fmt.Errorf("dispatcher: pool %s: %w", name, err)
			}
			if other, dup := index[alias]; dup {
				return nil, nil, fmt.Errorf("dispatcher: model %q names both pool %s and pool %s", alias, other, name)
			}
			index[alias] = name
			listing = append(listing, Model{Name: alias, Pool: name})
		}
	}
	return index, listing, nil
}

// Submit runs one hedge group for sub and returns the committed answer. A
// streaming submission (sub.Request.Stream) hands the committed stream to
// sink as it arrives and returns when it ends. Cancelling ctx cancels the
// group with no fallback. The group itself lives on until its late losers
// are recorded.
func (d *Dispatcher) Submit(ctx context.Context, sub Submission, sink Sink) (*Response, error) {
	g, err := d.newGroup(ctx, sub)
	if err != nil {
		return nil, err
	}
	return g.serve(ctx, sink)
}

// Close stops taking submissions and waits, bounded by ctx, for the groups
// in flight to finish and their settles to reach the store.
func (d *Dispatcher) Close(ctx context.Context) error {
	d.closeOnce.Do(func() {
		d.mu.Lock()
		d.closed = true
		d.mu.Unlock()
		d.closeDone = make(chan struct{})
		go func() { d.groups.Wait(); d.replies.close(); d.books.close(); close(d.closeDone) }()
	})
	select {
	case <-d.closeDone:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("dispatcher: groups still in flight: %w", ctx.Err())
	}
}
