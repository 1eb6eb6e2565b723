package arbiter

import (
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
		{"first_token accepts an empty but complete answer", ContractSpec{}, schemas.FirstToken,
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
		{"complete without a finish requirement accepts truncation", ContractSpec{}, schemas.Complete, done("length", "hel"), true, true},
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
		{"required completeness accepts tool_calls", ContractSpec{RequireComplete: true}, schemas.Complete, done("tool_calls", ""), true, true},
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

func TestValidateWithoutContractActsAsEmptyContract(t *testing.T) {
	if v := Validate(nil, schemas.FirstToken, streaming(1)); !v.Valid {
		t.Fatalf("nil contract at first token: %+v", v)
	}
	if v := Validate(nil, schemas.Complete, done("length", "x")); !v.Valid {
		t.Fatalf("nil contract at complete: %+v", v)
	}
	if v := Validate(nil, schemas.FirstToken, Observation{}); v.Valid || !v.Ready {
		t.Fatalf("zero observation must fail closed: %+v", v)
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
