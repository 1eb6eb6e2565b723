package dispatcher

import (
	"context"
	"errors"
	"strings"
	"testing"

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
		if err := c.d.CheckResponseFormat(context.Background(), "general", rf); err != nil {
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
			err := c.d.CheckResponseFormat(tt.ctx, "general", schemaFormat(tt.schema))
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
