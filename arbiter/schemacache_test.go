package arbiter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// nestedSchema is a schema of depth levels of "properties", the shape of
// the schema bombs whose compile grows with the square of their depth.
func nestedSchema(depth int) string {
	s := `{"type":"string"}`
	for range depth {
		s = `{"type":"object","properties":{"a":` + s + `}}`
	}
	return s
}

// wideSchema is an object schema of n-2 distinct properties: n objects in
// all with the schema and its properties member.
func wideSchema(n int) string {
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := range n - 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"p%d":{"type":"string"}`, i)
	}
	b.WriteString(`}}`)
	return b.String()
}

func jsonSchemaFormat(schema string) json.RawMessage {
	return json.RawMessage(`{"type":"json_schema","json_schema":{"name":"x","schema":` + schema + `}}`)
}

func TestResponseFormatOverTheSchemaLimitsIsRefusedBeforeCompiling(t *testing.T) {
	wide := wideSchema(MaxSchemaContainers + 1)
	long := `{"description":"` + strings.Repeat("x", MaxSchemaBytes) + `"}`
	tests := []struct {
		name   string
		schema string
		limit  bool
	}{
		{"a schema nested 1600 levels deep is over the depth limit", nestedSchema(1600), true},
		{"a schema one level over the depth limit is refused", nestedSchema(MaxSchemaDepth / 2), true},
		{"a schema with more objects than the container limit is refused", wide, true},
		{"a schema longer than the byte limit is refused", long, true},
		{"a schema at a usual depth passes", nestedSchema(10), false},
		{"a number with an exponent over the limit is refused", `{"type":"number","minimum":1e999999}`, true},
		{"a negative exponent over the limit is refused", `{"type":"number","multipleOf":1E-401}`, true},
		{"numbers within float64's range pass", `{"type":"number","minimum":-1.5e308,"maximum":2E+300,"multipleOf":0.25}`, false},
		{"exponents inside strings are text", `{"description":"1e999999","default":"-2e5000"}`, false},
		{"brackets inside strings do not count as nesting", `{"description":"` + strings.Repeat("{[", 200) + `"}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := ContractSpec{}.WithResponseFormat(jsonSchemaFormat(tt.schema))
			if got := errors.Is(err, ErrSchemaLimit); got != tt.limit {
				t.Fatalf("WithResponseFormat err = %v; ErrSchemaLimit %v, want %v", err, got, tt.limit)
			}
			if tt.limit && !errors.Is(err, ErrInvalidResponseFormat) {
				t.Errorf("err = %v, want it to match ErrInvalidResponseFormat too", err)
			}
		})
	}
}

func TestSchemaCacheCompilesOneSchemaOnce(t *testing.T) {
	cache := NewSchemaCache(SchemaCacheLimits{MaxEntries: 4})
	spec, _, err := ContractSpec{}.WithResponseFormat(jsonSchemaFormat(personSchema))
	if err != nil {
		t.Fatal(err)
	}
	for i, tenant := range []string{"a", "b"} {
		c, err := cache.Contract(context.Background(), tenant, spec)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if !c.HasSchema() {
			t.Fatalf("request %d: contract has no schema", i)
		}
	}
	if got := cache.Compiles(); got != 1 {
		t.Errorf("compiles = %d for two tenants' requests with one schema, want 1", got)
	}
	if got := cache.Hits(); got != 1 {
		t.Errorf("hits = %d, want 1", got)
	}
}

func TestSchemaCacheEvictsTheLeastRecentlyUsed(t *testing.T) {
	cache := NewSchemaCache(SchemaCacheLimits{MaxEntries: 2})
	compile := func(schema string) {
		t.Helper()
		if _, err := cache.Contract(context.Background(), "", ContractSpec{JSONSchema: []byte(schema)}); err != nil {
			t.Fatal(err)
		}
	}
	a, b, c := `{"type":"string"}`, `{"type":"number"}`, `{"type":"object"}`
	compile(a)
	compile(b)
	compile(a) // a is now the most recently used
	compile(c) // evicts b
	compile(a)
	if got := cache.Compiles(); got != 3 {
		t.Fatalf("compiles = %d, want 3 (a, b, c; a kept)", got)
	}
	compile(b)
	if got := cache.Compiles(); got != 4 {
		t.Errorf("compiles = %d, want 4: b was evicted and compiled again", got)
	}
}

// measured compiles schema as the cache would and returns its measured
// size with the entry's overhead: what the cache charges for it.
func measured(t *testing.T, schema string) int64 {
	t.Helper()
	_, size, err := compileSchemaBudget(context.Background(), []byte(schema), 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	return size + entryOverhead
}

func TestSchemaCacheHoldsNoMoreMeasuredBytesThanItsBound(t *testing.T) {
	// Each distinct wide schema costs about 90 KB compiled; the bound
	// holds eight of them whatever their number.
	cost := measured(t, distinctWideSchema(0, 100))
	bound := 8*cost + cost/2
	cache := NewSchemaCache(SchemaCacheLimits{MaxBytes: bound})
	var sizes []int64
	for i := range 12 {
		if _, err := cache.Contract(context.Background(), "", ContractSpec{JSONSchema: []byte(distinctWideSchema(i, 100))}); err != nil {
			t.Fatalf("schema %d: %v", i, err)
		}
		if got := cache.Bytes(); got > bound {
			t.Fatalf("after schema %d the cache holds %d bytes, over its bound %d", i, got, bound)
		}
		sizes = append(sizes, measured(t, distinctWideSchema(i, 100)))
	}
	if got, want := cache.Entries(), 8; got != want {
		t.Errorf("entries = %d, want %d: as many as fit in the bound", got, want)
	}
	var kept int64
	for _, s := range sizes[len(sizes)-cache.Entries():] {
		kept += s
	}
	if got := cache.Bytes(); got != kept {
		t.Errorf("bytes = %d, want %d: the measured sizes of the most recent schemas", got, kept)
	}
}

func TestATenantCannotFlushTheOtherTenantsSchemas(t *testing.T) {
	cost := measured(t, distinctWideSchema(0, 100))
	cache := NewSchemaCache(SchemaCacheLimits{MaxBytes: 8*cost + cost/2})
	contract := func(tenant string, i int) {
		t.Helper()
		if _, err := cache.Contract(context.Background(), tenant, ContractSpec{JSONSchema: []byte(distinctWideSchema(i, 100))}); err != nil {
			t.Fatalf("%s schema %d: %v", tenant, i, err)
		}
	}
	// A tenant's share is a quarter of the bound: two such schemas.
	for i := range 2 {
		contract("quiet", i)
	}
	for i := 100; i < 140; i++ {
		contract("noisy", i) // a fresh schema every request
	}
	compiles := cache.Compiles()
	for i := range 2 {
		contract("quiet", i)
	}
	if got := cache.Compiles() - compiles; got != 0 {
		t.Errorf("the quiet tenant's schemas were compiled %d times again after the noisy tenant's, want 0", got)
	}
	if got := cache.Bytes(); got > 8*cost+cost/2 {
		t.Errorf("bytes = %d, over the bound", got)
	}
	t.Run("a request without a tenant may use the whole cache", func(t *testing.T) {
		for i := 200; i < 240; i++ {
			contract("", i)
		}
		if got := cache.Entries(); got != 8 {
			t.Errorf("entries = %d, want 8: the whole bound", got)
		}
	})
}

func TestConcurrentMissesOfOneSchemaShareOneCompile(t *testing.T) {
	cache := NewSchemaCache(SchemaCacheLimits{})
	release := make(chan struct{})
	started := make(chan struct{}, 8)
	cache.compileSchema = func(ctx context.Context, raw []byte, maxBytes int64) (*jsonschema.Schema, int64, error) {
		started <- struct{}{}
		select {
		case <-release:
			return compileSchemaBudget(ctx, raw, maxBytes)
		case <-ctx.Done():
			return nil, 0, fmt.Errorf("%w: %w", ErrCompileAborted, ctx.Err())
		}
	}
	spec := ContractSpec{JSONSchema: []byte(personSchema)}
	leaving, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 4)
	for _, ctx := range []context.Context{leaving, context.Background(), context.Background(), context.Background()} {
		go func() {
			_, err := cache.Contract(ctx, "t", spec)
			errs <- err
		}()
	}
	<-started
	eventuallyWaiting(t, cache, 4)
	cancel() // one caller leaves: the others still get the schema
	if err := <-errs; !errors.Is(err, context.Canceled) || !errors.Is(err, ErrCompileAborted) {
		t.Fatalf("the caller who left got %v, want ErrCompileAborted with context.Canceled", err)
	}
	close(release)
	for range 3 {
		if err := <-errs; err != nil {
			t.Errorf("a caller who stayed got %v", err)
		}
	}
	if got := cache.Compiles(); got != 1 {
		t.Errorf("compiles = %d for four concurrent requests of one schema, want 1", got)
	}
	if len(started) != 0 {
		t.Errorf("%d more compiles started", len(started))
	}
}

func TestACompileEveryCallerLeftStopsAndIsNotMetByLaterRequests(t *testing.T) {
	cache := NewSchemaCache(SchemaCacheLimits{})
	stopped := make(chan error, 1)
	first := true
	cache.compileSchema = func(ctx context.Context, raw []byte, maxBytes int64) (*jsonschema.Schema, int64, error) {
		if first {
			first = false
			<-ctx.Done()
			stopped <- ctx.Err()
			return nil, 0, fmt.Errorf("%w: %w", ErrCompileAborted, ctx.Err())
		}
		return compileSchemaBudget(ctx, raw, maxBytes)
	}
	spec := ContractSpec{JSONSchema: []byte(personSchema)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := cache.Contract(ctx, "", spec)
		done <- err
	}()
	eventuallyWaiting(t, cache, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if err := <-stopped; !errors.Is(err, context.Canceled) {
		t.Fatalf("the abandoned compile's context ended with %v, want context.Canceled", err)
	}
	if _, err := cache.Contract(context.Background(), "", spec); err != nil {
		t.Fatalf("a later request of the same schema: %v", err)
	}
	if got := cache.Compiles(); got != 2 {
		t.Errorf("compiles = %d, want 2: the later request compiled afresh", got)
	}
}

// eventuallyWaiting waits until n callers wait on the cache's one flight.
func eventuallyWaiting(t *testing.T, cache *SchemaCache, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		cache.mu.Lock()
		waiting := 0
		for _, f := range cache.flights {
			waiting += f.waiters
		}
		cache.mu.Unlock()
		if waiting == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d callers waiting on the compile, want %d", waiting, n)
		}
		runtime.Gosched()
	}
}

func TestSchemaCompileStopsWhenItsRequestEnds(t *testing.T) {
	spec := ContractSpec{JSONSchema: []byte(nestedSchema(20))}
	t.Run("a request already cancelled compiles nothing", func(t *testing.T) {
		cache := NewSchemaCache(SchemaCacheLimits{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := cache.Contract(ctx, "", spec)
		if !errors.Is(err, ErrCompileAborted) || !errors.Is(err, context.Canceled) || !errors.Is(err, ErrInvalidContract) {
			t.Fatalf("err = %v, want ErrCompileAborted with context.Canceled and ErrInvalidContract", err)
		}
		if _, err := cache.Contract(context.Background(), "", spec); err != nil {
			t.Fatalf("a later request with the same schema: %v", err)
		}
		if got := cache.Compiles(); got != 1 {
			t.Errorf("compiles = %d, want 1", got)
		}
	})
	t.Run("a compile past the cache's timeout is refused naming the time budget", func(t *testing.T) {
		cache := NewSchemaCache(SchemaCacheLimits{CompileTimeout: time.Nanosecond})
		_, err := cache.Contract(context.Background(), "", spec)
		if !errors.Is(err, ErrCompileAborted) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want ErrCompileAborted with context.DeadlineExceeded", err)
		}
		be, ok := errors.AsType[*SchemaBudgetError](err)
		if !ok || be.Budget != "compile time" || be.Limit != "1ns" {
			t.Fatalf("err = %v, want a *SchemaBudgetError naming the compile time budget of 1ns", err)
		}
		if got := cache.Entries(); got != 0 {
			t.Errorf("entries = %d, want 0", got)
		}
	})
}

func TestASchemaOverTheSizeBudgetIsRefusedNamingItAndKeptNowhere(t *testing.T) {
	wide := distinctWideSchema(0, 1000)
	tests := []struct {
		name     string
		maxBytes int64
		schema   string
	}{
		// 400 such patterns compile to about 17 MB: the regular
		// expressions' weight stops the compile long before.
		{"patterns that expand to large programs stop the compile", DefaultSchemaCacheBytes, patternSchema(400, `^[a-z]{1000}$`)},
		{"one pattern over the budget", 64 << 10, patternSchema(1, `^[a-z]{1000}$`)},
		{"a wide schema whose compiled form is over the budget", measured(t, wide) * SchemaShareDivisor / 2, wide},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cache := NewSchemaCache(SchemaCacheLimits{MaxBytes: tt.maxBytes})
			_, err := cache.Contract(context.Background(), "t", ContractSpec{JSONSchema: []byte(tt.schema)})
			if !errors.Is(err, ErrSchemaTooLarge) || !errors.Is(err, ErrInvalidContract) {
				t.Fatalf("err = %v, want ErrSchemaTooLarge with ErrInvalidContract", err)
			}
			be, ok := errors.AsType[*SchemaBudgetError](err)
			if !ok || be.Budget != "compiled size" || be.Limit != formatBytes(tt.maxBytes/SchemaShareDivisor) {
				t.Fatalf("err = %v, want a *SchemaBudgetError naming the compiled size budget of %s", err, formatBytes(tt.maxBytes/SchemaShareDivisor))
			}
			if strings.Contains(err.Error(), "[a-z]") {
				t.Errorf("err = %q quotes the schema", err)
			}
			if got := cache.Entries(); got != 0 {
				t.Errorf("entries = %d, want 0", got)
			}
		})
	}
}

func TestAPatternWhoseProgramWouldBeOverTheBudgetIsRefusedBeforeItCompiles(t *testing.T) {
	b := regexpBudget{limit: 8 << 10}
	if _, err := b.compile(`^[a-z]{1000}$`); !errors.Is(err, ErrSchemaTooLarge) {
		t.Fatalf("err = %v, want ErrSchemaTooLarge", err)
	}
	if b.used != 0 {
		t.Errorf("%d bytes of expressions compiled, want none", b.used)
	}
	if _, err := b.compile(`^[a-z]{1,8}$`); !errors.Is(err, ErrSchemaTooLarge) {
		t.Errorf("after the budget ran out a small pattern got %v, want ErrSchemaTooLarge", err)
	}
}

func TestASchemaWithinTheBudgetsCompilesAndIsCharged(t *testing.T) {
	cache := NewSchemaCache(SchemaCacheLimits{})
	schema := distinctWideSchema(0, MaxSchemaContainers-2)
	if err := CheckSchemaLimits([]byte(schema)); err != nil {
		t.Fatal(err)
	}
	if _, err := cache.Contract(context.Background(), "t", ContractSpec{JSONSchema: []byte(schema)}); err != nil {
		t.Fatalf("the widest schema the limits let through: %v", err)
	}
	if got, want := cache.Bytes(), measured(t, schema); got != want {
		t.Errorf("bytes = %d, want its measured size %d", got, want)
	}
}

// distinctWideSchema is an object schema of n properties of the usual
// kinds, its property names drawn from nonce so that every nonce gives a
// distinct schema: the shape of the schemas that filled a gateway's cache
// (docs/architecture.md §6).
func distinctWideSchema(nonce, n int) string {
	kinds := []string{"string", "integer", "number", "boolean"}
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"%x_%d":{"type":"%s"}`, nonce, i, kinds[i%len(kinds)])
	}
	b.WriteString(`},"additionalProperties":false}`)
	return b.String()
}

// patternSchema is an object schema of n string properties, each matching
// pattern.
func patternSchema(n int, pattern string) string {
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"p%d":{"type":"string","pattern":%q}`, i, pattern)
	}
	b.WriteString(`}}`)
	return b.String()
}

func TestRetainedSizeOfSchemasTracksTheHeapTheyHold(t *testing.T) {
	// Within 15 % either way of what the collector finds live: the bound
	// is on the memory the schemas really hold.
	for _, tt := range []struct {
		name   string
		schema func(i int) string
	}{
		{"wide schemas of plain properties", func(i int) string { return distinctWideSchema(i, 1000) }},
		{"schemas of patterns", func(i int) string { return patternSchema(200, fmt.Sprintf(`^[a-z]{%d}$`, 40+i)) }},
		{"schemas of enums and defaults", func(i int) string {
			return fmt.Sprintf(`{"type":"object","properties":{"a":{"enum":["x%d","y","z",1,2.5,null,{"k":[1,2]}]},"b":{"type":"string","default":"d%d","description":"%s"}}}`, i, i, strings.Repeat("w", 1000))
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			const n = 16
			kept := make([]*jsonschema.Schema, n)
			var sum int64
			before := liveHeap()
			for i := range n {
				sch, size, err := compileSchemaBudget(context.Background(), []byte(tt.schema(i)), 1<<40)
				if err != nil {
					t.Fatal(err)
				}
				kept[i], sum = sch, sum+size
			}
			held := liveHeap() - before
			runtime.KeepAlive(kept)
			ratio := float64(sum) / float64(held)
			t.Logf("measured %d bytes, heap grew %d: ratio %.3f", sum, held, ratio)
			if ratio < 0.85 || ratio > 1.15 {
				t.Errorf("measured %d bytes for schemas holding %d: ratio %.2f, want within 15 %%", sum, held, ratio)
			}
		})
	}
}

// liveHeap is the heap in use after a full collection.
func liveHeap() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// BenchmarkSchemaRefusal measures refusing a 1600-deep schema bomb, which
// took the compiler tens of CPU-seconds before the limits.
func BenchmarkSchemaRefusal(b *testing.B) {
	rf := jsonSchemaFormat(nestedSchema(1600))
	for b.Loop() {
		if _, _, err := (ContractSpec{}).WithResponseFormat(rf); !errors.Is(err, ErrSchemaLimit) {
			b.Fatal(err)
		}
	}
}

// BenchmarkSchemaCompileAtTheLimits compiles the costliest schemas the
// limits let through: as deep, and as wide, as allowed.
func BenchmarkSchemaCompileAtTheLimits(b *testing.B) {
	wide := wideSchema(MaxSchemaContainers - 2)
	for _, bc := range []struct{ name, schema string }{
		{"deep", nestedSchema(MaxSchemaDepth/2 - 1)},
		{"wide", wide},
	} {
		if err := CheckSchemaLimits([]byte(bc.schema)); err != nil {
			b.Fatalf("%s: %v", bc.name, err)
		}
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := compileSchemaContext(context.Background(), []byte(bc.schema)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
