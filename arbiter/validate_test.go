package arbiter

import (
	"errors"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/schemas"
)

// streaming is an attempt mid-stream with n tokens and no failure so far.
func streaming(n int) Observation {
	return Observation{WellFormed: true, Tokens: n, FirstToken: n > 0}
}

// done is a finished, successful attempt.
func done(finish, content string) Observation {
	return Observation{
		Status: schemas.StatusOK, WellFormed: true, Tokens: 12, FirstToken: true,
		Done: true, FinishReason: finish, Content: []byte(content),
	}
}

func with(o Observation, f func(*Observation)) Observation { f(&o); return o }

func TestValidateJudgesEachCommitPoint(t *testing.T) {
	tokens3 := schemas.CommitPoint{Kind: schemas.CommitTokens, Tokens: 3}
	tests := []struct {
		name      string
		contract  ContractSpec
		point     schemas.CommitPoint
		obs       Observation
		wantValid bool
		wantReady bool
	}{
		// first_token
		{"first_token waits for the first token", ContractSpec{}, schemas.FirstToken, streaming(0), false, false},
		{"first_token is valid at the first content token", ContractSpec{}, schemas.FirstToken, streaming(1), true, true},
		{"first_token counts a tool-call token", ContractSpec{}, schemas.FirstToken,
			with(streaming(0), func(o *Observation) { o.FirstToken = true }), true, true},
		{"first_token refuses a malformed stream", ContractSpec{}, schemas.FirstToken,
			with(streaming(1), func(o *Observation) { o.WellFormed = false }), false, true},
		{"first_token refuses a failed status", ContractSpec{}, schemas.FirstToken,
			with(streaming(1), func(o *Observation) { o.Status = schemas.StatusServerError }), false, true},
		{"first_token refuses an empty answer that ends before any token", ContractSpec{}, schemas.FirstToken,
			with(done("stop", ""), func(o *Observation) { o.FirstToken, o.Tokens = false, 0 }), false, true},
		{"first_token accepts an empty answer the pool allows", ContractSpec{AllowEmpty: true}, schemas.FirstToken,
			with(done("stop", ""), func(o *Observation) { o.FirstToken, o.Tokens = false, 0 }), true, true},
		{"first_token refuses an answer filtered before any token", ContractSpec{}, schemas.FirstToken,
			with(done("content_filter", ""), func(o *Observation) { o.FirstToken, o.Tokens = false, 0 }), false, true},
		{"first_token refuses a done attempt without status ok", ContractSpec{}, schemas.FirstToken,
			with(done("stop", "hi"), func(o *Observation) { o.Status = "" }), false, true},

		// tokens:N
		{"tokens:N waits below N", ContractSpec{}, tokens3, streaming(2), false, false},
		{"tokens:N is valid at N tokens", ContractSpec{}, tokens3, streaming(3), true, true},
		{"tokens:N accepts a complete answer shorter than N", ContractSpec{}, tokens3,
			with(done("stop", "ok"), func(o *Observation) { o.Tokens = 1 }), true, true},
		{"tokens:N refuses an answer truncated before N", ContractSpec{}, tokens3,
			with(done("length", "o"), func(o *Observation) { o.Tokens = 1 }), false, true},
		{"tokens:N refuses a malformed stream", ContractSpec{}, tokens3,
			with(streaming(5), func(o *Observation) { o.WellFormed = false }), false, true},

		// complete, empty contract
		{"complete waits for the result", ContractSpec{}, schemas.Complete, streaming(50), false, false},
		{"complete accepts a finished answer", ContractSpec{}, schemas.Complete, done("stop", "hello"), true, true},
		{"complete without a finish requirement accepts truncation at the asked max_tokens", ContractSpec{}, schemas.Complete,
			with(done("length", "hel"), func(o *Observation) { o.MaxTokens = 12 }), true, true},
		{"complete refuses a failed result", ContractSpec{}, schemas.Complete,
			with(done("stop", "x"), func(o *Observation) { o.Status = schemas.StatusContractInvalid }), false, true},
		{"complete refuses a malformed stream", ContractSpec{}, schemas.Complete,
			with(done("stop", "x"), func(o *Observation) { o.WellFormed = false }), false, true},

		// complete finish reason required
		{"required completeness refuses length", ContractSpec{RequireComplete: true}, schemas.Complete, done("length", "hel"), false, true},
		{"required completeness refuses max_tokens", ContractSpec{RequireComplete: true}, schemas.Complete, done("max_tokens", "hel"), false, true},
		{"required completeness refuses content_filter", ContractSpec{RequireComplete: true}, schemas.Complete, done("content_filter", ""), false, true},
		{"required completeness refuses a missing finish reason", ContractSpec{RequireComplete: true}, schemas.Complete, done("", "x"), false, true},
		{"required completeness accepts stop", ContractSpec{RequireComplete: true}, schemas.Complete, done("stop", "x"), true, true},
		{"required completeness accepts tool_calls", ContractSpec{RequireComplete: true}, schemas.Complete,
			done("tool_calls", `[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]`), true, true},
		{"required completeness accepts end_turn", ContractSpec{RequireComplete: true}, schemas.Complete, done("end_turn", "x"), true, true},
		{"required completeness is judged at complete even if first_token is passed",
			ContractSpec{RequireComplete: true}, schemas.FirstToken, streaming(4), false, false},

		// required fields
		{"required fields accept an object that has them", ContractSpec{RequiredFields: []string{"a", "b"}},
			schemas.Complete, done("stop", `{"a":1,"b":null,"c":2}`), true, true},
		{"required fields refuse a missing field", ContractSpec{RequiredFields: []string{"a", "b"}},
			schemas.Complete, done("stop", `{"a":1}`), false, true},
		{"required fields refuse non-JSON content", ContractSpec{RequiredFields: []string{"a"}},
			schemas.Complete, done("stop", `a: 1`), false, true},
		{"required fields refuse a JSON array", ContractSpec{RequiredFields: []string{"a"}},
			schemas.Complete, done("stop", `[{"a":1}]`), false, true},
		{"required fields refuse trailing garbage", ContractSpec{RequiredFields: []string{"a"}},
			schemas.Complete, done("stop", `{"a":1} extra`), false, true},
		{"required fields refuse a truncated JSON object", ContractSpec{RequiredFields: []string{"a"}},
			schemas.Complete, done("length", `{"a":1, "b": [1, 2`), false, true},

		// JSON schema
		{"schema accepts a conforming answer", ContractSpec{JSONSchema: []byte(personSchema)},
			schemas.Complete, done("stop", `{"name":"Ada","age":36}`), true, true},
		{"schema refuses a wrong type", ContractSpec{JSONSchema: []byte(personSchema)},
			schemas.Complete, done("stop", `{"name":"Ada","age":"36"}`), false, true},
		{"schema refuses a missing property", ContractSpec{JSONSchema: []byte(personSchema)},
			schemas.Complete, done("stop", `{"name":"Ada"}`), false, true},
		{"schema refuses a broken pattern", ContractSpec{JSONSchema: []byte(personSchema)},
			schemas.Complete, done("stop", `{"name":"ada","age":1}`), false, true},
		{"schema keeps integer precision", ContractSpec{JSONSchema: []byte(`{"type":"integer"}`)},
			schemas.Complete, done("stop", `12345678901234567891`), true, true},
		{"schema refuses an empty answer", ContractSpec{JSONSchema: []byte(personSchema)},
			schemas.Complete, done("stop", ``), false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustContract(t, tt.contract)
			v := Validate(c, tt.point, tt.obs)
			if v.Valid != tt.wantValid || v.Ready != tt.wantReady {
				t.Fatalf("Validate = %+v, want valid=%v ready=%v", v, tt.wantValid, tt.wantReady)
			}
			if !v.Valid && v.Reason == "" {
				t.Fatal("a verdict that is not valid must say why")
			}
		})
	}
}

func TestValidateWithoutContractAppliesTheDefaultPredicate(t *testing.T) {
	if v := Validate(nil, schemas.FirstToken, streaming(1)); !v.Valid {
		t.Fatalf("nil contract at first token: %+v", v)
	}
	if v := Validate(nil, schemas.Complete, done("stop", "x")); !v.Valid {
		t.Fatalf("nil contract at complete: %+v", v)
	}
	if v := Validate(nil, schemas.Complete, done("length", "x")); v.Valid || !v.Ready {
		t.Fatalf("nil contract must refuse a truncated answer: %+v", v)
	}
	if v := Validate(nil, schemas.FirstToken, Observation{}); v.Valid || !v.Ready {
		t.Fatalf("zero observation must fail closed: %+v", v)
	}
}

// TestDefaultPredicate is the default success predicate (docs/architecture.md
// §6): with no contract configured a finished answer wins only if it is
// not empty, not truncated below its limit and not ended by a content
// filter; a pool may allow each.
func TestDefaultPredicate(t *testing.T) {
	asked := func(maxTokens, tokens int) func(*Observation) {
		return func(o *Observation) { o.MaxTokens, o.Tokens = maxTokens, tokens }
	}
	tokens3 := schemas.CommitPoint{Kind: schemas.CommitTokens, Tokens: 3}
	const toolCall = `[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]`
	tests := []struct {
		name     string
		contract ContractSpec
		point    schemas.CommitPoint
		obs      Observation
		want     bool
	}{
		{"a finished answer with content wins", ContractSpec{}, schemas.Complete, done("stop", "hello"), true},
		{"a tool call is an answer", ContractSpec{}, schemas.Complete, done("tool_calls", toolCall), true},
		{"a refusal is an answer", ContractSpec{}, schemas.Complete,
			with(done("stop", ""), func(o *Observation) { o.Refusal = true }), true},
		{"an empty answer never wins", ContractSpec{}, schemas.Complete, done("stop", ""), false},
		{"a white-space answer is empty", ContractSpec{}, schemas.Complete, done("stop", " \n\t "), false},
		{"an empty answer wins where the pool allows empty", ContractSpec{AllowEmpty: true}, schemas.Complete, done("stop", ""), true},

		{"length with no max_tokens asked and no route limit is truncated", ContractSpec{}, schemas.Complete,
			with(done("length", "hello"), asked(0, 5)), false},
		{"length below the asked max_tokens is truncated", ContractSpec{}, schemas.Complete,
			with(done("length", "hello"), asked(100, 5)), false},
		{"length at the asked max_tokens is the caller's own limit", ContractSpec{}, schemas.Complete,
			with(done("length", "hello"), asked(5, 5)), true},
		{"max_tokens is truncation as length is", ContractSpec{}, schemas.Complete,
			with(done("max_tokens", "hello"), asked(100, 5)), false},
		{"length below the route limit is truncated", ContractSpec{MaxOutputTokens: 4096}, schemas.Complete,
			with(done("length", "hello"), asked(0, 5)), false},
		{"length at the route limit with no max_tokens asked wins", ContractSpec{MaxOutputTokens: 4096}, schemas.Complete,
			with(done("length", "hello"), asked(0, 4096)), true},
		{"the asked max_tokens, not the route limit, bounds an answer that asked one", ContractSpec{MaxOutputTokens: 10}, schemas.Complete,
			with(done("length", "hello"), asked(100, 10)), false},
		{"a truncated answer wins where the pool allows truncation", ContractSpec{AllowTruncated: true}, schemas.Complete,
			with(done("length", "hello"), asked(0, 5)), true},
		{"require_complete refuses truncation even where allowed", ContractSpec{AllowTruncated: true, RequireComplete: true}, schemas.Complete,
			with(done("length", "hello"), asked(0, 5)), false},

		{"content_filter never wins", ContractSpec{}, schemas.Complete, done("content_filter", "partial"), false},
		{"Anthropic's refusal stop reason is the content filter", ContractSpec{}, schemas.Complete, done("refusal", "partial"), false},
		{"content_filter wins where the pool allows it", ContractSpec{AllowContentFilter: true}, schemas.Complete, done("content_filter", "partial"), true},

		{"first_token cannot see truncation yet", ContractSpec{}, schemas.FirstToken, streaming(1), true},
		{"first_token judges an answer done before its first token", ContractSpec{}, schemas.FirstToken,
			with(done("content_filter", ""), func(o *Observation) { o.FirstToken, o.Tokens = false, 0 }), false},
		{"tokens:N accepts an answer that stopped at the asked max_tokens below N", ContractSpec{}, tokens3,
			with(done("length", "hi"), asked(2, 2)), true},
		{"tokens:N refuses an empty answer done before N", ContractSpec{}, tokens3,
			with(done("stop", ""), asked(0, 0)), false},
		{"required fields still apply to a usable answer", ContractSpec{RequiredFields: []string{"a"}}, schemas.Complete,
			done("stop", `{"b":1}`), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := Validate(mustContract(t, tt.contract), tt.point, tt.obs)
			if v.Valid != tt.want || !v.Ready {
				t.Fatalf("Validate = %+v, want valid=%v ready=true", v, tt.want)
			}
			if !v.Valid && v.Reason == "" {
				t.Fatal("a verdict that is not valid must say why")
			}
		})
	}
}

func TestNewContractRefusesANegativeOutputLimit(t *testing.T) {
	if _, err := NewContract(ContractSpec{MaxOutputTokens: -1}); !errors.Is(err, ErrInvalidContract) {
		t.Fatalf("NewContract = %v, want ErrInvalidContract", err)
	}
}

func TestValidateReasonNeverEchoesContent(t *testing.T) {
	const secret = "secret-7f3a"
	strict := ContractSpec{
		RequireComplete: true,
		RequiredFields:  []string{"name"},
		JSONSchema:      []byte(personSchema),
	}
	tests := []struct {
		name string
		obs  Observation
	}{
		{"not JSON", done("stop", secret)},
		{"broken JSON", done("stop", `{"`+secret+`": `)},
		{"pattern failure", done("stop", `{"name":"`+secret+`","age":3}`)},
		{"extra key with a content-chosen name", done("stop", `{"name":"Ada","age":-1,"`+secret+`":1}`)},
		{"unknown finish reason", done(secret, `{"name":"Ada","age":3}`)},
		{"unknown status", with(done("stop", "x"), func(o *Observation) { o.Status = schemas.StatusClass(secret) })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := Validate(mustContract(t, strict), schemas.Complete, tt.obs)
			if v.Valid {
				t.Fatalf("expected invalid, got %+v", v)
			}
			if strings.Contains(strings.ToLower(v.Reason), "secret") {
				t.Fatalf("reason echoes content: %q", v.Reason)
			}
		})
	}
}

func TestValidateSchemaReasonPointsIntoTheSchema(t *testing.T) {
	c := mustContract(t, ContractSpec{JSONSchema: []byte(personSchema)})
	v := Validate(c, schemas.Complete, done("stop", `{"name":"Ada","age":-4}`))
	if want := "#/properties/age/minimum"; !strings.HasSuffix(v.Reason, want) {
		t.Fatalf("reason %q does not end in %q", v.Reason, want)
	}
}
