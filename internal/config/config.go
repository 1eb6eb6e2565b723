package config

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/hedgerow/hedgerow/budgets/lease"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/dispatcher/route"
)

// DefaultPolicy is the name of the policy that applies when a request names
// no operation class. Load always provides one.
const DefaultPolicy = policy.DefaultName

// MaxAttemptsCap is the hard upper bound of a policy's max_attempts: primary,
// hedges and replacements together never exceed it (docs/architecture.md §4 rule 2).
const MaxAttemptsCap = 4

// PayloadHeadroom is the part of a NATS message kept free for the attempt
// envelope (group, attempt, deadline, reply inbox) around the request body,
// so http.body_limit must not exceed nats.max_payload minus this.
const PayloadHeadroom ByteSize = 64 << 10

// Config is a loaded, defaulted and validated configuration file.
type Config struct {
	// File is the path the configuration was loaded from, as given to Load.
	File string `yaml:"-"`
	// Warnings are what Load found loadable but almost surely not meant
	// (Problem.Warning), for the process to print before it starts.
	Warnings Problems `yaml:"-"`

	// Deployment says where this process runs; Global which ceilings hold
	// across regions (docs/architecture.md §14).
	Deployment Deployment `yaml:"deployment"`
	Global     Global     `yaml:"global"`

	NATS    NATS    `yaml:"nats"`
	Redis   Redis   `yaml:"redis"`
	Gate    Gate    `yaml:"gate"`
	Records Records `yaml:"records"`
	Tracing Tracing `yaml:"tracing"`
	HTTP    HTTP    `yaml:"http"`
	// SchemaCache bounds a gateway's work on callers' response_format
	// schemas (docs/architecture.md §6).
	SchemaCache SchemaCache        `yaml:"schema_cache"`
	Routes      []*Route           `yaml:"routes"`
	Pools       map[string]*Pool   `yaml:"pools"`
	Policies    map[string]*Policy `yaml:"policies"`
	Tenants     map[string]*Tenant `yaml:"tenants"`
}

// Deployment says where this process runs (docs/architecture.md §14).
type Deployment struct {
	// Region names this process's region: one NATS cluster with its own
	// JetStream, Redis, gateways and workers. Not a route's labels.region,
	// which names the provider's region. Empty: a deployment of one region.
	Region string `yaml:"region"`
}

// Global names the ceilings that hold across regions and how their
// regional leases are kept (docs/architecture.md §14). Without Regions
// every ceiling is the region's own and nothing here applies.
type Global struct {
	// Regions names every region that may hold a lease, deployment.region
	// among them.
	Regions []string `yaml:"regions"`
	// Ceilings are the kinds of ceiling that hold across regions (empty:
	// every kind a lease can split, lease.CeilingKinds).
	Ceilings []string `yaml:"ceilings"`
	// RebalanceInterval is how often a region renews its leases.
	RebalanceInterval time.Duration `yaml:"rebalance_interval"`
	// LeaseValidity is how long a grant lasts; MaxClockSkew bounds how far
	// apart any two regions' clocks may be.
	LeaseValidity time.Duration `yaml:"lease_validity"`
	MaxClockSkew  time.Duration `yaml:"max_clock_skew"`
	// FallbackShare is a region's safe share of each global ceiling when
	// it cannot reach the authority (default 1 ÷ regions); FloorShare the
	// least a live region's share is sized to (default a tenth of it).
	FallbackShare float64 `yaml:"fallback_share"`
	FloorShare    float64 `yaml:"floor_share"`
	// Authority is the JetStream key-value bucket the leases' tables live
	// in, across the regions' supercluster.
	Authority GlobalAuthority `yaml:"authority"`
	// ReplicateAnswers sends the committed answers of user actions to the
	// other regions with their index entries, so a retry there is
	// replayed; false (the default, for data residency) sends only the
	// entries: hashes, the region and the time, never an answer
	// (docs/architecture.md §14, "User actions across regions").
	ReplicateAnswers bool `yaml:"replicate_answers"`
	// RerunAfter is how long a region must have been unheard before a
	// retry of a user action it committed, whose answer is not here, runs
	// again in another region rather than being refused
	// committed_in_region.
	RerunAfter time.Duration `yaml:"rerun_after"`
	// IndexMaxBytes bounds the region's stream of its committed user
	// actions; the region's copy of the other regions' holds as much for
	// each of them. It must hold http.idempotency.ttl of commits (about
	// 430 bytes each without answers): past it, the oldest are forgotten
	// early, and a retry of one in another region runs again.
	IndexMaxBytes ByteSize `yaml:"index_max_bytes"`
}

// MinRerunAfter is the least global.rerun_after: two of a region's
// heartbeats (docs/architecture.md §14, "User actions across regions").
const MinRerunAfter = 2 * time.Second

// MinIndexMaxBytes is the least global.index_max_bytes.
const MinIndexMaxBytes = ByteSize(1 << 20)

// LeaseOptions are the leases' rules from the global section, for every
// region alike (docs/architecture.md §14).
func (c *Config) LeaseOptions() lease.Options {
	g := c.Global
	return lease.Options{Regions: g.Regions, Validity: g.LeaseValidity, Skew: g.MaxClockSkew,
		Fallback: g.FallbackShare, Floor: g.FloorShare}
}

// GlobalCeiling reports whether ceilings of kind hold across regions.
func (c *Config) GlobalCeiling(kind string) bool {
	if len(c.Global.Regions) == 0 {
		return false
	}
	if len(c.Global.Ceilings) == 0 {
		return slices.Contains(lease.CeilingKinds, kind)
	}
	return slices.Contains(c.Global.Ceilings, kind)
}

// GlobalAuthority places the leases' bucket (budgets/lease/natslease).
type GlobalAuthority struct {
	Bucket string `yaml:"bucket"`
	// Placement is the region whose cluster holds the bucket: the one that
	// keeps renewing when the regions are cut apart. Empty: the cluster of
	// the gateway that creates it.
	Placement string `yaml:"placement"`
	Replicas  int    `yaml:"replicas"`
}

// NATS configures the message bus between dispatchers and workers.
type NATS struct {
	// URLs are the servers of an external NATS cluster; gateway and worker
	// need at least one. serve runs an embedded server and ignores them.
	URLs []string `yaml:"urls"`
	// Listen is the client address of serve's embedded server; empty keeps it
	// in-process only, reachable by no other process.
	Listen string `yaml:"listen"`
	// MaxPayload is the largest NATS message. The embedded server is started
	// with it; a gateway refuses to start against a cluster with a smaller one.
	MaxPayload ByteSize `yaml:"max_payload"`

	// How this process authenticates to NATS (docs/architecture.md §13):
	// at most one of User with PasswordEnv, NKeySeedFile or CredsFile.
	// Secrets never go in the file or a URL.
	User string `yaml:"user"`
	// PasswordEnv names the environment variable holding User's password.
	PasswordEnv string `yaml:"password_env"`
	// NKeySeedFile is a file holding an nkey user seed (SU...), as
	// `hedgerow nats-auth` writes them; relative to the configuration file.
	NKeySeedFile string `yaml:"nkey_seed_file"`
	// CredsFile is a NATS credentials file (user JWT and seed), for servers
	// in operator mode; relative to the configuration file.
	CredsFile string `yaml:"creds_file"`
	// TLS configures TLS towards the NATS servers.
	TLS NATSTLS `yaml:"tls"`
	// ServerConfig is a nats-server configuration file, as `hedgerow
	// nats-auth` writes it, whose authorization (users and their subject
	// permissions) and TLS serve's embedded server takes. serve requires
	// it when Listen is set; its own connections then authenticate with
	// the keys above (the serve user).
	ServerConfig string `yaml:"server_config"`
	// StoreDir is where serve's embedded server keeps its JetStream state
	// (the winner gate's ledger); relative to the configuration file. Empty:
	// the CLI uses hedgerow/nats/HOST-PORT (of http.listen) under the user's state directory, and an
	// embedding program a temporary directory removed at stop.
	StoreDir string `yaml:"store_dir"`
	// SyncInterval is how often serve's embedded JetStream fsyncs what it
	// keeps (the gate's ledger, the records): "always" (the default) or a
	// duration. External servers set it in their own configuration.
	SyncInterval SyncInterval `yaml:"sync_interval"`
}

// NATSTLS configures TLS towards NATS; every path is relative to the
// configuration file, and Load stores the resolved path.
type NATSTLS struct {
	// CAFile is a PEM bundle of the CAs to trust; empty trusts the
	// system's roots (when the URL is tls:// or a cert is given).
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are a client certificate and its key, for
	// servers that verify clients; both or neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name to verify the server's certificate against,
	// when it differs from the URL's host.
	ServerName string `yaml:"server_name"`
}

// Enabled reports whether any TLS key is set.
func (t NATSTLS) Enabled() bool {
	return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != ""
}

// Authenticates reports whether the process presents credentials to NATS.
func (n NATS) Authenticates() bool {
	return n.User != "" || n.NKeySeedFile != "" || n.CredsFile != ""
}

// Redis configures the store shared by replicas: winner gate, ledgers,
// buckets, route flags, the workers' route in-flight leases and the shared
// latency sketch (docs/architecture.md §6, §7).
type Redis struct {
	// URL is a redis:// or rediss:// URL; empty keeps budgets and the winner
	// gate in memory, correct only for a single replica.
	URL string `yaml:"url"`
	// Cluster makes the URL's host the seed of a Redis Cluster; more seeds
	// may follow as addr= query parameters.
	Cluster  bool   `yaml:"cluster"`
	Username string `yaml:"username"`
	// PasswordEnv names the environment variable that holds the password.
	PasswordEnv string   `yaml:"password_env"`
	TLS         RedisTLS `yaml:"tls"`
	// Timeout bounds every request-path call to Redis. When it passes the
	// dispatcher degrades: hedges are suppressed (budget_unavailable),
	// primaries go on, elections keep the local decision.
	Timeout time.Duration `yaml:"timeout"`
	// KeyPrefix starts every key, so deployments can share one Redis.
	KeyPrefix string `yaml:"key_prefix"`
	// HashKeyEnv names the environment variable holding the key that hashes
	// Idempotency-Keys into user action ids (and prompts into fingerprints).
	// Every replica sharing the Redis needs the same key, or one user action
	// gets a different id — and ledger and winner — on each replica. Only
	// serve and gateway need it; a worker uses it, when set, to key its
	// records' prompt fingerprints like the dispatchers'.
	HashKeyEnv string `yaml:"hash_key_env"`
}

// Gate configures the winner gate of replicas sharing Redis
// (docs/architecture.md §6). Without redis.url the single replica's own gate
// is authoritative and the section is unused.
type Gate struct {
	// OnUnavailable is what an election does when Redis cannot answer:
	// fallback (the default) lets a JetStream key-value ledger decide — the
	// ledger also confirms every win, so no user action commits twice, but
	// the NATS servers need JetStream; local keeps each replica's own
	// decision (two replicas may each commit one); refuse fails the group
	// gate_unavailable.
	OnUnavailable string `yaml:"on_unavailable"`
	// Bucket is the ledger's key-value bucket.
	Bucket string `yaml:"bucket"`
	// Replicas is the bucket's replication factor: 1 on one server, 3 on a
	// three-node cluster.
	Replicas int `yaml:"replicas"`
	// Timeout bounds one ledger operation; an election the ledger does not
	// answer within it is refused.
	Timeout time.Duration `yaml:"timeout"`
}

// Records configures the JetStream stream the gateways keep their records
// in (docs/architecture.md §9): one record per attempt and per group,
// published live on core NATS as well. A gateway whose NATS has no
// JetStream logs that records are not kept and still serves.
type Records struct {
	// Stream names the stream; gateways create or update it at start.
	Stream string `yaml:"stream"`
	// MaxAge and MaxBytes bound what the stream keeps; the oldest records
	// go first.
	MaxAge   time.Duration `yaml:"max_age"`
	MaxBytes ByteSize      `yaml:"max_bytes"`
	// Replicas is the stream's replication factor: 1 on one server, 3 on a
	// three-node cluster.
	Replicas int `yaml:"replicas"`
	// Duplicates is the window a retried publication is dropped over, by
	// its message id.
	Duplicates time.Duration `yaml:"duplicates"`
	// MaxPending bounds the records awaiting the stream's ack; past it a
	// record is dropped and counted, never waited for.
	MaxPending int `yaml:"max_pending"`
	// CommitTimeout bounds how long a committed group's answer waits for
	// its record to be kept.
	CommitTimeout time.Duration `yaml:"commit_timeout"`
}

// Tracing configures the optional trace exporter (docs/architecture.md §9,
// "Traces"): a span per group with a child per attempt, sent over OTLP/HTTP.
type Tracing struct {
	// Endpoint is the collector's OTLP/HTTP traces URL, e.g.
	// http://collector:4318/v1/traces; empty exports no traces.
	Endpoint string `yaml:"endpoint"`
	// SampleRatio is the share of groups traced when the caller sent no
	// sampled trace context; a caller's traceparent decides for its own.
	SampleRatio float64 `yaml:"sample_ratio"`
	// HeadersEnv names an environment variable holding the collector's
	// request headers as k=v pairs separated by commas (an API key, say):
	// secrets never go in the file.
	HeadersEnv string `yaml:"headers_env"`
}

// SchemaCache bounds the compiled callers' response_format schemas a
// gateway keeps and the work of compiling one (docs/architecture.md §6).
// A schema over its compile budget is refused 400 naming the budget.
type SchemaCache struct {
	// MaxBytes bounds the measured memory of the compiled schemas kept;
	// one schema may hold an eighth of it compiled (8 MiB by default), one
	// tenant's schemas a quarter.
	MaxBytes ByteSize `yaml:"max_bytes"`
	// MaxEntries bounds how many compiled schemas are kept; one tenant's
	// at most a quarter.
	MaxEntries int `yaml:"max_entries"`
	// CompileTimeout bounds compiling one schema.
	CompileTimeout time.Duration `yaml:"compile_timeout"`
}

// RedisTLS configures TLS towards Redis.
type RedisTLS struct {
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM bundle of the CAs to trust; a relative path is resolved
	// against the configuration file's directory, and Load stores the result.
	CAFile             string `yaml:"ca_file"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

// MaxHeaderLimit bounds http.header_limit: the API server's MaxHeaderBytes,
// past which net/http answers 431 in plain text before the door sees the
// request.
const MaxHeaderLimit ByteSize = 1 << 20

// HTTP configures the OpenAI-compatible front door.
type HTTP struct {
	Listen string `yaml:"listen"`
	// BodyLimit is the largest request body accepted; it must fit in one NATS
	// message with the attempt envelope (see PayloadHeadroom).
	BodyLimit ByteSize `yaml:"body_limit"`
	// HeaderLimit is the largest header block accepted; over it is a 431
	// JSON error in the caller's dialect. At most MaxHeaderLimit: past that
	// net/http refuses the request itself, in plain text.
	HeaderLimit ByteSize `yaml:"header_limit"`
	// MaxConnections caps the open connections of the API listener; a
	// connection past it waits in the kernel's backlog until one closes.
	// Zero means no cap.
	MaxConnections int `yaml:"max_connections"`
	// ReadTimeout bounds reading a request; zero means none.
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// ReadHeaderTimeout bounds reading a request's headers, against
	// clients that send them a byte at a time (slowloris).
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	// WriteTimeout bounds writing a response, streams included, so when set it
	// must be at least every policy's deadline; zero means none.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// IdleTimeout bounds idle keep-alive connections.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// Idempotency bounds the committed answers the HTTP door replays to a
	// retry of the same Idempotency-Key (docs/architecture.md §2).
	Idempotency Idempotency `yaml:"idempotency"`
	// InternalListen, when set, moves /readyz and /metrics off the API
	// listener onto this address (plain HTTP, for probes and scrapers on
	// a private network); /healthz is on both. Empty keeps them on Listen.
	InternalListen string `yaml:"internal_listen"`
	// Pprof serves Go's profiler (net/http/pprof) under /debug/pprof/ on
	// the internal listener, never on the API listener: profiles show the
	// process's code, flags and memory, and taking one costs CPU while it
	// runs, so it is opt-in and needs InternalListen (docs/architecture.md
	// §9, "Profiling").
	Pprof bool `yaml:"pprof"`
	// TLS serves the API listener over TLS; the other way is to terminate
	// TLS at a load balancer in front of plain-HTTP gateways.
	TLS HTTPTLS `yaml:"tls"`
}

// HTTPTLS is the API listener's certificate: both files or neither
// (PEM; the chain first in CertFile).
type HTTPTLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Idempotency is how long and how much of the committed answers a gateway
// keeps for replay: in its memory, or in Redis with redis.url.
type Idempotency struct {
	// TTL is how long a committed answer is replayed.
	TTL time.Duration `yaml:"ttl"`
	// MaxEntryBytes bounds one answer kept; a larger one is not replayed.
	MaxEntryBytes ByteSize `yaml:"max_entry_bytes"`
	// MaxTotalBytes bounds the answers kept: this gateway's in its memory
	// (the oldest evicted past it), or with redis.url those of every
	// gateway sharing the Redis together (new ones not kept past it; it
	// must sit well under Redis' maxmemory, docs/architecture.md §2).
	MaxTotalBytes ByteSize `yaml:"max_total_bytes"`
	// Lease is the lease of a request's in-flight marker: its gateway
	// refreshes it every third of it, and a retry that finds it
	// unrefreshed this long with no answer takes the request over
	// (docs/architecture.md §2).
	Lease time.Duration `yaml:"lease"`
}

// Provider is the API dialect of a route.
type Provider string

// Providers that routes may name.
const (
	ProviderOpenAI    Provider = "openai"    // OpenAI-compatible chat completions
	ProviderAnthropic Provider = "anthropic" // Anthropic Messages
)

// Route is one upstream endpoint serving one model. Attempts for it travel on
// the NATS subject hedgerow.attempt.<name>.
type Route struct {
	// Name is a NATS-subject-safe token, [a-z0-9_-]+, unique among routes.
	Name     string   `yaml:"name"`
	Provider Provider `yaml:"provider"`
	BaseURL  string   `yaml:"base_url"`
	// APIKeyEnv names the environment variable holding the provider key; empty
	// for endpoints that need none, such as the simulator.
	APIKeyEnv string `yaml:"api_key_env"`
	// Model is the provider's model name sent upstream.
	Model string `yaml:"model"`
	// Labels describe the route (e.g. provider, region); a hedge prefers a
	// route whose labels differ from the primary's (docs/architecture.md §5).
	Labels map[string]string `yaml:"labels"`
	// MaxInflight is the number of attempts one worker runs on this route at
	// once before answering Busy.
	MaxInflight int `yaml:"max_inflight"`
	// Limits are the provider key's published limits on this route, which
	// the gateways keep to between them so the provider never answers 429
	// for hedgerow's own excess (docs/architecture.md §7, "Route
	// capacity"). Zero, or absent, is no limit.
	Limits RouteLimits `yaml:"limits"`
	// Continuation is how the route's provider continues an answer from
	// partial output, so a continuation attempt may run on it
	// (docs/architecture.md §6, "Continuation attempts"): ContinuationNone
	// (the default) for a route that cannot.
	Continuation Continuation `yaml:"continuation"`
}

// Continuation is the style in which a route's provider continues an
// answer from partial output: the adapter sends the partial text as the
// final assistant message, marked as the provider's API asks.
type Continuation string

// Continuation styles.
const (
	// ContinuationNone: the route is never sent a continuation.
	ContinuationNone Continuation = "none"
	// ContinuationPrefill: Anthropic's assistant prefill (an anthropic
	// route, of a model that accepts prefill).
	ContinuationPrefill Continuation = "prefill"
	// ContinuationContinueFinalMessage: vLLM's and SGLang's
	// continue_final_message with add_generation_prompt false (an openai
	// route).
	ContinuationContinueFinalMessage Continuation = "continue_final_message"
	// ContinuationPrefix: DeepSeek's assistant message with prefix: true
	// (an openai route at DeepSeek's beta base URL).
	ContinuationPrefix Continuation = "prefix"
)

// Provider is the provider a route must speak for the style; empty for
// ContinuationNone and unknown styles.
func (c Continuation) Provider() Provider {
	switch c {
	case ContinuationPrefill:
		return ProviderAnthropic
	case ContinuationContinueFinalMessage, ContinuationPrefix:
		return ProviderOpenAI
	}
	return ""
}

// CanContinue reports whether the route may be sent a continuation.
func (r *Route) CanContinue() bool { return r.Continuation.Provider() != "" }

// RouteLimits are a provider key's published limits: requests, and input
// plus output tokens, per minute. Zero in a field is no limit there.
type RouteLimits struct {
	RequestsPerMinute int64 `yaml:"requests_per_minute"`
	TokensPerMinute   int64 `yaml:"tokens_per_minute"`
}

// IsZero reports whether the route has no limit at all.
func (l RouteLimits) IsZero() bool { return l == RouteLimits{} }

// Pool is a model class: a set of routes whose answers are interchangeable
// under one contract. Requests name the pool, or one of its Models, as their
// model.
type Pool struct {
	// Routes are the names of the pool's equivalent routes.
	Routes []string `yaml:"routes"`
	// Models are the model names the pool answers to besides its own, so
	// clients keep the names they use ("gpt-4o", "claude-3.5-sonnet"): any
	// string a provider uses (schemas.CheckModelName), unique across the
	// pools' names and models. The pool's own name stays the NATS-safe token
	// records, metrics and budgets carry.
	Models   []string `yaml:"models"`
	Contract Contract `yaml:"contract"`
	// Kind is what the pool serves: chat completions (PoolChat, also when
	// empty) or embeddings (PoolEmbeddings, POST /v1/embeddings).
	Kind PoolKind `yaml:"kind"`
	// QueueWait bounds how long an attempt a worker refused Busy is offered
	// again to the pool's routes before the caller gets 429 overloaded
	// (docs/architecture.md §4 rule 4); never past the deadline. Default
	// 1 s; it must be positive.
	QueueWait time.Duration `yaml:"queue_wait"`
	// MaxTokens is the largest max_tokens (max_completion_tokens,
	// max_output_tokens) a request may ask of the pool: the most its routes
	// can produce. Over it the doors answer 400 naming the parameter. 0
	// (the default) means dispatcher.DefaultMaxTokens, 1,000,000.
	MaxTokens int `yaml:"max_tokens"`
	// OutlierDetection ejects a route of the pool that keeps failing
	// (docs/architecture.md §5, "Route health").
	OutlierDetection OutlierDetection `yaml:"outlier_detection"`
	// Rescue says whether a committed stream of the pool that breaks after
	// its commit is continued on another route (issue 30). Parsed and
	// checked; the dispatcher does not act on it yet.
	Rescue Rescue `yaml:"rescue"`
}

// Rescue is a pool's rescue of committed streams that break after their
// commit: off (the default), or continued from the text the caller has on
// another route whose continuation is not none, at most Max times per
// user action beyond its policy's max_attempts.
type Rescue struct {
	Mode RescueMode `yaml:"mode"`
	// Max is how many continuation attempts one user action may have;
	// 1 (the default) to MaxRescues.
	Max int `yaml:"max"`
}

// RescueMode is what a pool does with a committed stream that breaks.
type RescueMode string

// Rescue modes.
const (
	// RescueOff ends a broken committed stream with stream_interrupted.
	RescueOff RescueMode = "off"
	// RescueContinue starts a continuation attempt.
	RescueContinue RescueMode = "continue"
)

// MaxRescues bounds pools.*.rescue.max: each rescue is an attempt beyond
// max_attempts, paid in full, so a stream that keeps breaking is let go.
const MaxRescues = 3

// OutlierDetection configures route health, as Envoy's outlier detection:
// consecutive transient failures, or a failure rate over a window, eject a
// route for a backoff that doubles with repeated ejections up to
// max_ejection; then it is probed back in. Defaults are
// dispatcher/route's (route.DefaultHealthOptions).
type OutlierDetection struct {
	// ConsecutiveFailures in a row eject a route; 0 turns the trigger off.
	ConsecutiveFailures int `yaml:"consecutive_failures"`
	// FailureRate in [0,1] of at least MinRequests attempts within Window
	// ejects a route; 0 turns the trigger off.
	FailureRate float64       `yaml:"failure_rate"`
	MinRequests int           `yaml:"min_requests"`
	Window      time.Duration `yaml:"window"`
	// BaseEjection is a first ejection's length, MaxEjection the cap of
	// the doubling backoff.
	BaseEjection time.Duration `yaml:"base_ejection"`
	MaxEjection  time.Duration `yaml:"max_ejection"`
	// MaxEjectedPercent bounds the share of the pool's routes out at once
	// (at least one may go; the last healthy route never does).
	MaxEjectedPercent int `yaml:"max_ejected_percent"`
}

// Health returns the route package's form of the configuration.
func (o OutlierDetection) Health() route.HealthOptions {
	return route.HealthOptions{
		ConsecutiveFailures: o.ConsecutiveFailures,
		FailureRate:         o.FailureRate,
		MinRequests:         o.MinRequests,
		Window:              o.Window,
		BaseEjection:        o.BaseEjection,
		MaxEjection:         o.MaxEjection,
		MaxEjectedPercent:   o.MaxEjectedPercent,
	}
}

// Contract says what makes a result valid for a pool (docs/architecture.md §4 rule 3, §6).
//
// Every pool applies the default success predicate to a finished answer: it
// wins only if it is not empty, not truncated below its limit and not ended
// by a content filter. The allow_* keys relax it; the others add to it.
type Contract struct {
	// RequireComplete demands a complete finish reason (not length or filter).
	RequireComplete bool `yaml:"require_complete"`
	// AllowEmpty lets an answer with no content, tool call or refusal win.
	AllowEmpty bool `yaml:"allow_empty"`
	// AllowTruncated lets an answer ended by "length" win however short.
	AllowTruncated bool `yaml:"allow_truncated"`
	// AllowContentFilter lets an answer ended by "content_filter" win.
	AllowContentFilter bool `yaml:"allow_content_filter"`
	// MaxOutputTokens is the routes' own output limit for requests that ask
	// for no max_tokens: an answer ended by "length" with at least this many
	// output tokens stopped at the route's limit and wins. 0 (the default)
	// is unknown: every such answer counts as truncated.
	MaxOutputTokens int `yaml:"max_output_tokens"`
	// RequiredFields are top-level fields the JSON content must contain.
	RequiredFields []string `yaml:"required_fields"`
	// JSONSchema is the JSON Schema the content must satisfy.
	JSONSchema JSONSchema `yaml:"json_schema"`
}

// NeedsComplete reports whether the contract can only be judged on the whole
// answer, which moves the commit point of requests in this pool to complete.
func (c Contract) NeedsComplete() bool {
	return c.RequireComplete || len(c.RequiredFields) > 0 || !c.JSONSchema.IsZero()
}

// JSONSchema is a contract's JSON Schema. In YAML it is either written inline
// as a mapping, or a string naming a JSON file, resolved against the
// configuration file's directory. Load reads the file and checks that the
// schema compiles.
type JSONSchema struct {
	// Source is the resolved file path, or empty for an inline schema.
	Source string
	// Document is the schema as JSON; nil when the contract has no schema.
	Document json.RawMessage
}

// IsZero reports whether no schema was configured.
func (s JSONSchema) IsZero() bool { return s.Source == "" && s.Document == nil }

// The policy types are dispatcher/policy's: the dispatcher and the
// simulator take them as they are, and this package decodes, defaults and
// validates them.
type (
	Trigger       = policy.Trigger
	PushbackScope = policy.PushbackScope
	Policy        = policy.Policy
	Delay         = policy.Delay
	DuplicateRate = policy.DuplicateRate
	Spend         = policy.Spend
	Guardrail     = policy.Guardrail
	Tenant        = policy.Tenant
)

// Hedge triggers.
const (
	TriggerFirstByte = policy.TriggerFirstByte
	TriggerTotal     = policy.TriggerTotal
	PushbackCohort   = policy.PushbackCohort
	PushbackRoute    = policy.PushbackRoute
)

// HashAPIKey returns the form in which tenants' API keys are configured and
// compared (see policy.HashAPIKey).
func HashAPIKey(key string) string { return policy.HashAPIKey(key) }

// Route returns the route with the given name.
func (c *Config) Route(name string) (*Route, bool) {
	for _, r := range c.Routes {
		if r.Name == name {
			return r, true
		}
	}
	return nil, false
}

// PolicyFor returns the policy of an operation class, or the default policy
// when the class is empty or has none of its own.
func (c *Config) PolicyFor(class string) *Policy {
	if p, ok := c.Policies[class]; ok {
		return p
	}
	return c.Policies[DefaultPolicy]
}
