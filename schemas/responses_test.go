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
		{"every member to an openai route as sent", `{"previous_response_id":"resp_1","reasoning":{"summary":"auto"},"store":true}`, DialectOpenAI,
			`{"previous_response_id":"resp_1","reasoning":{"summary":"auto"},"store":true}`},
		{"neutral values", `{"store":false,"background":false,"truncation":"disabled"}`, DialectAnthropic, `{}`},
		{"state to anthropic", `{"previous_response_id":"resp_1"}`, DialectAnthropic, "!previous_response_id"},
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
	seeded := req(`{}`)
	seeded.Seed = new(int64)
	if _, err := seeded.ForDialect(DialectOpenAI); err == nil || err.Error() != "'seed' has no equivalent in the OpenAI Responses API" {
		t.Fatalf("seed to a Responses route: %v", err)
	}
	if err := req(`{"input":"x"}`).Validate(); !errors.Is(err, ErrMalformedRequest) {
		t.Fatalf("input in Extra: %v", err)
	}
}
