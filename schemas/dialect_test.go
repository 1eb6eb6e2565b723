package schemas

import (
	"encoding/json"
	"errors"
	"maps"
	"testing"
)

func extraOf(kv ...string) map[string]json.RawMessage {
	m := make(map[string]json.RawMessage, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = json.RawMessage(kv[i+1])
	}
	return m
}

func TestValidateRefusesExtraMembersATypedFieldStandsFor(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  ChatRequest
		ok   bool
	}{
		{"unknown member", ChatRequest{Extra: extraOf("x_vendor", `{"a":1}`)}, true},
		{"model", ChatRequest{Extra: extraOf("model", `"m"`)}, false},
		{"stream_options", ChatRequest{Extra: extraOf("stream_options", `{}`)}, false},
		{"max_completion_tokens", ChatRequest{Extra: extraOf("max_completion_tokens", `5`)}, false},
		{"max_tokens beside max_tokens", ChatRequest{Extra: extraOf("max_tokens", `5`)}, false},
		{"max_tokens superseded by max_completion_tokens", ChatRequest{MaxTokensField: ParamMaxCompletionTokens, Extra: extraOf("max_tokens", `5`)}, true},
		{"anthropic system", ChatRequest{Dialect: DialectAnthropic, Extra: extraOf("system", `"s"`)}, false},
		{"anthropic top_k", ChatRequest{Dialect: DialectAnthropic, Extra: extraOf("top_k", `5`)}, true},
		{"n of 1", ChatRequest{Extra: extraOf("n", `1`)}, true},
		{"n of 2", ChatRequest{Extra: extraOf("n", `2`)}, false},
		{"invalid JSON", ChatRequest{Extra: extraOf("x", `{`)}, false},
		{"unnamed member", ChatRequest{Extra: extraOf("", `1`)}, false},
		{"unknown dialect", ChatRequest{Dialect: "gemini"}, false},
		{"unknown cap name", ChatRequest{MaxTokensField: "max_output_tokens"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Messages = []Message{{Role: MessageUser, Content: TextContent("hi")}}
			err := tc.req.Validate()
			if tc.ok != (err == nil) {
				t.Fatalf("Validate() = %v, want ok %v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrMalformedRequest) {
				t.Errorf("Validate() = %v, want ErrMalformedRequest", err)
			}
		})
	}
}

func TestForDialectPassesTheCallersDialectThrough(t *testing.T) {
	for _, d := range []Dialect{DialectOpenAI, DialectAnthropic} {
		req := ChatRequest{Dialect: d, Extra: extraOf("x_unknown", `{"k":[1,2]}`, "metadata", `{"user_id":"u"}`)}
		if d == DialectOpenAI {
			req.Extra["logit_bias"] = json.RawMessage(`{"1":2}`)
			req.PresencePenalty = new(0.5) // typed: not the Extra map's concern
		}
		got, err := req.ForDialect(d)
		if err != nil {
			t.Fatalf("%s: ForDialect = %v", d, err)
		}
		if !maps.EqualFunc(got, req.Extra, func(a, b json.RawMessage) bool { return string(a) == string(b) }) {
			t.Errorf("%s: ForDialect = %s, want the extras as sent", d, got)
		}
	}
}

func TestForDialectTranslatesOrRefusesEveryMember(t *testing.T) {
	for _, tc := range []struct {
		name      string
		req       ChatRequest
		to        Dialect
		want      map[string]json.RawMessage // on success
		wantParam string                     // on refusal
	}{
		{name: "user becomes metadata.user_id", to: DialectAnthropic,
			req:  ChatRequest{Extra: extraOf("user", `"u-1"`)},
			want: extraOf("metadata", `{"user_id":"u-1"}`)},
		{name: "defaults that change nothing are left out", to: DialectAnthropic,
			req:  ChatRequest{MaxTokensField: ParamMaxCompletionTokens, Extra: extraOf("n", `1`, "logprobs", `false`, "store", `false`, "max_tokens", `9`, "seed_like", `null`)},
			want: extraOf()},
		{name: "logit_bias", to: DialectAnthropic, req: ChatRequest{Extra: extraOf("logit_bias", `{"1":2}`)}, wantParam: "logit_bias"},
		{name: "logprobs true", to: DialectAnthropic, req: ChatRequest{Extra: extraOf("logprobs", `true`)}, wantParam: "logprobs"},
		{name: "top_logprobs", to: DialectAnthropic, req: ChatRequest{Extra: extraOf("top_logprobs", `2`)}, wantParam: "top_logprobs"},
		{name: "openai metadata", to: DialectAnthropic, req: ChatRequest{Extra: extraOf("metadata", `{"k":"v"}`)}, wantParam: "metadata"},
		{name: "reasoning_effort", to: DialectAnthropic, req: ChatRequest{Extra: extraOf("reasoning_effort", `"low"`)}, wantParam: "reasoning_effort"},
		{name: "service_tier", to: DialectAnthropic, req: ChatRequest{Extra: extraOf("service_tier", `"flex"`)}, wantParam: "service_tier"},
		{name: "store true", to: DialectAnthropic, req: ChatRequest{Extra: extraOf("store", `true`)}, wantParam: "store"},
		{name: "an unknown member", to: DialectAnthropic, req: ChatRequest{Extra: extraOf("x_vendor", `1`)}, wantParam: "x_vendor"},
		{name: "the first member by name", to: DialectAnthropic, req: ChatRequest{Extra: extraOf("zz", `1`, "aa", `1`)}, wantParam: "aa"},
		{name: "presence_penalty", to: DialectAnthropic, req: ChatRequest{PresencePenalty: new(0.1)}, wantParam: "presence_penalty"},
		{name: "frequency_penalty", to: DialectAnthropic, req: ChatRequest{FrequencyPenalty: new(0.1)}, wantParam: "frequency_penalty"},
		{name: "seed", to: DialectAnthropic, req: ChatRequest{Seed: new(int64(3))}, wantParam: "seed"},
		{name: "temperature above 1", to: DialectAnthropic, req: ChatRequest{Temperature: new(1.5)}, wantParam: "temperature"},
		{name: "temperature of 1", to: DialectAnthropic, req: ChatRequest{Temperature: new(1.0)}, want: nil},
		{name: "json response_format", to: DialectAnthropic, req: ChatRequest{ResponseFormat: json.RawMessage(`{"type":"json_object"}`)}, wantParam: "response_format"},
		{name: "text response_format", to: DialectAnthropic, req: ChatRequest{ResponseFormat: json.RawMessage(`{"type":"text"}`)}, want: nil},
		{name: "metadata.user_id becomes user", to: DialectOpenAI,
			req:  ChatRequest{Dialect: DialectAnthropic, Extra: extraOf("metadata", `{"user_id":"u-2"}`, "thinking", `{"type":"disabled"}`)},
			want: extraOf("user", `"u-2"`)},
		{name: "top_k", to: DialectOpenAI, req: ChatRequest{Dialect: DialectAnthropic, Extra: extraOf("top_k", `5`)}, wantParam: "top_k"},
		{name: "thinking enabled", to: DialectOpenAI, req: ChatRequest{Dialect: DialectAnthropic, Extra: extraOf("thinking", `{"type":"enabled","budget_tokens":1024}`)}, wantParam: "thinking"},
		{name: "anthropic service_tier", to: DialectOpenAI, req: ChatRequest{Dialect: DialectAnthropic, Extra: extraOf("service_tier", `"auto"`)}, wantParam: "service_tier"},
		{name: "metadata of another key", to: DialectOpenAI, req: ChatRequest{Dialect: DialectAnthropic, Extra: extraOf("metadata", `{"team":"a"}`)}, wantParam: "metadata.team"},
		{name: "typed fields of an anthropic caller", to: DialectOpenAI, req: ChatRequest{Dialect: DialectAnthropic, Temperature: new(0.5), ParallelToolCalls: new(false)}, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.req.ForDialect(tc.to)
			if tc.wantParam != "" {
				ue, ok := errors.AsType[*UntranslatableError](err)
				if !ok || ue.Param != tc.wantParam || ue.To != tc.to || !errors.Is(err, ErrUntranslatable) {
					t.Fatalf("ForDialect = %v, want an UntranslatableError naming %s", err, tc.wantParam)
				}
				return
			}
			if err != nil {
				t.Fatalf("ForDialect = %v", err)
			}
			if len(got) != len(tc.want) || !maps.EqualFunc(got, tc.want, func(a, b json.RawMessage) bool { return string(a) == string(b) }) {
				t.Errorf("ForDialect = %s, want %s", got, tc.want)
			}
		})
	}
}
