package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// These tests point the official OpenAI Go SDK at a whole hedgerow — serve's
// embedded NATS, gateway and workers — in front of simulated providers, as a
// developer switching an existing client over would.

// sdkKey is the API key of tenant "acme" in sdkConfig.
const sdkKey = "sk-hedgerow-test-acme"

// sdkBodyLimit is small enough that a test can exceed it cheaply.
const sdkBodyLimit = 64 << 10

// simulatedRoute serves simulator route n playing m behind httptest, a model
// second lasting a real millisecond, and returns its base URL.
func simulatedRoute(t *testing.T, n int, m *workload.Model, hangCap time.Duration) string {
	t.Helper()
	return fakeServer(t, n, m, fakellm.Options{HangCap: hangCap}) + "/v1"
}

// startSDKServe runs serve over three pools of two simulated routes each:
// "general" answers, "broken" answers every attempt with a server error,
// "stuck" never answers. Tenant acme holds sdkKey; its class "metered" lets
// it reserve 100 units an hour. It returns the gateway's base URL.
func startSDKServe(t *testing.T) string {
	t.Helper()
	calm := calmModel(t)
	broken := calmModel(t)
	broken.ErrorFraction = 1
	broken.ErrorAfterMin, broken.ErrorAfterMax = time.Millisecond, time.Millisecond
	stuck := calmModel(t)
	stuck.TTFT = workload.TTFT{HangFraction: 1}
	urls := map[string]string{
		"calm-a": simulatedRoute(t, 0, calm, 0), "calm-b": simulatedRoute(t, 1, calm, 0),
		"broken-a": simulatedRoute(t, 0, broken, 0), "broken-b": simulatedRoute(t, 1, broken, 0),
		// A hung attempt would be answered 504 after the hang cap in model
		// time: ten model hours, far beyond any test's deadline.
		"stuck-a": simulatedRoute(t, 0, stuck, 10*time.Hour), "stuck-b": simulatedRoute(t, 1, stuck, 10*time.Hour),
	}
	var routes strings.Builder
	for _, name := range slices.Sorted(maps.Keys(urls)) {
		region := name[len(name)-1:]
		fmt.Fprintf(&routes, "  - {name: %s, provider: openai, base_url: %q, model: m, labels: {region: %s}}\n", name, urls[name], region)
	}
	y := fmt.Sprintf(`http:
  listen: 127.0.0.1:0
  body_limit: %d
routes:
%spools:
  general: {routes: [calm-a, calm-b], models: [gpt-4o, gpt-4o-2024-08-06]}
  broken: {routes: [broken-a, broken-b]}
  stuck: {routes: [stuck-a, stuck-b]}
policies:
  default: {control_fraction: 0, deadline: 5s, heartbeat_interval: 50ms}
  exclusive: {control_fraction: 0, deadline: 5s, heartbeat_interval: 50ms, hedge: false, max_attempts: 4}
  metered: {control_fraction: 0, deadline: 5s, heartbeat_interval: 50ms, spend: {per_tenant_window: 100, window: 1h}}
tenants:
  acme: {api_key_hashes: [%q]}
`, sdkBodyLimit, routes.String(), config.HashAPIKey(sdkKey))
	return serveYAML(t, "sdk.yaml", y)
}

// sdkClient is the official client against base with key, retrying nothing,
// on a transport whose connections are closed when the test ends.
func sdkClient(t *testing.T, base, key string) openai.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return openai.NewClient(
		option.WithBaseURL(base+"/v1/"),
		option.WithAPIKey(key),
		option.WithMaxRetries(0),
		option.WithHTTPClient(&http.Client{Transport: tr, Timeout: wait}),
	)
}

func question(model string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     model,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is a hedgerow?")},
		MaxTokens: openai.Int(50),
	}
}

// checkHedgeHeaders checks the response says how its answer was won.
func checkHedgeHeaders(t *testing.T, h http.Header) {
	t.Helper()
	if a := h.Get(frontdoor.HeaderAttempts); a == "" || a == "0" {
		t.Errorf("%s = %q", frontdoor.HeaderAttempts, a)
	}
	if r := h.Get(frontdoor.HeaderWinnerRoute); r != "calm-a" && r != "calm-b" {
		t.Errorf("%s = %q, want a route of the pool", frontdoor.HeaderWinnerRoute, r)
	}
	if v := h.Get(frontdoor.HeaderHedged); v != "true" && v != "false" {
		t.Errorf("%s = %q", frontdoor.HeaderHedged, v)
	}
	if h.Get(frontdoor.HeaderGate) == "" {
		t.Errorf("no %s", frontdoor.HeaderGate)
	}
}

func TestSDKChatCompletionThroughTheGateway(t *testing.T) {
	client := sdkClient(t, startSDKServe(t), sdkKey)
	var raw *http.Response
	cc, err := client.Chat.Completions.New(context.Background(), question("general"),
		option.WithHeader(frontdoor.HeaderIdempotencyKey, "sdk-action-1"), option.WithResponseInto(&raw))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if cc.Object != "chat.completion" || !strings.HasPrefix(cc.ID, "chatcmpl-") || cc.Model != "general" || cc.Created == 0 {
		t.Fatalf("completion %s", cc.RawJSON())
	}
	if len(cc.Choices) != 1 || cc.Choices[0].Message.Content == "" || cc.Choices[0].FinishReason != "stop" ||
		cc.Choices[0].Message.Role != "assistant" {
		t.Fatalf("choices %s", cc.RawJSON())
	}
	u := cc.Usage
	if u.PromptTokens <= 0 || u.CompletionTokens <= 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Fatalf("usage %+v", u)
	}
	checkHedgeHeaders(t, raw.Header)
}

func TestSDKStreamAccumulatesTheCompletionAndItsUsage(t *testing.T) {
	client := sdkClient(t, startSDKServe(t), sdkKey)
	params := question("general")
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	var raw *http.Response
	stream := client.Chat.Completions.NewStreaming(context.Background(), params, option.WithResponseInto(&raw))
	defer stream.Close()
	var acc openai.ChatCompletionAccumulator
	var deltas strings.Builder
	chunks := 0
	for stream.Next() {
		chunk := stream.Current()
		if !acc.AddChunk(chunk) {
			t.Fatalf("the accumulator refused chunk %d: %s", chunks, chunk.RawJSON())
		}
		if len(chunk.Choices) > 0 {
			deltas.WriteString(chunk.Choices[0].Delta.Content)
		}
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" || acc.Choices[0].Message.Content != deltas.String() ||
		acc.Choices[0].FinishReason != "stop" {
		t.Fatalf("accumulated %+v from %d chunks, deltas %q", acc.Choices, chunks, deltas.String())
	}
	if acc.ID == "" || acc.Model != "general" {
		t.Fatalf("accumulated id %q model %q", acc.ID, acc.Model)
	}
	u := acc.Usage
	if u.PromptTokens <= 0 || u.CompletionTokens <= 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Fatalf("usage %+v: include_usage asked for it", u)
	}
	if raw == nil {
		t.Fatal("no HTTP response recorded")
	}
	if raw.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("content type %q", raw.Header.Get("Content-Type"))
	}
	checkHedgeHeaders(t, raw.Header)
}

// A retry of a committed user action gets the committed completion back,
// marked replayed (docs/architecture.md §2).
func TestSDKRetryOfACommittedActionIsReplayed(t *testing.T) {
	client := sdkClient(t, startSDKServe(t), sdkKey)
	key := option.WithHeader(frontdoor.HeaderIdempotencyKey, "sdk-action-replayed")
	var first, again *http.Response
	cc, err := client.Chat.Completions.New(context.Background(), question("general"), key, option.WithResponseInto(&first))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	replayed, err := client.Chat.Completions.New(context.Background(), question("general"), key, option.WithResponseInto(&again))
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if replayed.RawJSON() != cc.RawJSON() || again.Header.Get(frontdoor.HeaderIdempotentReplayed) != "true" ||
		first.Header.Get(frontdoor.HeaderIdempotentReplayed) != "" || again.Header.Get(frontdoor.HeaderGate) != first.Header.Get(frontdoor.HeaderGate) {
		t.Fatalf("retry %s (replayed %q), first %s", replayed.RawJSON(), again.Header.Get(frontdoor.HeaderIdempotentReplayed), cc.RawJSON())
	}
}

func TestSDKErrorsAreTypedOpenAIErrors(t *testing.T) {
	base := startSDKServe(t)
	ctx := context.Background()
	chat := func(key string, params openai.ChatCompletionNewParams, opts ...option.RequestOption) error {
		client := sdkClient(t, base, key)
		_, err := client.Chat.Completions.New(ctx, params, opts...)
		return err
	}
	stream := func(key string, params openai.ChatCompletionNewParams, opts ...option.RequestOption) error {
		client := sdkClient(t, base, key)
		s := client.Chat.Completions.NewStreaming(ctx, params, opts...)
		defer s.Close()
		for s.Next() {
		}
		return s.Err()
	}
	with := func(f func(*openai.ChatCompletionNewParams)) openai.ChatCompletionNewParams {
		p := question("general")
		f(&p)
		return p
	}
	tests := []struct {
		name        string
		call        func() error
		status      int
		typ, code   string
		param       string
		wantHeaders map[string]string // "" as a value: present, any value
	}{
		{name: "more than one choice", call: func() error {
			return chat(sdkKey, with(func(p *openai.ChatCompletionNewParams) { p.N = openai.Int(2) }))
		}, status: 400, typ: "invalid_request_error", code: "invalid_value", param: "n"},
		{name: "a temperature out of range", call: func() error {
			return chat(sdkKey, with(func(p *openai.ChatCompletionNewParams) { p.Temperature = openai.Float(3) }))
		}, status: 400, typ: "invalid_request_error", code: "invalid_value", param: "temperature"},
		{name: "a response schema that does not compile", call: func() error {
			return chat(sdkKey, with(func(p *openai.ChatCompletionNewParams) {
				p.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &openai.ResponseFormatJSONSchemaParam{
					JSONSchema: openai.ResponseFormatJSONSchemaJSONSchemaParam{Name: "answer", Schema: map[string]any{"type": "objekt"}}}}
			}))
		}, status: 400, typ: "invalid_request_error", code: "invalid_value", param: "response_format.json_schema.schema"},
		{name: "an unknown operation class", call: func() error {
			return chat(sdkKey, question("general"), option.WithHeader(frontdoor.HeaderOperation, "nightly"))
		}, status: 400, typ: "invalid_request_error", code: "invalid_value", param: frontdoor.HeaderOperation},
		{name: "a deadline header that is no number", call: func() error {
			return chat(sdkKey, question("general"), option.WithHeader(frontdoor.HeaderDeadlineMs, "soon"))
		}, status: 400, typ: "invalid_request_error", code: "invalid_value", param: frontdoor.HeaderDeadlineMs},
		{name: "an unknown API key", call: func() error { return chat("sk-someone-else", question("general")) },
			status: 401, typ: "authentication_error", code: "invalid_api_key", wantHeaders: map[string]string{"WWW-Authenticate": ""}},
		{name: "an unknown model", call: func() error { return chat(sdkKey, question("gpt-nope")) },
			status: 404, typ: "invalid_request_error", code: "model_not_found", param: "model"},
		{name: "a wrong method", call: func() error {
			var out map[string]any
			client := sdkClient(t, base, sdkKey)
			return client.Get(ctx, "chat/completions", nil, &out)
		}, status: 405, typ: "invalid_request_error", code: "method_not_allowed", wantHeaders: map[string]string{"Allow": http.MethodPost}},
		{name: "an Idempotency-Key reused with another request", call: func() error {
			key := option.WithHeader(frontdoor.HeaderIdempotencyKey, "sdk-action-409")
			if err := chat(sdkKey, question("general"), key); err != nil {
				return fmt.Errorf("the first request of the action failed: %w", err)
			}
			return chat(sdkKey, question("gpt-4o"), key)
		}, status: 409, typ: "invalid_request_error", code: "idempotency_key_reused", param: frontdoor.HeaderIdempotencyKey,
			wantHeaders: map[string]string{"X-Should-Retry": "false"}},
		{name: "a body over the limit", call: func() error {
			return chat(sdkKey, with(func(p *openai.ChatCompletionNewParams) {
				p.Messages = []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("hedge ", sdkBodyLimit/4))}
			}))
		}, status: 413, typ: "invalid_request_error", code: "request_too_large"},
		{name: "the tenant's spend window refusing the request", call: func() error {
			return chat(sdkKey, with(func(p *openai.ChatCompletionNewParams) { p.MaxTokens = openai.Int(500) }),
				option.WithHeader(frontdoor.HeaderOperation, "metered"))
		}, status: 429, typ: "insufficient_quota", code: "budget_exhausted", wantHeaders: map[string]string{"Retry-After": ""}},
		{name: "every route failing", call: func() error { return chat(sdkKey, question("broken")) },
			status: 503, typ: "server_error", code: "all_routes_failed"},
		{name: "a deadline passing", call: func() error {
			return chat(sdkKey, question("stuck"), option.WithHeader(frontdoor.HeaderDeadlineMs, "300"))
		}, status: 504, typ: "timeout_error", code: "deadline_exceeded"},
		{name: "a stream whose deadline passes before its first byte", call: func() error {
			return stream(sdkKey, question("stuck"), option.WithHeader(frontdoor.HeaderDeadlineMs, "300"))
		}, status: 504, typ: "timeout_error", code: "deadline_exceeded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("error %v (%T), want an *openai.Error", err, err)
			}
			if apiErr.StatusCode != tc.status || apiErr.Type != tc.typ || apiErr.Code != tc.code || apiErr.Param != tc.param || apiErr.Message == "" {
				t.Fatalf("error %d type %q code %q param %q message %q, want %d %q %q %q", apiErr.StatusCode, apiErr.Type, apiErr.Code,
					apiErr.Param, apiErr.Message, tc.status, tc.typ, tc.code, tc.param)
			}
			for k, v := range tc.wantHeaders {
				if got := apiErr.Response.Header.Get(k); got == "" || v != "" && got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
		})
	}
}

func TestSDKClientKeepsItsModelNameThroughAnAlias(t *testing.T) {
	client := sdkClient(t, startSDKServe(t), sdkKey)
	var raw *http.Response
	cc, err := client.Chat.Completions.New(context.Background(), question("gpt-4o"), option.WithResponseInto(&raw))
	if err != nil {
		t.Fatalf("completion through the alias: %v", err)
	}
	if cc.Model != "gpt-4o" || len(cc.Choices) != 1 || cc.Choices[0].Message.Content == "" {
		t.Fatalf("completion %+v, want an answer naming the model sent", cc)
	}
	checkHedgeHeaders(t, raw.Header) // answered by the pool general's routes
	models := client.Models.ListAutoPaging(context.Background())
	var names []string
	for models.Next() {
		names = append(names, models.Current().ID)
	}
	if err := models.Err(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"general", "gpt-4o", "gpt-4o-2024-08-06"} {
		if !slices.Contains(names, want) {
			t.Errorf("models %v lack %q", names, want)
		}
	}
}

// serveYAML runs serve on the configuration text y (named name in its
// errors), with no environment, until the test ends, and returns its base URL.
func serveYAML(t *testing.T, name, y string) string {
	t.Helper()
	cfg, err := config.Parse(name, []byte(y), config.RoleServe, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("config: %v\n%s", err, y)
	}
	s, err := StartServe(cfg, Options{})
	if err != nil {
		t.Fatalf("StartServe: %v", err)
	}
	t.Cleanup(func() { stop(t, s) })
	return "http://" + s.HTTPAddr().String()
}
