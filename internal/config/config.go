package config

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// DefaultPolicy is the name of the policy that applies when a request names
// no operation class. Load always provides one.
const DefaultPolicy = "default"

// MaxAttemptsCap is the hard upper bound of a policy's max_attempts: primary,
// hedges and replacements together never exceed it (DESIGN §4 rule 2).
const MaxAttemptsCap = 4

// PayloadHeadroom is the part of a NATS message kept free for the attempt
// envelope (group, attempt, deadline, reply inbox) around the request body,
// so http.body_limit must not exceed nats.max_payload minus this.
const PayloadHeadroom ByteSize = 64 << 10

// Config is a loaded, defaulted and validated configuration file.
type Config struct {
	// File is the path the configuration was loaded from, as given to Load.
	File string `yaml:"-"`

	NATS     NATS               `yaml:"nats"`
	Redis    Redis              `yaml:"redis"`
	HTTP     HTTP               `yaml:"http"`
	Routes   []*Route           `yaml:"routes"`
	Pools    map[string]*Pool   `yaml:"pools"`
	Policies map[string]*Policy `yaml:"policies"`
	Tenants  map[string]*Tenant `yaml:"tenants"`
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
}

// Redis configures the store shared by replicas: winner gate, ledgers,
// buckets, route flags, the workers' route in-flight leases and the shared
// latency sketch (DESIGN §6, §7).
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

// RedisTLS configures TLS towards Redis.
type RedisTLS struct {
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM bundle of the CAs to trust; a relative path is resolved
	// against the configuration file's directory, and Load stores the result.
	CAFile             string `yaml:"ca_file"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

// HTTP configures the OpenAI-compatible front door.
type HTTP struct {
	Listen string `yaml:"listen"`
	// BodyLimit is the largest request body accepted; it must fit in one NATS
	// message with the attempt envelope (see PayloadHeadroom).
	BodyLimit ByteSize `yaml:"body_limit"`
	// ReadTimeout bounds reading a request; zero means none.
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// WriteTimeout bounds writing a response, streams included, so when set it
	// must be at least every policy's deadline; zero means none.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// IdleTimeout bounds idle keep-alive connections.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
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
	// route whose labels differ from the primary's (DESIGN §5).
	Labels map[string]string `yaml:"labels"`
	// MaxInflight is the number of attempts one worker runs on this route at
	// once before answering Busy.
	MaxInflight int `yaml:"max_inflight"`
}

// Pool is a model class: a set of routes whose answers are interchangeable
// under one contract. Requests name the pool as their model.
type Pool struct {
	// Routes are the names of the pool's equivalent routes.
	Routes   []string `yaml:"routes"`
	Contract Contract `yaml:"contract"`
}

// Contract says what makes a result valid for a pool (DESIGN §4 rule 3, §6).
type Contract struct {
	// RequireComplete demands a complete finish reason (not length or filter).
	RequireComplete bool `yaml:"require_complete"`
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

// Trigger says what a hedge delay is measured against (DESIGN §4 rule 2).
type Trigger string

// Hedge triggers.
const (
	// TriggerFirstByte hedges when the primary has produced no first byte by
	// the delay, so long answers are not mistaken for stalls.
	TriggerFirstByte Trigger = "first_byte"
	// TriggerTotal hedges when the primary has not completed by the delay.
	TriggerTotal Trigger = "total"
)

// Policy is the hedging policy of one operation class.
type Policy struct {
	// Hedge turns hedging on for the class; it needs Idempotent.
	Hedge bool `yaml:"hedge"`
	// Idempotent says that running a request twice has no extra effect; only
	// idempotent classes may hedge.
	Idempotent bool `yaml:"idempotent"`
	// RolloutFraction is the share of groups allowed to hedge, in [0,1].
	RolloutFraction float64 `yaml:"rollout_fraction"`
	// ControlFraction is the share of groups run primary-only as the live
	// baseline for the guardrail, in [0,1].
	ControlFraction float64 `yaml:"control_fraction"`
	Trigger         Trigger `yaml:"trigger"`
	// MaxAttempts counts primary, hedges and replacements, 1..MaxAttemptsCap.
	MaxAttempts int   `yaml:"max_attempts"`
	Delay       Delay `yaml:"delay"`
	// MinUsefulTime is the least time before the deadline worth launching a
	// hedge or replacement into.
	MinUsefulTime time.Duration `yaml:"min_useful_time"`
	// SameRouteHedging lets a hedge use the primary's route when the pool has
	// no other eligible one.
	SameRouteHedging bool `yaml:"same_route_hedging"`
	// Deadline is the absolute budget of a whole user action.
	Deadline    time.Duration       `yaml:"deadline"`
	CommitPoint schemas.CommitPoint `yaml:"commit_point"`
	// DuplicateRate bounds hedges as a share of primaries per cohort.
	DuplicateRate DuplicateRate `yaml:"duplicate_rate"`
	Spend         Spend         `yaml:"spend"`
	// AcceptTimeout is how long a worker has to accept an attempt.
	AcceptTimeout time.Duration `yaml:"accept_timeout"`
	// HeartbeatInterval is how often a worker signals life before the first byte.
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// HeartbeatTimeout is the silence after which an attempt counts as lost.
	HeartbeatTimeout time.Duration `yaml:"heartbeat_timeout"`
	Guardrail        Guardrail     `yaml:"guardrail"`
}

// Delay configures hedge-delay estimation (DESIGN §5).
type Delay struct {
	// Quantile of the cohort's primary latencies used as the delay, in (0,1).
	Quantile float64 `yaml:"quantile"`
	// Min and Max clamp the estimated delay.
	Min time.Duration `yaml:"min"`
	Max time.Duration `yaml:"max"`
	// Initial is the delay used until WarmupSamples latencies are known.
	Initial       time.Duration `yaml:"initial"`
	WarmupSamples int           `yaml:"warmup_samples"`
	// Window is the span of the rolling latency window, kept as Slots
	// mergeable sketches of Window/Slots each.
	Window time.Duration `yaml:"window"`
	Slots  int           `yaml:"slots"`
}

// DuplicateRate configures a cohort's duplicate-rate bucket (DESIGN §7): each
// primary deposits Ceiling tokens and each hedge or replacement takes one, so
// over time extra attempts stay at or below Ceiling × primaries, and in any
// stretch of time at most Capacity above it.
type DuplicateRate struct {
	// Ceiling is the largest share of extra attempts per primary, in (0,1];
	// it is also the ratio a primary deposits.
	Ceiling float64 `yaml:"ceiling"`
	// Capacity is the most tokens the bucket holds, bounding bursts.
	Capacity float64 `yaml:"capacity"`
	// InitialFill is the bucket's content when it is created.
	InitialFill float64 `yaml:"initial_fill"`
	// ReplacementReserve is the level a hedge must leave in the bucket for
	// replacements, which serve the primary path. At most Capacity.
	ReplacementReserve float64 `yaml:"replacement_reserve"`
	// PoolFloor is the capacity of the per-pool floor of DESIGN §7: tokens a
	// pool may spend beyond what its primaries deposited, so a pool with
	// little traffic can still hedge now and then. Zero disables it.
	PoolFloor float64 `yaml:"pool_floor"`
	// PoolFloorRefill is how many floor tokens return per second.
	PoolFloorRefill float64 `yaml:"pool_floor_refill"`
}

// Spend configures spend ceilings in usage units (DESIGN §7); zero means no
// ceiling.
type Spend struct {
	// PerUserAction caps the units all attempts of one user action reserve.
	PerUserAction int64 `yaml:"per_user_action"`
	// PerTenantWindow caps one tenant's units in this class per Window.
	PerTenantWindow int64         `yaml:"per_tenant_window"`
	Window          time.Duration `yaml:"window"`
}

// Guardrail configures when hedging is switched off for a cohort because it
// does not pay (DESIGN §5): the latency quantile of control groups is compared
// with that of hedged groups once both have MinControlSamples samples.
type Guardrail struct {
	Enabled bool `yaml:"enabled"`
	// Quantile compared between control and hedged groups, in (0,1).
	Quantile float64 `yaml:"quantile"`
	// MinControlSamples is the least number of control samples before the
	// guardrail decides anything.
	MinControlSamples int `yaml:"min_control_samples"`
	// MinGain is the least relative reduction of the quantile, in [0,1),
	// below which the gain counts as flat.
	MinGain float64 `yaml:"min_gain"`
	// MaxErrorRateIncrease is the largest rise of the error rate of hedged
	// groups over control groups, in [0,1], before hedging is disabled.
	MaxErrorRateIncrease float64 `yaml:"max_error_rate_increase"`
	// ProbeInterval is how long hedging stays off before it is probed again.
	ProbeInterval time.Duration `yaml:"probe_interval"`
}

// Tenant is a caller of the HTTP front door. With no tenants configured the
// front door requires no API key, which suits only local use.
type Tenant struct {
	// APIKeyHashes are "sha256:<64 hex digits>" hashes of the tenant's API
	// keys (see HashAPIKey); plaintext keys are refused.
	APIKeyHashes []string `yaml:"api_key_hashes"`
	// SpendLimit caps the tenant's units across all classes per SpendWindow;
	// zero means no limit.
	SpendLimit  int64         `yaml:"spend_limit"`
	SpendWindow time.Duration `yaml:"spend_window"`
}

// HashAPIKey returns the form in which tenants' API keys are configured and
// compared: "sha256:" followed by the lowercase hex SHA-256 of the key.
func HashAPIKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

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

// TenantByKeyHash returns the tenant holding an API key hash.
func (c *Config) TenantByKeyHash(hash string) (string, bool) {
	for name, t := range c.Tenants {
		for _, h := range t.APIKeyHashes {
			if h == hash {
				return name, true
			}
		}
	}
	return "", false
}
