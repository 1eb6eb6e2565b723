package config

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/budgets/lease"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/internal/redact"
	"github.com/hedgerow/hedgerow/schemas"
)

// maxNATSPayload is the largest max_payload a NATS server accepts.
const maxNATSPayload ByteSize = 64 << 20

var (
	// subjectToken is what route, pool, policy and tenant names must match:
	// they become NATS subject tokens, Redis key parts and metric labels.
	subjectToken = regexp.MustCompile(`^[a-z0-9_-]+$`)
	envVarName   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	keyHash      = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
)

// placeholderKeyHash is the all-zero hash the examples in deploy/ carry
// where an operator's key hash goes: a SHA-256 no key has.
var placeholderKeyHash = "sha256:" + strings.Repeat("0", 64)

// validator checks a decoded, defaulted Config and reports every problem.
type validator struct {
	*reporter
	cfg  *Config
	dir  string // directory of the file, for relative paths
	role Role
	env  LookupEnv
	// usersPending: the NATS users are being generated from this file, so
	// a serve listener may still lack them (LoadForNATSUsers).
	usersPending bool
}

func (v *validator) validate() {
	v.nats()
	v.redis()
	v.gate()
	v.records()
	v.tracing()
	v.global()
	v.http()
	v.schemaCache()
	v.routes()
	v.pools()
	for _, name := range slices.Sorted(maps.Keys(v.cfg.Policies)) {
		v.policy("policies."+name, name, v.cfg.Policies[name])
	}
	v.tenants()
}

func (v *validator) nats() {
	n := v.cfg.NATS
	for i, u := range n.URLs {
		p := indexPath("nats.urls", i)
		parsed, err := url.Parse(u)
		switch {
		case err != nil:
			v.addf(p, "%q is not a URL", redact.URL(u))
		case !slices.Contains([]string{"nats", "tls", "ws", "wss"}, parsed.Scheme) || parsed.Host == "":
			v.addf(p, "%q: want nats://, tls://, ws:// or wss:// with a host", redact.URL(u))
		}
	}
	if v.role.NeedsExternalNATS() && len(n.URLs) == 0 {
		v.addf("nats.urls", "role %s connects to an external NATS cluster and needs at least one URL", v.role)
	}
	if n.Listen != "" {
		v.hostPort("nats.listen", n.Listen)
	}
	if n.MaxPayload <= 0 || n.MaxPayload > maxNATSPayload {
		v.addf("nats.max_payload", "%v is outside (0, %v]", n.MaxPayload, maxNATSPayload)
	}
	v.natsAuth()
}

// natsAuth checks how the process authenticates to NATS: one method at
// most, secrets only by reference (an environment variable, a file), the
// files there; and that serve opens no listener without users
// (ErrOpenListener, which serve itself also returns).
func (v *validator) natsAuth() {
	n := &v.cfg.NATS
	for i, u := range n.URLs {
		if parsed, err := url.Parse(u); err == nil && parsed.User != nil {
			// Never echo the URL: it holds a secret.
			v.addf(indexPath("nats.urls", i), "must not hold credentials; use nats.user with nats.password_env, nats.nkey_seed_file or nats.creds_file")
		}
	}
	methods := 0
	for _, set := range []bool{n.User != "" || n.PasswordEnv != "", n.NKeySeedFile != "", n.CredsFile != ""} {
		if set {
			methods++
		}
	}
	if methods > 1 {
		v.addf("nats", "set one of user with password_env, nkey_seed_file or creds_file, not several")
	}
	if (n.User == "") != (n.PasswordEnv == "") {
		v.addf("nats.password_env", "nats.user and nats.password_env go together")
	}
	// serve connects only to its own server, and only needs credentials
	// when that server has users.
	connects := v.role.NeedsExternalNATS() || n.ServerConfig != ""
	v.secret("nats.password_env", n.PasswordEnv, connects && n.User != "", "role %s authenticates to NATS with it", v.role)
	v.file(&n.NKeySeedFile)
	v.file(&n.CredsFile)
	v.file(&n.TLS.CAFile)
	v.file(&n.TLS.CertFile)
	v.file(&n.TLS.KeyFile)
	if (n.TLS.CertFile == "") != (n.TLS.KeyFile == "") {
		v.addf("nats.tls.cert_file", "cert_file and key_file go together")
	}
	serve := v.role == RoleServe
	v.file(&n.ServerConfig)
	v.file(&n.StoreDir)
	if n.SyncInterval != 0 && !serve {
		v.addf("nats.sync_interval", "only serve embeds a NATS server; set sync_interval in the jetstream block of your nats-server configuration")
	}
	switch {
	case serve && n.Listen != "" && n.ServerConfig == "" && !v.usersPending:
		// The check StartServe makes, so that config check says it first.
		v.addErr("nats.listen", ErrOpenListener)
	case n.ServerConfig != "" && !serve:
		v.addf("nats.server_config", "only serve embeds a NATS server; role %s connects to nats.urls", v.role)
	case serve && n.ServerConfig != "" && !n.Authenticates():
		v.addf("nats.server_config", "serve connects to its own server as a user of it: set nats.nkey_seed_file (or nats.user with password_env) to the serve user's (`hedgerow nats-auth --serve` writes it)")
	}
}

// ErrOpenListener is why serve refuses nats.listen without users
// (internal/node.StartServe): anyone
// who reaches the port could publish attempts, forge replies and records,
// and read every prompt and answer.
var ErrOpenListener = errors.New("nats.listen opens the embedded NATS server to other processes, which needs authentication: " +
	"generate users and permissions with `hedgerow nats-auth --serve --config FILE --out DIR`, then set nats.server_config " +
	"to DIR/nats-server.conf and nats.nkey_seed_file to DIR/serve.nk (or remove nats.listen to stay in-process)")

// file resolves a path against the configuration file's directory. Its
// presence is checked when the process opens it, not here: `hedgerow
// nats-auth` writes these files from this very configuration.
func (v *validator) file(p *string) {
	if *p != "" && !filepath.IsAbs(*p) {
		*p = filepath.Join(v.dir, *p)
	}
}

func (v *validator) redis() {
	r := v.cfg.Redis
	tlsOn := r.TLS.Enabled
	if r.URL != "" {
		u, err := url.Parse(r.URL)
		switch {
		case err != nil:
			v.addf("redis.url", "not a URL: %v", redact.Error(err))
		case u.Scheme != "redis" && u.Scheme != "rediss" || u.Host == "":
			v.addf("redis.url", "want redis:// or rediss:// with a host, got %q", redact.URL(r.URL))
		case u.User != nil:
			v.addf("redis.url", "must not hold credentials; use redis.username and redis.password_env")
		default:
			tlsOn = tlsOn || u.Scheme == "rediss"
		}
	}
	if r.Timeout <= 0 || r.Timeout > 10*time.Second {
		v.addf("redis.timeout", "%v is outside (0, 10s]", r.Timeout)
	}
	if !subjectToken.MatchString(r.KeyPrefix) {
		v.addf("redis.key_prefix", "%q is not a token of [a-z0-9_-]", r.KeyPrefix)
	}
	if !tlsOn && (r.TLS.CAFile != "" || r.TLS.InsecureSkipVerify) {
		v.addf("redis.tls", "ca_file and insecure_skip_verify need tls.enabled: true or a rediss:// URL")
	}
	if r.TLS.CAFile != "" && !filepath.IsAbs(r.TLS.CAFile) {
		v.cfg.Redis.TLS.CAFile = filepath.Join(v.dir, r.TLS.CAFile)
	}
	// Every role connects to Redis when redis.url is set: dispatchers keep
	// budgets, route flags and the winner gate there, workers their route
	// in-flight leases.
	used := r.URL != ""
	if used && r.TLS.CAFile != "" {
		if _, err := os.Stat(v.cfg.Redis.TLS.CAFile); err != nil {
			v.addf("redis.tls.ca_file", "%v", err)
		}
	}
	v.secret("redis.password_env", r.PasswordEnv, used, "role %s connects to redis with it", v.role)
	hashes := used && v.role.HashesUserActions()
	if hashes && r.HashKeyEnv == "" {
		v.addf("redis.hash_key_env", "required with redis.url: replicas must share the key that turns an Idempotency-Key into a user action id")
	}
	v.secret("redis.hash_key_env", r.HashKeyEnv, hashes, "role %s hashes user action ids with it", v.role)
}

func (v *validator) gate() {
	g := v.cfg.Gate
	switch g.OnUnavailable {
	case "local", "fallback", "refuse":
	default:
		v.addf("gate.on_unavailable", "%q is not one of local, fallback, refuse", g.OnUnavailable)
	}
	if !bucketName.MatchString(g.Bucket) {
		v.addf("gate.bucket", "%q is not a bucket name of [A-Za-z0-9_-]", g.Bucket)
	}
	if g.Replicas < 1 || g.Replicas > 5 {
		v.addf("gate.replicas", "%d is outside [1, 5]", g.Replicas)
	}
	if g.Timeout <= 0 || g.Timeout > 10*time.Second {
		v.addf("gate.timeout", "%v is outside (0, 10s]", g.Timeout)
	}
}

func (v *validator) records() {
	r := v.cfg.Records
	if !bucketName.MatchString(r.Stream) {
		v.addf("records.stream", "%q is not a stream name of [A-Za-z0-9_-]", r.Stream)
	}
	if r.MaxAge <= 0 {
		v.addf("records.max_age", "%v must be positive", r.MaxAge)
	}
	if r.MaxBytes <= 0 {
		v.addf("records.max_bytes", "%d must be positive", r.MaxBytes)
	}
	if r.Replicas < 1 || r.Replicas > 5 {
		v.addf("records.replicas", "%d is outside [1, 5]", r.Replicas)
	}
	if r.Duplicates <= 0 || r.Duplicates > r.MaxAge {
		v.addf("records.duplicates", "%v is outside (0, records.max_age]", r.Duplicates)
	}
	if r.MaxPending < 1 || r.MaxPending > 1<<20 {
		v.addf("records.max_pending", "%d is outside [1, 1048576]", r.MaxPending)
	}
	if r.CommitTimeout <= 0 || r.CommitTimeout > 10*time.Second {
		v.addf("records.commit_timeout", "%v is outside (0, 10s]", r.CommitTimeout)
	}
}

// global checks the regions and the leases of the ceilings that hold across
// them (docs/architecture.md §14).
func (v *validator) global() {
	d, g := v.cfg.Deployment, v.cfg.Global
	if d.Region != "" && !subjectToken.MatchString(d.Region) {
		v.addf("deployment.region", "%q is not a token of [a-z0-9_-]", d.Region)
	}
	if len(g.Regions) == 0 {
		if g.Authority.Placement != "" || len(g.Ceilings) > 0 || g.FallbackShare != 0 || g.FloorShare != 0 || g.ReplicateAnswers {
			v.addf("global.regions", "empty while other global settings are set: name every region that shares the global ceilings")
		}
		return
	}
	for i, r := range g.Regions {
		if !subjectToken.MatchString(r) || slices.Contains(g.Regions[:i], r) {
			v.addf(fmt.Sprintf("global.regions[%d]", i), "%q is not a token of [a-z0-9_-] or is named twice", r)
		}
	}
	switch {
	case d.Region == "":
		v.addf("deployment.region", "empty while global.regions is set: name this process's region")
	case !slices.Contains(g.Regions, d.Region):
		v.addf("deployment.region", "%q is not one of global.regions %v", d.Region, g.Regions)
	}
	if p := g.Authority.Placement; p != "" && !slices.Contains(g.Regions, p) {
		v.addf("global.authority.placement", "%q is not one of global.regions %v", p, g.Regions)
	}
	if !bucketName.MatchString(g.Authority.Bucket) {
		v.addf("global.authority.bucket", "%q is not a bucket name of [A-Za-z0-9_-]", g.Authority.Bucket)
	}
	if r := g.Authority.Replicas; r < 1 || r > 5 {
		v.addf("global.authority.replicas", "%d is outside [1, 5]", r)
	}
	for i, c := range g.Ceilings {
		if !slices.Contains(lease.CeilingKinds, c) {
			v.addf(fmt.Sprintf("global.ceilings[%d]", i), "%q is not one of %v", c, lease.CeilingKinds)
		}
	}
	if err := v.cfg.LeaseOptions().Validate(); err != nil {
		v.addf("global", "%v", err)
	}
	if r := g.RerunAfter; r < MinRerunAfter+g.MaxClockSkew {
		v.addf("global.rerun_after", "%v is under %v and max_clock_skew %v: a region is judged unheard by its heartbeats, one a second, against the servers' clocks, so a shorter bound would run user actions again over a late heartbeat or a clock ahead", r, MinRerunAfter, g.MaxClockSkew)
	}
	if b := g.IndexMaxBytes; b < MinIndexMaxBytes {
		v.addf("global.index_max_bytes", "%v is under %v", b, MinIndexMaxBytes)
	}
	if r := g.RebalanceInterval; r <= 0 || 2*r > g.LeaseValidity-g.MaxClockSkew {
		v.addf("global.rebalance_interval", "%v: two intervals must fit in lease_validity %v less max_clock_skew %v, so that one lost renewal does not drop a region to its safe share",
			r, g.LeaseValidity, g.MaxClockSkew)
	}
}

func (v *validator) tracing() {
	t := v.cfg.Tracing
	if t.Endpoint != "" {
		u, err := url.Parse(t.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			v.addf("tracing.endpoint", "want an http or https URL of the collector's OTLP traces endpoint, with no credentials in it")
		}
	}
	if t.SampleRatio < 0 || t.SampleRatio > 1 {
		v.addf("tracing.sample_ratio", "%v is outside [0, 1]", t.SampleRatio)
	}
	if t.HeadersEnv != "" && t.Endpoint == "" {
		v.addf("tracing.headers_env", "set without tracing.endpoint")
	}
}

// bucketName is a JetStream key-value bucket or stream name.
var bucketName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

func (v *validator) http() {
	h := v.cfg.HTTP
	v.hostPort("http.listen", h.Listen)
	if room := v.cfg.NATS.MaxPayload - PayloadHeadroom; h.BodyLimit <= 0 || h.BodyLimit > room {
		v.addf("http.body_limit", "%v is outside (0, %v]: a request must fit in nats.max_payload %v with %v for the attempt envelope",
			h.BodyLimit, max(room, 0), v.cfg.NATS.MaxPayload, PayloadHeadroom)
	}
	if h.HeaderLimit <= 0 || h.HeaderLimit >= MaxHeaderLimit {
		v.addf("http.header_limit", "%v is outside (0, %v)", h.HeaderLimit, MaxHeaderLimit)
	}
	if h.InternalListen != "" {
		v.hostPort("http.internal_listen", h.InternalListen)
		if h.InternalListen == h.Listen {
			v.addf("http.internal_listen", "%q is http.listen: name another address, or leave it empty", h.InternalListen)
		}
	}
	if h.Pprof && h.InternalListen == "" {
		v.addf("http.pprof", "needs http.internal_listen: the profiler is served on the internal listener only, never on the API listener; "+
			"name an operators' address there (e.g. 127.0.0.1:9090), or leave pprof off")
	}
	if (h.TLS.CertFile == "") != (h.TLS.KeyFile == "") {
		v.addf("http.tls", "cert_file and key_file go together")
	}
	if h.MaxConnections < 0 {
		v.addf("http.max_connections", "%d is negative", h.MaxConnections)
	}
	if id := h.Idempotency; id.TTL <= 0 {
		v.addf("http.idempotency.ttl", "%v is not positive", id.TTL)
	}
	if id := h.Idempotency; id.Lease < 30*time.Millisecond {
		v.addf("http.idempotency.lease", "%v is below 30ms: it is refreshed every third of it", id.Lease)
	}
	if id := h.Idempotency; id.MaxEntryBytes <= 0 || id.MaxTotalBytes < id.MaxEntryBytes {
		v.addf("http.idempotency.max_entry_bytes", "%v must be positive and at most http.idempotency.max_total_bytes %v", id.MaxEntryBytes, id.MaxTotalBytes)
	}
	for _, t := range []struct {
		key string
		d   time.Duration
	}{{"read_timeout", h.ReadTimeout}, {"read_header_timeout", h.ReadHeaderTimeout}, {"write_timeout", h.WriteTimeout}, {"idle_timeout", h.IdleTimeout}} {
		if t.d < 0 {
			v.addf("http."+t.key, "%v is negative", t.d)
		}
	}
	if h.WriteTimeout > 0 {
		for _, name := range slices.Sorted(maps.Keys(v.cfg.Policies)) {
			if d := v.cfg.Policies[name].Deadline; d > h.WriteTimeout {
				v.addf("http.write_timeout", "%v is shorter than policies.%s.deadline %v: responses would be cut off", h.WriteTimeout, name, d)
			}
		}
	}
}

// Bounds of schema_cache: a cache smaller than MinSchemaCacheBytes would
// leave a schema less than an eighth of it, refusing ordinary structured
// outputs; a compile timeout over MaxSchemaCompileTimeout would let one
// request hold a core for longer than any deadline worth serving.
const (
	MinSchemaCacheBytes     ByteSize = 1 << 20
	MaxSchemaCompileTimeout          = 10 * time.Second
)

func (v *validator) schemaCache() {
	s := v.cfg.SchemaCache
	if s.MaxBytes < MinSchemaCacheBytes {
		v.addf("schema_cache.max_bytes", "%v is below %v: one schema may hold an eighth of it", s.MaxBytes, MinSchemaCacheBytes)
	}
	if s.MaxEntries < arbiter.TenantShareDivisor {
		v.addf("schema_cache.max_entries", "%d is below %d: each tenant may hold a quarter of the entries", s.MaxEntries, arbiter.TenantShareDivisor)
	}
	if s.CompileTimeout <= 0 || s.CompileTimeout > MaxSchemaCompileTimeout {
		v.addf("schema_cache.compile_timeout", "%v is outside (0, %v]", s.CompileTimeout, MaxSchemaCompileTimeout)
	}
}

func (v *validator) routes() {
	if len(v.cfg.Routes) == 0 {
		v.addf("routes", "at least one route is needed")
	}
	first := map[string]int{}
	for i, r := range v.cfg.Routes {
		p := indexPath("routes", i)
		if v.token(p+".name", r.Name) {
			if j, dup := first[r.Name]; dup {
				v.addf(p+".name", "%q is already the name of routes[%d]", r.Name, j)
			} else {
				first[r.Name] = i
			}
		}
		switch r.Provider {
		case ProviderOpenAI, ProviderAnthropic:
		case "":
			v.addf(p+".provider", "is required (openai or anthropic)")
		default:
			v.addf(p+".provider", "%q: want openai or anthropic", r.Provider)
		}
		if r.BaseURL == "" {
			v.addf(p+".base_url", "is required")
		} else if u, err := url.Parse(r.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			v.addf(p+".base_url", "%q: want an absolute http:// or https:// URL", redact.URL(r.BaseURL))
		}
		if r.Model == "" {
			v.addf(p+".model", "is required")
		}
		if r.MaxInflight < 1 {
			v.addf(p+".max_inflight", "%d is less than 1", r.MaxInflight)
		}
		v.continuation(p+".continuation", r)
		v.routeLimit(p+".limits.requests_per_minute", r.Limits.RequestsPerMinute)
		v.routeLimit(p+".limits.tokens_per_minute", r.Limits.TokensPerMinute)
		for _, k := range slices.Sorted(maps.Keys(r.Labels)) {
			if k == "" || r.Labels[k] == "" {
				v.addf(p+".labels", "label %q: keys and values must not be empty", k)
			}
		}
		v.secret(p+".api_key_env", r.APIKeyEnv, v.role.CallsProviders(),
			"role %s calls route %q with it", v.role, r.Name)
	}
}

// MaxRouteLimit bounds routes.*.limits: far above any provider's published
// limit, and within what the slices' arithmetic keeps exact
// (budgets.MaxUnits, 2^50).
const MaxRouteLimit = budgets.MaxUnits

// routeLimit checks one of a route's published limits: a whole number
// (the decoder refuses a fraction), 0 for none.
func (v *validator) routeLimit(path string, n int64) {
	switch {
	case n < 0:
		v.addf(path, "%d is negative; 0 (or leaving it out) means no limit", n)
	case n > MaxRouteLimit:
		v.addf(path, "%d is over %d", n, int64(MaxRouteLimit))
	}
}

// outlierDetection checks a pool's route-health keys.
// maxPoolTokens bounds pools.*.max_tokens far below what the budget
// stores' sums can hold (budgets.MaxUnits, 2^50).
const maxPoolTokens = 1 << 32

func (v *validator) outlierDetection(p string, o OutlierDetection) {
	if o.ConsecutiveFailures < 0 {
		v.addf(p+".consecutive_failures", "%d is negative; 0 turns the trigger off", o.ConsecutiveFailures)
	}
	if o.FailureRate < 0 || o.FailureRate > 1 {
		v.addf(p+".failure_rate", "%v is outside [0,1]; 0 turns the trigger off", o.FailureRate)
	}
	if o.FailureRate > 0 {
		if o.MinRequests < 1 {
			v.addf(p+".min_requests", "%d must be at least 1 while failure_rate is set", o.MinRequests)
		}
		if o.Window <= 0 {
			v.addf(p+".window", "%v must be positive while failure_rate is set", o.Window)
		}
	}
	if o.BaseEjection <= 0 {
		v.addf(p+".base_ejection", "%v must be positive", o.BaseEjection)
	} else if o.MaxEjection < o.BaseEjection {
		v.addf(p+".max_ejection", "%v is shorter than base_ejection %v", o.MaxEjection, o.BaseEjection)
	}
	if o.MaxEjectedPercent < 0 || o.MaxEjectedPercent > 100 {
		v.addf(p+".max_ejected_percent", "%d is outside [0,100]", o.MaxEjectedPercent)
	}
}

func (v *validator) pools() {
	if len(v.cfg.Pools) == 0 {
		v.addf("pools", "at least one pool is needed")
	}
	for _, name := range slices.Sorted(maps.Keys(v.cfg.Pools)) {
		pool, p := v.cfg.Pools[name], "pools."+name
		v.token(p, name)
		if len(pool.Routes) == 0 {
			v.addf(p+".routes", "a pool needs at least one route")
		}
		if pool.QueueWait <= 0 {
			v.addf(p+".queue_wait", "must be positive")
		}
		if pool.MaxTokens < 0 || pool.MaxTokens > maxPoolTokens {
			v.addf(p+".max_tokens", "%d is outside [0, %d]", pool.MaxTokens, maxPoolTokens)
		}
		v.outlierDetection(p+".outlier_detection", pool.OutlierDetection)
		v.rescue(p, *pool)
		seen := map[string]bool{}
		for i, rn := range pool.Routes {
			rp := indexPath(p+".routes", i)
			if _, ok := v.cfg.Route(rn); !ok {
				v.addf(rp, "no route is named %q", rn)
			}
			if seen[rn] {
				v.addf(rp, "route %q is listed twice", rn)
			}
			seen[rn] = true
		}
		fields := map[string]bool{}
		for i, f := range pool.Contract.RequiredFields {
			if f == "" {
				v.addf(indexPath(p+".contract.required_fields", i), "must not be empty")
			} else if fields[f] {
				v.addf(indexPath(p+".contract.required_fields", i), "%q is listed twice", f)
			}
			fields[f] = true
		}
		if err := pool.Contract.JSONSchema.resolve(v.dir, p); err != nil {
			v.addf(p+".contract.json_schema", "%v", err)
		}
		if pool.Contract.MaxOutputTokens < 0 {
			v.addf(p+".contract.max_output_tokens", "%d is negative", pool.Contract.MaxOutputTokens)
		}
		v.poolKind(p, *pool) // embeddings.go
	}
	v.models()
}

// models checks the model names the pools answer to besides their own
// (pools.*.models): each a name a provider could use, and each naming one
// pool only, so a caller's model never picks a pool by chance.
func (v *validator) models() {
	owner := map[string]string{} // model name → the path that claimed it first
	for _, name := range slices.Sorted(maps.Keys(v.cfg.Pools)) {
		owner[name] = "pools." + name
	}
	for _, name := range slices.Sorted(maps.Keys(v.cfg.Pools)) {
		for i, m := range v.cfg.Pools[name].Models {
			mp := indexPath("pools."+name+".models", i)
			if err := schemas.CheckModelName(m); err != nil {
				v.addf(mp, "%s", strings.TrimPrefix(err.Error(), "schemas: "))
				continue
			}
			switch first, dup := owner[m]; {
			case !dup:
				owner[m] = mp
			case first == "pools."+name:
				v.addf(mp, "%q is the pool's own name, which it answers to already", m)
			default:
				v.addf(mp, "%q is already a model of %s: a model name may name one pool only", m, first)
			}
		}
	}
}

func (v *validator) policy(p, name string, pol *Policy) {
	v.token(p, name)
	v.fraction(p+".rollout_fraction", pol.RolloutFraction)
	v.fraction(p+".control_fraction", pol.ControlFraction)
	if pol.Hedge && !pol.Idempotent {
		v.addf(p+".idempotent", "is false while hedge is true: only idempotent operation classes may hedge; set hedge: false")
	}
	if pol.Trigger != TriggerFirstByte && pol.Trigger != TriggerTotal {
		v.addf(p+".trigger", "%q: want first_byte or total", pol.Trigger)
	}
	if pol.PushbackScope != PushbackCohort && pol.PushbackScope != PushbackRoute {
		v.addf(p+".pushback_scope", "%q: want cohort or route", pol.PushbackScope)
	}
	if pol.MaxAttempts < 1 || pol.MaxAttempts > MaxAttemptsCap {
		v.addf(p+".max_attempts", "%d is outside [1,%d]", pol.MaxAttempts, MaxAttemptsCap)
	}
	if pol.Deadline <= 0 {
		v.addf(p+".deadline", "%v must be positive", pol.Deadline)
	}
	// The commit point is checked while decoding (schemas.ParseCommitPoint);
	// a zero one only comes from code that bypassed Load.
	if pol.CommitPoint.Kind == "" {
		v.addf(p+".commit_point", "is required (%s, tokens:N or %s)", schemas.FirstToken, schemas.Complete)
	}
	v.beforeDeadline(p+".min_useful_time", pol.MinUsefulTime, pol.Deadline, true)
	v.beforeDeadline(p+".accept_timeout", pol.AcceptTimeout, pol.Deadline, false)
	v.positive(p+".heartbeat_interval", pol.HeartbeatInterval)
	v.positive(p+".stall_after_first_token", pol.StallAfterFirstToken)
	switch {
	case pol.StallFloor <= 0:
		v.addf(p+".stall_floor", "%v must be positive", pol.StallFloor)
	case pol.StallAfterFirstToken > 0 && pol.StallFloor > pol.StallAfterFirstToken:
		v.addf(p+".stall_floor", "%v is greater than stall_after_first_token %v, the bound's cap; set them equal to pin the bound", pol.StallFloor, pol.StallAfterFirstToken)
	}
	if pol.HeartbeatTimeout <= pol.HeartbeatInterval {
		v.addf(p+".heartbeat_timeout", "%v is not longer than heartbeat_interval %v", pol.HeartbeatTimeout, pol.HeartbeatInterval)
	}

	d, dp := pol.Delay, p+".delay"
	v.openUnit(dp+".quantile", d.Quantile)
	if d.Min > d.Max {
		v.addf(dp+".min", "%v is greater than delay.max %v", d.Min, d.Max)
	} else if d.Initial < d.Min || d.Initial > d.Max {
		v.addf(dp+".initial", "%v is outside delay.min..delay.max [%v,%v]", d.Initial, d.Min, d.Max)
	}
	v.beforeDeadline(dp+".min", d.Min, pol.Deadline, true)
	if d.WarmupSamples < 0 {
		v.addf(dp+".warmup_samples", "%d is negative", d.WarmupSamples)
	}
	v.positive(dp+".window", d.Window)
	if d.Slots < 1 {
		v.addf(dp+".slots", "%d is less than 1", d.Slots)
	} else if d.Window > 0 && d.Window/time.Duration(d.Slots) < time.Second {
		v.addf(dp+".slots", "%d slots make slots of %v; a slot must span at least 1s", d.Slots, d.Window/time.Duration(d.Slots))
	}

	b, bp := pol.DuplicateRate, p+".duplicate_rate"
	if b.Ceiling <= 0 || b.Ceiling > 1 {
		v.addf(bp+".ceiling", "%v is outside (0,1]; to stop hedging set hedge: false", b.Ceiling)
	}
	if b.Window < time.Second || b.Window > time.Hour {
		v.addf(bp+".window", "%v is outside [1s, 1h]", b.Window)
	}
	if bw := b.BurstWindow; bw != 0 {
		// The counters are a tenth of the burst window long; the window is
		// a whole number of them, at most budgets.MaxWindowSlots.
		slot := min(bw, b.Window) / policy.DuplicateWindowSlots
		switch {
		case bw < time.Second:
			v.addf(bp+".burst_window", "%v is below 1s (0 turns the burst bound off)", bw)
		case b.Window >= time.Second && (b.Window%slot != 0 || b.Window/slot > budgets.MaxWindowSlots):
			v.addf(bp+".burst_window", "%v does not fit window %v: the window must be a whole number of tenths of it, at most %d",
				bw, b.Window, budgets.MaxWindowSlots)
		}
		if b.BurstCeiling < 0 || b.BurstCeiling > 1 {
			v.addf(bp+".burst_ceiling", "%v is outside [0, 1]", b.BurstCeiling)
		}
	}
	if b.ReplacementReserve < 0 || b.ReplacementReserve > 1e6 {
		v.addf(bp+".replacement_reserve", "%v is outside [0, 1000000]", b.ReplacementReserve)
	}
	if b.Reserve.Burst < 0 || b.Reserve.Burst > 1e6 {
		v.addf(bp+".reserve.burst", "%v is outside [0, 1000000]", b.Reserve.Burst)
	}
	if b.Reserve.PerMinute < 0 || b.Reserve.PerMinute > 1e6 {
		v.addf(bp+".reserve.per_minute", "%v is outside [0, 1000000]", b.Reserve.PerMinute)
	}

	s, sp := pol.Spend, p+".spend"
	if s.PerUserAction < 0 {
		v.addf(sp+".per_user_action", "%d is negative", s.PerUserAction)
	}
	if s.PerTenantWindow < 0 {
		v.addf(sp+".per_tenant_window", "%d is negative", s.PerTenantWindow)
	}
	v.positive(sp+".window", s.Window)

	g, gp := pol.Guardrail, p+".guardrail"
	v.openUnit(gp+".quantile", g.Quantile)
	if g.MinControlSamples < 1 {
		v.addf(gp+".min_control_samples", "%d is less than 1", g.MinControlSamples)
	}
	if g.MinErrorSamples < 20 {
		v.addf(gp+".min_error_samples", "%d is less than 20: an error rate on fewer samples moves five points with one failure", g.MinErrorSamples)
	}
	if g.MinGain < 0 || g.MinGain >= 1 {
		v.addf(gp+".min_gain", "%v is outside [0,1)", g.MinGain)
	}
	v.fraction(gp+".max_error_rate_increase", g.MaxErrorRateIncrease)
	v.positive(gp+".probe_interval", g.ProbeInterval)
}

func (v *validator) tenants() {
	owner := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(v.cfg.Tenants)) {
		t, p := v.cfg.Tenants[name], "tenants."+name
		v.token(p, name)
		if len(t.APIKeyHashes) == 0 {
			v.addf(p+".api_key_hashes", "a tenant needs at least one API key hash")
		}
		for i, h := range t.APIKeyHashes {
			hp := indexPath(p+".api_key_hashes", i)
			switch {
			case !keyHash.MatchString(h):
				// Never echo the value: it may be a plaintext key.
				v.addf(hp, "want \"sha256:\" and 64 lowercase hex digits (hedgerow never takes plaintext keys)")
			case owner[h] != "":
				v.addf(hp, "the same hash is already a key of tenant %q", owner[h])
			default:
				owner[h] = name
				if h == placeholderKeyHash && v.role.AuthenticatesCallers() {
					v.warnf(hp, "the all-zero hash is a placeholder that no API key matches: tenant %q lets nobody in "+
						"until it holds your key's hash (printf %%s \"$KEY\" | sha256sum)", name)
				}
			}
		}
		if t.SpendLimit < 0 {
			v.addf(p+".spend_limit", "%d is negative", t.SpendLimit)
		}
		v.positive(p+".spend_window", t.SpendWindow)
		if t.RequestsPerSecond < 0 || math.IsNaN(t.RequestsPerSecond) || math.IsInf(t.RequestsPerSecond, 0) {
			v.addf(p+".requests_per_second", "%v is not a finite number ≥ 0", t.RequestsPerSecond)
		}
		if t.Burst < 0 {
			v.addf(p+".burst", "%d is negative", t.Burst)
		} else if t.Burst > 0 && t.RequestsPerSecond <= 0 {
			v.addf(p+".burst", "a burst needs requests_per_second, the rate that refills it")
		}
		if t.MaxConcurrent < 0 {
			v.addf(p+".max_concurrent", "%d is negative", t.MaxConcurrent)
		}
	}
}

// secret checks the name of an environment variable holding a secret and,
// when the role needs it, that the variable is set and not empty. The value
// is never reported.
func (v *validator) secret(path, name string, needed bool, why string, args ...any) {
	if name == "" {
		return
	}
	if !envVarName.MatchString(name) {
		// Never echo the value: a key pasted here by mistake is the secret.
		v.addf(path, "is not an environment variable name (name the variable that holds the secret, never the secret)")
		return
	}
	if !needed {
		return
	}
	if val, ok := v.env(name); !ok || val == "" {
		v.addf(path, "environment variable %s is not set, but %s", name, fmt.Sprintf(why, args...))
	}
}

// token checks that a name is a NATS-subject-safe token.
func (v *validator) token(path, name string) bool {
	if !subjectToken.MatchString(name) {
		if name == "" {
			v.addf(path, "a name is required ([a-z0-9_-]+)")
		} else {
			v.addf(path, "name %q is not a NATS-subject-safe token ([a-z0-9_-]+)", name)
		}
		return false
	}
	return true
}

func (v *validator) hostPort(path, addr string) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		v.addf(path, "%q is not a host:port address", addr)
	}
}

func (v *validator) fraction(path string, f float64) {
	if !(f >= 0 && f <= 1) {
		v.addf(path, "%v is outside [0,1]", f)
	}
}

func (v *validator) openUnit(path string, f float64) {
	if !(f > 0 && f < 1) {
		v.addf(path, "%v is outside (0,1)", f)
	}
}

func (v *validator) positive(path string, d time.Duration) {
	if d <= 0 {
		v.addf(path, "%v must be positive", d)
	}
}

// beforeDeadline checks 0 ≤ d < deadline (0 < d when zero is not allowed).
func (v *validator) beforeDeadline(path string, d, deadline time.Duration, zeroOK bool) {
	switch {
	case d < 0 || (d == 0 && !zeroOK):
		v.addf(path, "%v must be positive", d)
	case deadline > 0 && d >= deadline:
		v.addf(path, "%v is not shorter than the deadline %v", d, deadline)
	}
}
