package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/arbiter"
)

func schemaFormat(schema string) []byte {
	return []byte(`{"type":"json_schema","json_schema":{"name":"a","schema":` + schema + `}}`)
}

// TestTheDoorsCheckAndTheGroupShareOneSchemaCompile: a door's
// CheckResponseFormat and the group Submit then starts, and a second request
// with the same schema, compile it once between them.
func TestTheDoorsCheckAndTheGroupShareOneSchemaCompile(t *testing.T) {
	c, _ := twoRoutes(t, newScript(behaviour{content: `{"answer":1}`}, behaviour{content: `{"answer":1}`}))
	rf := schemaFormat(`{"type":"object","required":["answer"],"properties":{"answer":{"type":"integer"}}}`)
	for i := range 2 {
		if err := c.d.CheckResponseFormat(context.Background(), "", "general", rf); err != nil {
			t.Fatalf("request %d: CheckResponseFormat: %v", i, err)
		}
		req := chat(false)
		req.ResponseFormat = rf
		if _, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: req}, nil); err != nil {
			t.Fatalf("request %d: Submit: %v", i, err)
		}
	}
	if got := c.d.schemaCache.Compiles(); got != 1 {
		t.Errorf("schema compiled %d times for two checked and submitted requests, want 1", got)
	}
}

func TestResponseFormatSchemaRefusals(t *testing.T) {
	bomb := `{"type":"string"}`
	for range 1600 {
		bomb = `{"properties":{"a":` + bomb + `}}`
	}
	deepButAllowed := `{"type":"string"}`
	for range 20 {
		deepButAllowed = `{"type":"object","properties":{"a":` + deepButAllowed + `}}`
	}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		schema  string
		want    []error
		notWant error
	}{
		{"a schema bomb is a bad request over the schema limits, never compiled", context.Background(), bomb,
			[]error{ErrBadRequest, arbiter.ErrSchemaLimit}, nil},
		{"a request cancelled during its compile ends with its context's error, not a bad request", canceled, deepButAllowed,
			[]error{context.Canceled}, ErrBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := twoRoutes(t, newScript(behaviour{words: 1}))
			err := c.d.CheckResponseFormat(tt.ctx, "", "general", schemaFormat(tt.schema))
			for _, w := range tt.want {
				if !errors.Is(err, w) {
					t.Errorf("CheckResponseFormat = %v, want it to match %v", err, w)
				}
			}
			if tt.notWant != nil && errors.Is(err, tt.notWant) {
				t.Errorf("CheckResponseFormat = %v, must not match %v", err, tt.notWant)
			}
			if strings.Contains(err.Error(), `"a"`) {
				t.Errorf("the error quotes the schema: %v", err)
			}
			if got := c.d.schemaCache.Compiles(); tt.want[len(tt.want)-1] == arbiter.ErrSchemaLimit && got != 0 {
				t.Errorf("compiles = %d, want 0: the limits refuse before compiling", got)
			}
		})
	}
}

// patternBomb is a 21 KB schema whose 400 patterns would compile to about
// 17 MB: over the default compiled-size budget of a schema.
func patternBomb() string {
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := range 400 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"p%d":{"type":"string","pattern":"^[a-z]{1000}$"}`, i)
	}
	b.WriteString(`}}`)
	return b.String()
}

// TestASchemaOverItsCompileBudgetIsRefusedAndNothingRuns: a schema within
// the limits whose compile goes over the cache's size or time budget is a
// bad request naming the budget, for the door's check and for Submit
// alike, and no attempt is published for it.
func TestASchemaOverItsCompileBudgetIsRefusedAndNothingRuns(t *testing.T) {
	tests := []struct {
		name   string
		limits arbiter.SchemaCacheLimits
		schema string
		budget string
	}{
		{"a schema compiling over the default size budget", arbiter.SchemaCacheLimits{}, patternBomb(), "compiled size"},
		{"a schema compiling past the time budget", arbiter.SchemaCacheLimits{CompileTimeout: time.Nanosecond},
			`{"type":"object","properties":{"a":{"type":"string"}}}`, "compile time"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, ps := twoRoutes(t, newScript(behaviour{words: 1}))
			c.d.schemaCache = arbiter.NewSchemaCache(tt.limits)
			check := c.d.CheckResponseFormat(context.Background(), "t", "general", schemaFormat(tt.schema))
			req := chat(false)
			req.ResponseFormat = schemaFormat(tt.schema)
			_, submit := c.d.Submit(context.Background(), Submission{Pool: "general", Tenant: "t", Request: req}, nil)
			for name, err := range map[string]error{"CheckResponseFormat": check, "Submit": submit} {
				be, ok := errors.AsType[*arbiter.SchemaBudgetError](err)
				if !errors.Is(err, ErrBadRequest) || !ok || be.Budget != tt.budget {
					t.Errorf("%s = %v, want a bad request with a *arbiter.SchemaBudgetError naming the %s budget", name, err, tt.budget)
				}
			}
			if got := c.d.schemaCache.Entries(); got != 0 {
				t.Errorf("schema cache entries = %d, want 0", got)
			}
			for name, p := range ps {
				select {
				case <-p.arrived:
					t.Errorf("route %s was called for a refused request", name)
				default:
				}
			}
		})
	}
}
