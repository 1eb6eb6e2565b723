package schemas

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestResponsesMembersTranslateOrAreRefused(t *testing.T) {
	req := func(extra string) *ChatRequest {
		r := &ChatRequest{Dialect: DialectResponses, Messages: []Message{{Role: MessageUser, Content: TextContent("hi")}}}
		if err := json.Unmarshal([]byte(extra), &r.Extra); err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, tc := range []struct {
		name, extra string
		to          Dialect
		want        string // the translated members, or the refused param after "!"
	}{
		{"chat members go as sent", `{"user":"u1","metadata":{"k":"v"},"store":true,"service_tier":"auto"}`, DialectOpenAI,
			`{"metadata":{"k":"v"},"service_tier":"auto","store":true,"user":"u1"}`},
		{"reasoning effort", `{"reasoning":{"effort":"low"}}`, DialectOpenAI, `{"reasoning_effort":"low"}`},
		{"reasoning summary", `{"reasoning":{"summary":"auto"}}`, DialectOpenAI, "!reasoning.summary"},
		{"neutral values", `{"store":false,"background":false,"truncation":"disabled"}`, DialectAnthropic, `{}`},
		{"state", `{"previous_response_id":"resp_1"}`, DialectOpenAI, "!previous_response_id"},
		{"user to anthropic", `{"safety_identifier":"s","user":"u1"}`, DialectAnthropic, `{"metadata":{"user_id":"u1"}}`},
		{"metadata to anthropic", `{"metadata":{"k":"v"}}`, DialectAnthropic, "!metadata"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := req(tc.extra).ForDialect(tc.to)
			if tc.want[0] == '!' {
				ue, ok := errors.AsType[*UntranslatableError](err)
				if !ok || ue.Param != tc.want[1:] || ue.To != tc.to {
					t.Fatalf("err = %v, want %s refused", err, tc.want[1:])
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, _ := json.Marshal(out)
			if string(got) != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
	if err := req(`{"input":"x"}`).Validate(); !errors.Is(err, ErrMalformedRequest) {
		t.Fatalf("input in Extra: %v", err)
	}
}
