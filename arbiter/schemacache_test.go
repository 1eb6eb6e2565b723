package arbiter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
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
	cache := NewSchemaCache(4, 0)
	spec, _, err := ContractSpec{}.WithResponseFormat(jsonSchemaFormat(personSchema))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		c, err := cache.Contract(context.Background(), spec)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if !c.HasSchema() {
			t.Fatalf("request %d: contract has no schema", i)
		}
	}
	if got := cache.Compiles(); got != 1 {
		t.Errorf("compiles = %d for two requests with one schema, want 1", got)
	}
	if got := cache.Hits(); got != 1 {
		t.Errorf("hits = %d, want 1", got)
	}
}

func TestSchemaCacheEvictsTheLeastRecentlyUsed(t *testing.T) {
	cache := NewSchemaCache(2, 0)
	compile := func(schema string) {
		t.Helper()
		if _, err := cache.Contract(context.Background(), ContractSpec{JSONSchema: []byte(schema)}); err != nil {
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

func TestSchemaCompileStopsWhenItsRequestEnds(t *testing.T) {
	spec := ContractSpec{JSONSchema: []byte(nestedSchema(20))}
	t.Run("a cancelled request's compile is aborted and not cached", func(t *testing.T) {
		cache := NewSchemaCache(4, 0)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := cache.Contract(ctx, spec)
		if !errors.Is(err, ErrCompileAborted) || !errors.Is(err, context.Canceled) || !errors.Is(err, ErrInvalidContract) {
			t.Fatalf("err = %v, want ErrCompileAborted with context.Canceled and ErrInvalidContract", err)
		}
		if _, err := cache.Contract(context.Background(), spec); err != nil {
			t.Fatalf("a later request with the same schema: %v", err)
		}
		if got := cache.Compiles(); got != 2 {
			t.Errorf("compiles = %d, want 2: the aborted compile kept nothing", got)
		}
	})
	t.Run("a compile past the cache's timeout is aborted", func(t *testing.T) {
		cache := NewSchemaCache(4, time.Nanosecond)
		_, err := cache.Contract(context.Background(), spec)
		if !errors.Is(err, ErrCompileAborted) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want ErrCompileAborted with context.DeadlineExceeded", err)
		}
	})
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
