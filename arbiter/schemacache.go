package arbiter

import (
	"container/list"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/hedgerow/hedgerow/schemas/jsonscan"
)

// Limits on a caller's JSON schema (response_format), checked by one cheap
// scan before anything parses or compiles it (docs/architecture.md §6). The
// compiler's work grows with the square of the number of subschemas, so a
// small deep document can cost minutes of CPU: these bound it to
// milliseconds. Real structured-output schemas stay far below them
// (providers allow about ten levels of nesting).
const (
	// MaxSchemaBytes is the largest schema accepted, in bytes as sent.
	MaxSchemaBytes = 64 << 10
	// MaxSchemaDepth is the deepest nesting of JSON objects and arrays
	// accepted; one level of schema nesting ("properties" then the
	// property's schema) is two.
	MaxSchemaDepth = 64
	// MaxSchemaContainers is the most JSON objects and arrays one schema
	// may hold, which bounds its subschemas.
	MaxSchemaContainers = 2048
	// MaxSchemaExponent bounds the decimal exponent of a number in a
	// schema. The compiler holds "minimum", "multipleOf" and their kin as
	// exact rationals, so 1e999999 is a 415 KB integer that takes 70 ms to
	// build: fifty properties of three such numbers (3.4 KB) took 10
	// CPU-seconds and 500 MB. Every float64 is within 1e±308.
	MaxSchemaExponent = 400
)

// Defaults of a SchemaCache (docs/architecture.md §6): what a gateway
// spends on callers' schemas at most, whatever they send.
const (
	// DefaultSchemaCacheBytes bounds the measured size of the compiled
	// schemas a cache keeps.
	DefaultSchemaCacheBytes = 64 << 20
	// DefaultSchemaCacheEntries bounds how many it keeps.
	DefaultSchemaCacheEntries = 256
	// DefaultSchemaCompileTimeout bounds one compile's wall time. The
	// limits and the size budget bound the CPU a compile can take (about
	// 80 ms at most on the idle 2-core test machine); this is the backstop,
	// wide enough that a loaded gateway does not refuse ordinary schemas
	// (at 500 ms, 140 of 320 distinct 2,000-property schemas were refused
	// on the test machine at load 12).
	DefaultSchemaCompileTimeout = 2 * time.Second
)

// Shares of a SchemaCache's byte bound.
const (
	// SchemaShareDivisor divides the cache's bytes into the most one
	// schema may hold compiled: a schema over it is refused, not cached.
	SchemaShareDivisor = 8
	// TenantShareDivisor divides the cache's bytes and entries into the
	// most one tenant's schemas may hold, so a tenant cannot flush the
	// others'. Requests without a tenant share the whole cache.
	TenantShareDivisor = 4
)

// entryOverhead is what an entry costs beside its compiled schema: its
// list element, map slot, key and bookkeeping.
const entryOverhead = 256

// ErrSchemaLimit is wrapped (with ErrInvalidResponseFormat) by
// WithResponseFormat for a caller's schema over MaxSchemaBytes,
// MaxSchemaDepth or MaxSchemaContainers; the schema was not compiled.
var ErrSchemaLimit = errors.New("arbiter: json schema exceeds the limits")

// ErrCompileAborted is wrapped (with ErrInvalidContract) when a schema's
// compilation was stopped: its caller's context ended or the compile took
// longer than the cache's timeout (then inside a *SchemaBudgetError).
var ErrCompileAborted = errors.New("arbiter: json schema compilation aborted")

// ErrSchemaTooLarge is wrapped, inside a *SchemaBudgetError, when a
// schema's compiled form would hold more memory than one schema may.
var ErrSchemaTooLarge = errors.New("arbiter: json schema too large once compiled")

// SchemaBudgetError is a caller's schema refused for its cost once it
// began compiling: its compile ran past the cache's time budget
// (ErrCompileAborted with context.DeadlineExceeded) or its compiled form
// past the size budget (ErrSchemaTooLarge). Nothing of it was kept. Its
// fields name the budget for the caller, never the schema's content.
type SchemaBudgetError struct {
	// Budget is "compile time" or "compiled size".
	Budget string
	// Limit is the budget's value, as a caller reads it ("500ms", "8 MiB").
	Limit string
	err   error
}

func (e *SchemaBudgetError) Error() string {
	return fmt.Sprintf("arbiter: json schema over its %s budget of %s: %v", e.Budget, e.Limit, e.err)
}

// Unwrap is ErrCompileAborted (with the deadline) or ErrSchemaTooLarge.
func (e *SchemaBudgetError) Unwrap() error { return e.err }

// CheckSchemaLimits refuses a schema over the size, depth or container
// limits with ErrSchemaLimit. It reads the bytes once and allocates nothing.
func CheckSchemaLimits(schema []byte) error {
	if len(schema) > MaxSchemaBytes {
		return fmt.Errorf("%w: %d bytes, over %d", ErrSchemaLimit, len(schema), MaxSchemaBytes)
	}
	depth, containers := jsonscan.Nesting(schema)
	if depth > MaxSchemaDepth {
		return fmt.Errorf("%w: nesting depth %d, over %d", ErrSchemaLimit, depth, MaxSchemaDepth)
	}
	if containers > MaxSchemaContainers {
		return fmt.Errorf("%w: %d objects and arrays, over %d", ErrSchemaLimit, containers, MaxSchemaContainers)
	}
	if exp := maxExponent(schema); exp > MaxSchemaExponent {
		return fmt.Errorf("%w: a number's exponent %d, over %d", ErrSchemaLimit, exp, MaxSchemaExponent)
	}
	return nil
}

// maxExponent is the largest magnitude of a decimal exponent among the
// numbers of a JSON document, read outside strings, saturating at
// MaxSchemaExponent+1; 0 for a document without exponents. A number is a
// '-' or digit outside a string, then its digits, '.', 'e' and signs.
func maxExponent(data []byte) int {
	largest := 0
	for i := 0; i < len(data); i++ {
		c := data[i]
		if c == '"' {
			i = jsonscan.StringEnd(data, i)
			continue
		}
		if c != '-' && (c < '0' || c > '9') {
			continue
		}
		for i < len(data) && data[i] != 'e' && data[i] != 'E' && strings.IndexByte("-+.0123456789", data[i]) >= 0 {
			i++
		}
		if i >= len(data) || (data[i] != 'e' && data[i] != 'E') {
			i--
			continue
		}
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		exp := 0
		for ; i < len(data) && data[i] >= '0' && data[i] <= '9'; i++ {
			exp = min(exp*10+int(data[i]-'0'), MaxSchemaExponent+1)
		}
		largest = max(largest, exp)
		i--
	}
	return largest
}

// SchemaCacheLimits bound a SchemaCache; zero fields take the defaults.
type SchemaCacheLimits struct {
	// MaxBytes bounds the measured size of the compiled schemas kept
	// (DefaultSchemaCacheBytes). One schema may hold at most
	// MaxBytes/SchemaShareDivisor, one tenant's MaxBytes/TenantShareDivisor.
	MaxBytes int64
	// MaxEntries bounds how many schemas are kept
	// (DefaultSchemaCacheEntries); one tenant's at most
	// MaxEntries/TenantShareDivisor.
	MaxEntries int
	// CompileTimeout bounds one compile (DefaultSchemaCompileTimeout).
	CompileTimeout time.Duration
}

// SchemaCache compiles contracts' JSON schemas once per distinct schema:
// a request's schema is compiled when its door checks it and found again
// when its group starts, and a caller sending the same schema with every
// request pays for it once (docs/architecture.md §6). Entries are keyed by
// the SHA-256 of the schema's bytes, whoever sends them, and concurrent
// misses of one schema share one compile. Each entry is charged its
// compiled schema's measured size (retainedSize); the least recently used
// are evicted beyond the byte and entry bounds, and a tenant's own least
// recently used beyond its share. Every compile is bounded in time (the
// caller's context and the cache's timeout, checked at every subschema)
// and in size (regular expressions are weighed as they compile, the whole
// schema once compiled): past either it is refused with a
// *SchemaBudgetError and kept nowhere. Safe for concurrent use.
type SchemaCache struct {
	maxBytes, maxSchema, tenantBytes int64
	maxEntries, tenantEntries        int
	timeout                          time.Duration
	// compileSchema is compileSchemaBudget; tests stand in for it.
	compileSchema func(ctx context.Context, raw []byte, maxBytes int64) (*jsonschema.Schema, int64, error)

	mu      sync.Mutex
	order   *list.List // of *schemaEntry, most recently used first
	entries map[[sha256.Size]byte]*list.Element
	flights map[[sha256.Size]byte]*schemaFlight
	bytes   int64
	tenants map[string]*tenantUse // named tenants' holdings

	compiles atomic.Uint64
	hits     atomic.Uint64
}

type schemaEntry struct {
	key    [sha256.Size]byte
	sch    *jsonschema.Schema
	cost   int64 // measured size plus entryOverhead
	tenant string
}

// tenantUse is what one tenant's entries hold.
type tenantUse struct {
	bytes   int64
	entries int
}

// schemaFlight is one compile in progress, which every request missing
// the same schema meanwhile waits for. Its compile runs under its own
// context, cancelled when the last waiter leaves, so one caller leaving
// does not fail the others.
type schemaFlight struct {
	done    chan struct{} // closed when sch or err is set
	sch     *jsonschema.Schema
	err     error
	waiters int // guarded by the cache's mu
	cancel  context.CancelFunc
}

// NewSchemaCache returns a cache within limits (zero fields take the
// defaults).
func NewSchemaCache(limits SchemaCacheLimits) *SchemaCache {
	if limits.MaxBytes <= 0 {
		limits.MaxBytes = DefaultSchemaCacheBytes
	}
	if limits.MaxEntries <= 0 {
		limits.MaxEntries = DefaultSchemaCacheEntries
	}
	if limits.CompileTimeout <= 0 {
		limits.CompileTimeout = DefaultSchemaCompileTimeout
	}
	return &SchemaCache{
		maxBytes: limits.MaxBytes, maxSchema: limits.MaxBytes / SchemaShareDivisor,
		tenantBytes: limits.MaxBytes / TenantShareDivisor,
		maxEntries:  limits.MaxEntries, tenantEntries: max(1, limits.MaxEntries/TenantShareDivisor),
		timeout: limits.CompileTimeout, compileSchema: compileSchemaBudget,
		order: list.New(), entries: make(map[[sha256.Size]byte]*list.Element),
		flights: make(map[[sha256.Size]byte]*schemaFlight), tenants: make(map[string]*tenantUse),
	}
}

// Contract is NewContract with the spec's schema compiled through the
// cache, within ctx, and charged to tenant ("" for none) if it is new.
func (c *SchemaCache) Contract(ctx context.Context, tenant string, spec ContractSpec) (*Contract, error) {
	return newContract(spec, func(raw []byte) (*jsonschema.Schema, error) { return c.compile(ctx, tenant, raw) })
}

// Compiles is how many compiles the cache started (successful or not).
func (c *SchemaCache) Compiles() uint64 { return c.compiles.Load() }

// Hits is how many lookups found a schema already compiled.
func (c *SchemaCache) Hits() uint64 { return c.hits.Load() }

// Bytes is the measured size of the schemas kept, with their entries'
// overhead.
func (c *SchemaCache) Bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}

// Entries is how many schemas are kept.
func (c *SchemaCache) Entries() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

// MaxSchemaBytes is the most one compiled schema may hold.
func (c *SchemaCache) MaxSchemaBytes() int64 { return c.maxSchema }

func (c *SchemaCache) compile(ctx context.Context, tenant string, raw []byte) (*jsonschema.Schema, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCompileAborted, err)
	}
	key := sha256.Sum256(raw)
	c.mu.Lock()
	if el, ok := c.entries[key]; ok {
		c.order.MoveToFront(el)
		c.mu.Unlock()
		c.hits.Add(1)
		return el.Value.(*schemaEntry).sch, nil
	}
	f, leader := c.flights[key], false
	if f == nil {
		fctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		f = &schemaFlight{done: make(chan struct{}), cancel: cancel}
		c.flights[key] = f
		leader = true
		go func() {
			defer cancel()
			c.compiles.Add(1)
			sch, size, err := c.compileSchema(fctx, raw, c.maxSchema)
			err = c.budgetError(fctx, err)
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.flights[key] == f {
				delete(c.flights, key)
			}
			if err == nil {
				c.insert(key, sch, size, tenant)
			}
			f.sch, f.err = sch, err
			close(f.done)
		}()
	}
	f.waiters++
	c.mu.Unlock()
	if !leader {
		c.hits.Add(1)
	}

	select {
	case <-f.done:
		return f.sch, f.err
	case <-ctx.Done():
		c.mu.Lock()
		if f.waiters--; f.waiters == 0 {
			// Nobody waits any more: stop the compile, and let a later
			// request start afresh rather than meet the aborted one.
			f.cancel()
			if c.flights[key] == f {
				delete(c.flights, key)
			}
		}
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: %w", ErrCompileAborted, ctx.Err())
	}
}

// budgetError turns a compile stopped by the cache's own timeout into a
// *SchemaBudgetError naming that budget; other errors pass as they are.
func (c *SchemaCache) budgetError(ctx context.Context, err error) error {
	if err != nil && errors.Is(err, ErrCompileAborted) && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &SchemaBudgetError{Budget: "compile time", Limit: c.timeout.String(), err: err}
	}
	return err
}

// insert keeps a compiled schema charged to tenant, then evicts: the
// tenant's own least recently used beyond its share, then anyone's beyond
// the cache's bounds. Called with c.mu held.
func (c *SchemaCache) insert(key [sha256.Size]byte, sch *jsonschema.Schema, size int64, tenant string) {
	if _, ok := c.entries[key]; ok {
		return
	}
	e := &schemaEntry{key: key, sch: sch, cost: size + entryOverhead, tenant: tenant}
	c.entries[key] = c.order.PushFront(e)
	c.bytes += e.cost
	if tenant != "" {
		use := c.tenants[tenant]
		if use == nil {
			use = &tenantUse{}
			c.tenants[tenant] = use
		}
		use.bytes += e.cost
		use.entries++
		for el := c.order.Back(); el != nil && (use.bytes > c.tenantBytes || use.entries > c.tenantEntries); {
			prev := el.Prev()
			if el.Value.(*schemaEntry).tenant == tenant && el.Value.(*schemaEntry) != e {
				c.evict(el)
			}
			el = prev
		}
	}
	for c.order.Len() > 1 && (c.bytes > c.maxBytes || c.order.Len() > c.maxEntries) {
		c.evict(c.order.Back())
	}
}

// evict drops one entry and its charge. Called with c.mu held.
func (c *SchemaCache) evict(el *list.Element) {
	e := el.Value.(*schemaEntry)
	c.order.Remove(el)
	delete(c.entries, e.key)
	c.bytes -= e.cost
	if use := c.tenants[e.tenant]; use != nil {
		use.bytes -= e.cost
		if use.entries--; use.entries == 0 {
			delete(c.tenants, e.tenant)
		}
	}
}
