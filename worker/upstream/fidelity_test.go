package upstream

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/schemas"
)

// bodyMembers decodes a provider request body into its members, raw.
func bodyMembers(t *testing.T, body []byte) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("provider body is not a JSON object: %v\n%s", err, body)
	}
	return m
}

func TestOpenAIRequestCarriesTheCallersMembersAsSent(t *testing.T) {
	req := hello()
	req.MaxTokens, req.MaxTokensField = 300, schemas.ParamMaxCompletionTokens
	req.ParallelToolCalls = new(false)
	req.Extra = map[string]json.RawMessage{
		"logit_bias":       json.RawMessage(`{"50256":-100}`),
		"user":             json.RawMessage(`"user-1"`),
		"metadata":         json.RawMessage(`{"team":"a <b>"}`),
		"reasoning_effort": json.RawMessage(`"high"`),
		"service_tier":     json.RawMessage(`"flex"`),
		"store":            json.RawMessage(`true`),
		"logprobs":         json.RawMessage(`true`),
		"top_logprobs":     json.RawMessage(`3`),
		"x_vendor":         json.RawMessage(`{"nested":[1,2,{"k":null}]}`),
	}
	got := make(chan []byte, 1)
	p := newProvider(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- b
		replay(answer{body: fixture(t, "stream_content.sse")})(w, r)
	})
	if _, err := newAdapter(t, p, "").Stream(context.Background(), req, nil); err != nil {
		t.Fatalf("Stream: %v", err)
	}
	m := bodyMembers(t, <-got)
	for name, want := range req.Extra {
		if !sameJSON(t, m[name], want) {
			t.Errorf("%s = %s, want %s as sent", name, m[name], want)
		}
	}
	for name, want := range map[string]string{
		"max_completion_tokens": `300`, "parallel_tool_calls": `false`, "model": `"route-model-2024"`,
		"stream": `true`, "stream_options": `{"include_usage":true}`,
	} {
		if !sameJSON(t, m[name], []byte(want)) {
			t.Errorf("%s = %s, want %s", name, m[name], want)
		}
	}
	if _, ok := m["max_tokens"]; ok {
		t.Errorf("max_tokens sent beside max_completion_tokens: %s", m["max_tokens"])
	}
}

func TestOpenAIRequestTranslatesAMessagesCallersMembers(t *testing.T) {
	req := hello()
	req.Dialect = schemas.DialectAnthropic
	req.Extra = map[string]json.RawMessage{"metadata": json.RawMessage(`{"user_id":"u-9"}`)}
	got := make(chan []byte, 1)
	p := newProvider(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- b
		replay(answer{body: fixture(t, "stream_content.sse")})(w, r)
	})
	if _, err := newAdapter(t, p, "").Stream(context.Background(), req, nil); err != nil {
		t.Fatalf("Stream: %v", err)
	}
	m := bodyMembers(t, <-got)
	if string(m["user"]) != `"u-9"` || m["metadata"] != nil {
		t.Errorf("user %s, metadata %s; want metadata.user_id as user", m["user"], m["metadata"])
	}
}

// A member the provider's API has no equivalent for ends the group before
// anything is sent, and the recorded message names it only when it is a
// member of either API.
func TestAnUntranslatableMemberEndsTheGroupUnsent(t *testing.T) {
	for _, tc := range []struct {
		name    string
		edit    func(*schemas.ChatRequest)
		openAI  bool
		message string
	}{
		{"top_k to OpenAI", func(r *schemas.ChatRequest) {
			r.Dialect, r.Extra = schemas.DialectAnthropic, map[string]json.RawMessage{"top_k": json.RawMessage(`5`)}
		}, true, "'top_k'"},
		{"logit_bias to Anthropic", func(r *schemas.ChatRequest) {
			r.Extra = map[string]json.RawMessage{"logit_bias": json.RawMessage(`{"1":2}`)}
		}, false, "'logit_bias'"},
		{"seed to Anthropic", func(r *schemas.ChatRequest) { r.Seed = new(int64(4)) }, false, "'seed'"},
		{"a made-up member", func(r *schemas.ChatRequest) {
			r.Extra = map[string]json.RawMessage{"secret-looking name": json.RawMessage(`1`)}
		}, false, "a request member the caller named"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := hello()
			tc.edit(req)
			var err error
			var requests func() int32
			if tc.openAI {
				p := newProvider(t, replay(answer{body: fixture(t, "stream_content.sse")}))
				_, err = newAdapter(t, p, "").Stream(context.Background(), req, nil)
				requests = p.requests.Load
			} else {
				p := newMessagesProvider(t, replay(answer{body: fixture(t, "anthropic_stream_text.sse")}))
				_, err = newAnthropicAdapter(t, p, "").Stream(context.Background(), req, nil)
				requests = p.requests.Load
			}
			ue := asError(t, err)
			if ue.Status != schemas.StatusInvalidRequest || ue.Scope != schemas.ScopeGroup || !strings.Contains(ue.Message, tc.message) {
				t.Errorf("error = %v, want a group-scoped invalid_request naming %s", ue, tc.message)
			}
			if strings.Contains(ue.Message, "secret") {
				t.Errorf("message %q repeats a member name the caller made up", ue.Message)
			}
			if n := requests(); n != 0 {
				t.Errorf("provider saw %d requests, want none", n)
			}
		})
	}
}

func TestAnthropicRequestCarriesAMessagesCallersMembersAsSent(t *testing.T) {
	req := hello()
	req.Dialect = schemas.DialectAnthropic
	req.Extra = map[string]json.RawMessage{
		"top_k":        json.RawMessage(`5`),
		"metadata":     json.RawMessage(`{"user_id":"u-3"}`),
		"thinking":     json.RawMessage(`{"type":"enabled","budget_tokens":1024}`),
		"service_tier": json.RawMessage(`"standard_only"`),
		"x_beta":       json.RawMessage(`["a"]`),
	}
	got := make(chan captured, 1)
	p := newMessagesProvider(t, capture(t, got))
	if _, err := newAnthropicAdapter(t, p, "").Stream(context.Background(), req, nil); err != nil {
		t.Fatalf("Stream: %v", err)
	}
	m := bodyMembers(t, (<-got).body)
	for name, want := range req.Extra {
		if !sameJSON(t, m[name], want) {
			t.Errorf("%s = %s, want %s as sent", name, m[name], want)
		}
	}
}
