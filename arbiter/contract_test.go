package arbiter

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/hedgerow/hedgerow/schemas"
)

func mustContract(t *testing.T, spec ContractSpec) *Contract {
	t.Helper()
	c, err := NewContract(spec)
	if err != nil {
		t.Fatalf("NewContract: %v", err)
	}
	return c
}

const personSchema = `{
	"type": "object",
	"properties": {
		"name": {"type": "string", "pattern": "^[A-Z]"},
		"age":  {"type": "integer", "minimum": 0}
	},
	"required": ["name", "age"]
}`

func TestContractNeedingWholeAnswerMovesCommitPointToComplete(t *testing.T) {
	tokens5 := schemas.CommitPoint{Kind: schemas.CommitTokens, Tokens: 5}
	tests := []struct {
		name      string
		spec      *ContractSpec // nil: no contract at all
		requested schemas.CommitPoint
		streaming bool
		want      schemas.CommitPoint
	}{
		{"no contract keeps first_token", nil, schemas.FirstToken, true, schemas.FirstToken},
		{"empty contract keeps tokens:N", &ContractSpec{}, tokens5, true, tokens5},
		{"zero requested point defaults to first_token", &ContractSpec{}, schemas.CommitPoint{}, true, schemas.FirstToken},
		{"tokens below one read as tokens:1", &ContractSpec{}, schemas.CommitPoint{Kind: schemas.CommitTokens}, true, schemas.CommitPoint{Kind: schemas.CommitTokens, Tokens: 1}},
		{"unknown kind falls back to complete", &ContractSpec{}, schemas.CommitPoint{Kind: "sometime"}, true, schemas.Complete},
		{"complete finish required moves to complete", &ContractSpec{RequireComplete: true}, schemas.FirstToken, true, schemas.Complete},
		{"required fields move to complete", &ContractSpec{RequiredFields: []string{"a"}}, tokens5, true, schemas.Complete},
		{"json schema moves to complete", &ContractSpec{JSONSchema: []byte(personSchema)}, schemas.FirstToken, true, schemas.Complete},
		{"non-streaming without contract commits at complete", nil, schemas.FirstToken, false, schemas.Complete},
		{"non-streaming with empty contract commits at complete", &ContractSpec{}, tokens5, false, schemas.Complete},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c *Contract
			if tt.spec != nil {
				c = mustContract(t, *tt.spec)
			}
			if got := c.CommitPoint(tt.requested, tt.streaming); got != tt.want {
				t.Fatalf("CommitPoint(%v, streaming=%v) = %v, want %v", tt.requested, tt.streaming, got, tt.want)
			}
		})
	}
}

func TestNewContractRejectsWhatCannotBeJudged(t *testing.T) {
	tests := []struct {
		name string
		spec ContractSpec
	}{
		{"schema that is not JSON", ContractSpec{JSONSchema: []byte(`{"type": `)}},
		{"schema with an unknown type", ContractSpec{JSONSchema: []byte(`{"type": "banana"}`)}},
		{"schema with a bad pattern", ContractSpec{JSONSchema: []byte(`{"pattern": "("}`)}},
		{"schema referring to a file", ContractSpec{JSONSchema: []byte(`{"$ref": "file:///etc/hostname"}`)}},
		{"schema referring to the network", ContractSpec{JSONSchema: []byte(`{"$ref": "https://example.com/s.json"}`)}},
		{"empty required field name", ContractSpec{RequiredFields: []string{"ok", ""}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewContract(tt.spec)
			if !errors.Is(err, ErrInvalidContract) {
				t.Fatalf("NewContract = %v, %v; want ErrInvalidContract", c, err)
			}
		})
	}
}

func TestNewContractKeepsSpecAndDedupesFields(t *testing.T) {
	c := mustContract(t, ContractSpec{
		RequireComplete: true,
		RequiredFields:  []string{"a", "b", "a"},
		JSONSchema:      []byte(personSchema),
	})
	if !c.RequireComplete() || !c.HasSchema() || !c.NeedsComplete() {
		t.Fatalf("contract lost its spec: complete=%v schema=%v", c.RequireComplete(), c.HasSchema())
	}
	got := c.RequiredFields()
	if len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("RequiredFields = %v, want [a b]", got)
	}
	got[0] = "mutated"
	if c.RequiredFields()[0] != "a" {
		t.Fatal("RequiredFields exposes the contract's own slice")
	}
	blank := mustContract(t, ContractSpec{JSONSchema: []byte("  \n")})
	if blank.HasSchema() || blank.NeedsComplete() {
		t.Fatal("a blank schema should mean no schema")
	}
}

func TestCompleteFinishAcceptsOnlyNaturalEnds(t *testing.T) {
	tests := []struct {
		reason string
		want   bool
	}{
		{"stop", true}, {"tool_calls", true}, {"end_turn", true},
		{"stop_sequence", true}, {"tool_use", true}, {"function_call", true},
		{"length", false}, {"max_tokens", false}, {"content_filter", false},
		{"refusal", false}, {"", false}, {"something_new", false},
	}
	for _, tt := range tests {
		if got := CompleteFinish(tt.reason); got != tt.want {
			t.Errorf("CompleteFinish(%q) = %v, want %v", tt.reason, got, tt.want)
		}
	}
}

func TestResponseFormatBecomesPartOfTheContract(t *testing.T) {
	pool := ContractSpec{RequiredFields: []string{"answer"}, JSONSchema: []byte(`{"$defs":{"n":{"type":"string"}},"type":"object"}`)}
	tests := []struct {
		name    string
		format  string
		changed bool
		wantErr error
		valid   string // content that must pass, when changed
		invalid string // content that must fail, when changed
	}{
		{name: "absent leaves the pool's contract", format: ``},
		{name: "text leaves the pool's contract", format: `{"type":"text"}`},
		{name: "json_object requires a JSON object with the pool's fields", format: `{"type":"json_object"}`, changed: true,
			valid: `{"answer":1}`, invalid: `[1]`},
		{name: "json_schema requires the caller's schema and the pool's fields", changed: true,
			format: `{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"answer":{"type":"integer"}}}}}`,
			valid:  `{"answer":1}`, invalid: `{"answer":"one"}`},
		{name: "a caller's schema with local references nests under the pool's", changed: true,
			format: `{"type":"json_schema","json_schema":{"name":"x","schema":{"$defs":{"n":{"type":"integer"}},"type":"object","properties":{"answer":{"$ref":"#/$defs/n"}}}}}`,
			valid:  `{"answer":1}`, invalid: `{"answer":"one"}`},
		{name: "json_schema without a schema is refused", format: `{"type":"json_schema","json_schema":{"name":"x"}}`, wantErr: ErrInvalidResponseFormat},
		{name: "an unknown type is refused", format: `{"type":"yaml"}`, wantErr: ErrInvalidResponseFormat},
		{name: "malformed JSON is refused", format: `{"type":`, wantErr: ErrInvalidResponseFormat},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, changed, err := pool.WithResponseFormat(json.RawMessage(tt.format))
			if !errors.Is(err, tt.wantErr) || changed != tt.changed {
				t.Fatalf("WithResponseFormat = changed %v, err %v; want %v, %v", changed, err, tt.changed, tt.wantErr)
			}
			if !changed {
				return
			}
			c, err := NewContract(spec)
			if err != nil {
				t.Fatalf("NewContract: %v", err)
			}
			if !c.RequireComplete() {
				t.Error("a structured answer must be complete to win")
			}
			judge := func(content string) bool {
				return Validate(c, schemas.Complete, Observation{Status: schemas.StatusOK, WellFormed: true, Tokens: 3,
					FirstToken: true, Done: true, FinishReason: "stop", Content: []byte(content)}).Valid
			}
			if !judge(tt.valid) {
				t.Errorf("%s judged invalid", tt.valid)
			}
			if judge(tt.invalid) {
				t.Errorf("%s judged valid", tt.invalid)
			}
			if judge(`{"other":1}`) {
				t.Error("the pool's required field was dropped")
			}
		})
	}
}
