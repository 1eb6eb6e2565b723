package arbiter

import (
	"container/list"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
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
)

// Defaults of a SchemaCache.
const (
	DefaultSchemaCacheEntries   = 256
	DefaultSchemaCompileTimeout = 2 * time.Second
)

// ErrSchemaLimit is wrapped (with ErrInvalidResponseFormat) by
// WithResponseFormat for a caller's schema over MaxSchemaBytes,
// MaxSchemaDepth or MaxSchemaContainers; the schema was not compiled.
var ErrSchemaLimit = errors.New("json schema exceeds the limits")

// ErrCompileAborted is wrapped (with ErrInvalidContract) when a schema's
// compilation was stopped: its caller's context ended or the compile took
// longer than the cache's timeout.
var ErrCompileAborted = errors.New("json schema compilation aborted")

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
	return nil
}

// SchemaCache compiles contracts' JSON schemas once per distinct schema:
// a request's schema is compiled when its door checks it and found again
// when its group starts, and a caller sending the same schema with every
// request pays for it once. Entries are keyed by the SHA-256 of the schema's
// bytes and evicted least recently used beyond a fixed count; only schemas
// that compiled are kept. Each compile is bounded by the caller's context and
// by the cache's timeout, checked at every subschema. Safe for concurrent use.
type SchemaCache struct {
	max     int
	timeout time.Duration

	mu      sync.Mutex
	order   *list.List // of *schemaEntry, most recently used first
	entries map[[sha256.Size]byte]*list.Element

	compiles atomic.Uint64
	hits     atomic.Uint64
}

type schemaEntry struct {
	key [sha256.Size]byte
	sch *jsonschema.Schema
}

// NewSchemaCache returns a cache of at most entries compiled schemas whose
// compiles may take at most timeout each; zero values take
// DefaultSchemaCacheEntries and DefaultSchemaCompileTimeout.
func NewSchemaCache(entries int, timeout time.Duration) *SchemaCache {
	if entries <= 0 {
		entries = DefaultSchemaCacheEntries
	}
	if timeout <= 0 {
		timeout = DefaultSchemaCompileTimeout
	}
	return &SchemaCache{max: entries, timeout: timeout, order: list.New(), entries: make(map[[sha256.Size]byte]*list.Element)}
}

// Contract is NewContract with the spec's schema compiled through the
// cache, within ctx.
func (c *SchemaCache) Contract(ctx context.Context, spec ContractSpec) (*Contract, error) {
	return newContract(spec, func(raw []byte) (*jsonschema.Schema, error) { return c.compile(ctx, raw) })
}

// Compiles is how many schemas the cache compiled (successfully or not);
// Hits how many lookups found a compiled one.
func (c *SchemaCache) Compiles() uint64 { return c.compiles.Load() }

// Hits is how many lookups found a schema already compiled.
func (c *SchemaCache) Hits() uint64 { return c.hits.Load() }

func (c *SchemaCache) compile(ctx context.Context, raw []byte) (*jsonschema.Schema, error) {
	key := sha256.Sum256(raw)
	c.mu.Lock()
	if el, ok := c.entries[key]; ok {
		c.order.MoveToFront(el)
		c.mu.Unlock()
		c.hits.Add(1)
		return el.Value.(*schemaEntry).sch, nil
	}
	c.mu.Unlock()

	// Two callers missing at once both compile; the second insert finds
	// the first's entry. Rare, and cheaper than making one wait on the
	// other's context.
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	c.compiles.Add(1)
	sch, err := compileSchemaContext(ctx, raw)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[key]; ok {
		c.order.MoveToFront(el)
		return el.Value.(*schemaEntry).sch, nil
	}
	c.entries[key] = c.order.PushFront(&schemaEntry{key: key, sch: sch})
	for c.order.Len() > c.max {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.entries, last.Value.(*schemaEntry).key)
	}
	return sch, nil
}

// abortVocabulary is a keyword-less vocabulary whose only work is to stop a
// compile once ctx ends: the compiler calls it for every schema object, so
// a compile stops within one subschema of its caller leaving.
func abortVocabulary(ctx context.Context) *jsonschema.Vocabulary {
	return &jsonschema.Vocabulary{
		URL: "urn:hedgerow:vocab:abort",
		Compile: func(*jsonschema.CompilerContext, map[string]any) (jsonschema.SchemaExt, error) {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrCompileAborted, err)
			}
			return nil, nil
		},
	}
}
