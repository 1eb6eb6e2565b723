package dispatcher_test

// Request fidelity (docs/architecture.md §8): what a provider receives,
// behind a real door, dispatcher and worker, compared member by member with
// what the caller sent; and the members one dialect cannot translate to the
// other, refused with a 400 naming them before any group runs.

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/frontdoor/httpdoor"
	"github.com/hedgerow/hedgerow/schemas"
)

// dialectCluster serves the HTTP door in front of pool "general" over
// routes a and b, each a provider of the dialect given, answering two
// words.
func dialectCluster(t *testing.T, a, b schemas.Dialect) (*httptest.Server, *dispatcher.TestCluster, map[string]*dispatcher.TestProvider) {
	t.Helper()
	sc := dispatcher.NewTestScript(dispatcher.Words(2))
	ps := map[string]*dispatcher.TestProvider{}
	for route, dl := range map[string]schemas.Dialect{"a": a, "b": b} {
		if dl == schemas.DialectAnthropic {
			ps[route] = dispatcher.NewTestMessagesProvider(t, route, sc)
		} else {
			ps[route] = dispatcher.NewTestProvider(t, route, sc)
		}
	}
	c := dispatcher.NewTestCluster(t, []string{"a", "b"}, ps, "")
	return httpDoor(t, c, c.Dispatcher(), httpdoor.Options{}), c, ps
}

// receivedBody waits for the first request body a provider of ps receives,
// as its members.
func receivedBody(t *testing.T, ps map[string]*dispatcher.TestProvider) map[string]json.RawMessage {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		for _, p := range ps {
			select {
			case b := <-p.Bodies():
				return members(t, b)
			default:
			}
		}
		select {
		case <-timeout:
			t.Fatal("no provider received a request")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func members(t *testing.T, body []byte) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("not a JSON object: %v\n%s", err, body)
	}
	return m
}

// sameValue reports whether two JSON texts encode the same value.
func sameValue(t *testing.T, a, b json.RawMessage) bool {
	t.Helper()
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

func TestAnOpenAIRouteReceivesEveryMemberTheCallerSentAsSent(t *testing.T) {
	srv, _, ps := dialectCluster(t, schemas.DialectOpenAI, schemas.DialectOpenAI)
	sent := `{"model":"general",
		"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` + prompt + `"}],
		"max_completion_tokens":40,"temperature":0.3,"top_p":0.8,"presence_penalty":0.1,"frequency_penalty":0.2,"seed":7,
		"stop":["END"],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],
		"tool_choice":"auto","parallel_tool_calls":false,"response_format":{"type":"text"},
		"logprobs":true,"top_logprobs":2,"logit_bias":{"50256":-100},"user":"user-42","metadata":{"team":"a <b>"},
		"reasoning_effort":"low","service_tier":"flex","store":false,"n":1,
		"x_unknown_field":{"nested":[1,"two",null,{"deep":true}]},"stream":false}`
	resp, body := frontdoortest.Do(t, http.MethodPost, srv.URL+"/v1/chat/completions", sent, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	got, want := receivedBody(t, ps), members(t, []byte(sent))
	// hedgerow owns these: the route's model, and a stream with usage.
	owned := map[string]string{"model": `"m"`, "stream": `true`, "stream_options": `{"include_usage":true}`}
	for name, v := range owned {
		if !sameValue(t, got[name], json.RawMessage(v)) {
			t.Errorf("%s = %s, want %s", name, got[name], v)
		}
	}
	for name, v := range want {
		if _, ok := owned[name]; ok {
			continue
		}
		if !sameValue(t, got[name], v) {
			t.Errorf("%s = %s, want %s as the caller sent it", name, got[name], v)
		}
	}
	for name, v := range got {
		if _, ok := want[name]; !ok && owned[name] == "" {
			t.Errorf("the provider received %s = %s, which the caller never sent", name, v)
		}
	}
}

func TestTheNATSDoorCarriesExtraMembersToTheProvider(t *testing.T) {
	c, ps := dispatcher.TwoRoutes(t, dispatcher.NewTestScript(dispatcher.Words(2)))
	natsDoor(t, c)
	req := dispatcher.TestChat(false)
	req.MaxTokensField = schemas.ParamMaxCompletionTokens
	req.Extra = map[string]json.RawMessage{"logit_bias": json.RawMessage(`{"1":-100}`), "x_unknown": json.RawMessage(`[1]`)}
	data, err := json.Marshal(schemas.SubmitRequest{OperationClass: "default", ModelClass: "general", Request: req})
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.Conn().RequestMsg(&nats.Msg{Subject: schemas.SubmitSubject, Data: data}, natsWait)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get(schemas.HeaderStatus) != schemas.StatusDone {
		t.Fatalf("answer %s", m.Data)
	}
	got := receivedBody(t, ps)
	for name, want := range map[string]string{"logit_bias": `{"1":-100}`, "x_unknown": `[1]`, "max_completion_tokens": `50`} {
		if !sameValue(t, got[name], json.RawMessage(want)) {
			t.Errorf("%s = %s, want %s", name, got[name], want)
		}
	}
	if _, ok := got["max_tokens"]; ok {
		t.Errorf("max_tokens sent beside max_completion_tokens")
	}
}

func TestMembersTranslateAcrossDialects(t *testing.T) {
	for _, tc := range []struct {
		name       string
		route      schemas.Dialect
		path       string
		body       string
		want       map[string]string // members the provider must receive
		wantNoneOf []string
	}{
		{name: "OpenAI caller, Anthropic route", route: schemas.DialectAnthropic, path: "/v1/chat/completions",
			body: frontdoortest.ChatBody(false, `"user":"user-42","parallel_tool_calls":false,"n":1,"store":false,`+
				`"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]`),
			want:       map[string]string{"metadata": `{"user_id":"user-42"}`, "tool_choice": `{"type":"auto","disable_parallel_tool_use":true}`},
			wantNoneOf: []string{"user", "parallel_tool_calls", "n", "store"}},
		{name: "Anthropic caller, OpenAI route", route: schemas.DialectOpenAI, path: "/v1/messages",
			body:       frontdoortest.MessagesBody(false, `"metadata":{"user_id":"user-42"},"thinking":{"type":"disabled"}`),
			want:       map[string]string{"user": `"user-42"`},
			wantNoneOf: []string{"metadata", "thinking"}},
		{name: "Anthropic caller, Anthropic route", route: schemas.DialectAnthropic, path: "/v1/messages",
			body: frontdoortest.MessagesBody(false, `"metadata":{"user_id":"user-42"},"top_k":5,"service_tier":"standard_only",`+
				`"thinking":{"type":"enabled","budget_tokens":1024},"x_beta":{"a":[1]}`),
			want: map[string]string{"metadata": `{"user_id":"user-42"}`, "top_k": `5`, "service_tier": `"standard_only"`,
				"thinking": `{"type":"enabled","budget_tokens":1024}`, "x_beta": `{"a":[1]}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, _, ps := dialectCluster(t, tc.route, tc.route)
			resp, body := frontdoortest.Do(t, http.MethodPost, srv.URL+tc.path, tc.body, map[string]string{"Anthropic-Version": "2023-06-01"})
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			got := receivedBody(t, ps)
			for name, want := range tc.want {
				if !sameValue(t, got[name], json.RawMessage(want)) {
					t.Errorf("%s = %s, want %s", name, got[name], want)
				}
			}
			for _, name := range tc.wantNoneOf {
				if v, ok := got[name]; ok {
					t.Errorf("the provider received %s = %s, want it translated", name, v)
				}
			}
		})
	}
}

func TestAMemberARouteCannotReceiveIsA400NamingItBeforeAnyGroupRuns(t *testing.T) {
	openAI, anthropic := schemas.DialectOpenAI, schemas.DialectAnthropic
	for _, tc := range []struct {
		name   string
		a, b   schemas.Dialect
		path   string
		member string // appended to the body
		param  string
	}{
		{"logit_bias to Anthropic routes", anthropic, anthropic, "/v1/chat/completions", `"logit_bias":{"1":2}`, "logit_bias"},
		{"logprobs to Anthropic routes", anthropic, anthropic, "/v1/chat/completions", `"logprobs":true,"top_logprobs":2`, "logprobs"},
		{"reasoning_effort to Anthropic routes", anthropic, anthropic, "/v1/chat/completions", `"reasoning_effort":"high"`, "reasoning_effort"},
		{"OpenAI metadata to Anthropic routes", anthropic, anthropic, "/v1/chat/completions", `"metadata":{"k":"v"}`, "metadata"},
		{"service_tier to Anthropic routes", anthropic, anthropic, "/v1/chat/completions", `"service_tier":"flex"`, "service_tier"},
		{"store to Anthropic routes", anthropic, anthropic, "/v1/chat/completions", `"store":true`, "store"},
		{"an unknown member to Anthropic routes", anthropic, anthropic, "/v1/chat/completions", `"x_vendor":1`, "x_vendor"},
		{"seed to Anthropic routes", anthropic, anthropic, "/v1/chat/completions", `"seed":3`, "seed"},
		{"presence_penalty to Anthropic routes", anthropic, anthropic, "/v1/chat/completions", `"presence_penalty":0.5`, "presence_penalty"},
		{"a JSON response_format to Anthropic routes", anthropic, anthropic, "/v1/chat/completions", `"response_format":{"type":"json_object"}`, "response_format"},
		{"temperature above 1 to Anthropic routes", anthropic, anthropic, "/v1/chat/completions", `"temperature":1.5`, "temperature"},
		{"logit_bias to a pool with one Anthropic route", openAI, anthropic, "/v1/chat/completions", `"logit_bias":{"1":2}`, "logit_bias"},
		{"top_k to OpenAI routes", openAI, openAI, "/v1/messages", `"top_k":5`, "top_k"},
		{"thinking to OpenAI routes", openAI, openAI, "/v1/messages", `"thinking":{"type":"enabled","budget_tokens":1024}`, "thinking"},
		{"Anthropic service_tier to OpenAI routes", openAI, openAI, "/v1/messages", `"service_tier":"auto"`, "service_tier"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, _, ps := dialectCluster(t, tc.a, tc.b)
			body := frontdoortest.ChatBody(false, tc.member)
			if tc.path == "/v1/messages" {
				body = frontdoortest.MessagesBody(false, tc.member)
			}
			resp, raw := frontdoortest.Do(t, http.MethodPost, srv.URL+tc.path, body, map[string]string{"Anthropic-Version": "2023-06-01"})
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", resp.StatusCode, raw)
			}
			if tc.path == "/v1/messages" {
				if typ := frontdoortest.AnthropicErrorType(t, raw); typ != "invalid_request_error" || !strings.Contains(string(raw), "'"+tc.param+"'") {
					t.Errorf("error %s, want an invalid_request_error naming '%s'", raw, tc.param)
				}
			} else if typ, _, param := openAIError(t, raw); typ != "invalid_request_error" || param != tc.param {
				t.Errorf("error type %q param %q, want invalid_request_error naming %s: %s", typ, param, tc.param, raw)
			}
			if strings.Contains(string(raw), prompt) {
				t.Errorf("error %s echoes the prompt", raw)
			}
			for route, p := range ps {
				if n := len(p.Arrived()); n != 0 {
					t.Errorf("route %s received %d requests, want none", route, n)
				}
			}
		})
	}
}
