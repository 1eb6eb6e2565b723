package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// These tests point the official Anthropic Go SDK at a whole hedgerow —
// serve's embedded NATS, gateway and workers — whose routes speak the
// Messages API to simulated providers, as a developer switching a Claude
// client over would.

// claudeKey is the API key of tenant "acme" in startClaudeServe's config.
const claudeKey = "sk-ant-hedgerow-test-acme"

// fakeServer serves simulator route n playing m behind httptest, with the
// rest of its settings from cfg (a model second is a real millisecond unless
// cfg says otherwise), and returns its root URL, as Anthropic's SDKs take a
// base URL.
func fakeServer(t *testing.T, n int, m *workload.Model, cfg fakellm.Options) string {
	t.Helper()
	cfg.Model, cfg.Seed, cfg.Route = m, 7, n
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 0.001
	}
	fake, err := fakellm.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(fake)
	t.Cleanup(func() {
		fake.Close()
		srv.Close()
	})
	return srv.URL
}

// exhaustedRoute is a simulator route whose one-request-a-minute bucket is
// already spent and never refills (its clock stands still), so it answers
// every request 429 with a Retry-After of a minute of model time: six real
// seconds at its time scale, longer than any test here.
func exhaustedRoute(t *testing.T, n int) string {
	t.Helper()
	frozen := time.Unix(1_700_000_000, 0)
	url := fakeServer(t, n, calmModel(t), fakellm.Options{
		TimeScale: 0.1, RateLimit: workload.RateLimit{RPM: 1}, Now: func() time.Time { return frozen },
	})
	req, err := http.NewRequest(http.MethodPost, url+"/v1/messages",
		strings.NewReader(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"spend the bucket"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if status, body := do(t, req); status != http.StatusOK {
		t.Fatalf("spending the bucket: %d %s", status, body)
	}
	return url
}

// startClaudeServe runs serve over pools of simulated Anthropic routes:
// "claude" answers; "mixed" has one OpenAI-compatible and one Anthropic
// route; "broken" fails every attempt; "stuck" never answers; "limited"
// answers 429. Tenant acme holds claudeKey; its class "metered" may reserve
// 100 units an hour. It returns the gateway's base URL.
func startClaudeServe(t *testing.T) string {
	t.Helper()
	calm := calmModel(t)
	broken := calmModel(t)
	broken.ErrorFraction = 1
	broken.ErrorAfterMin, broken.ErrorAfterMax = time.Millisecond, time.Millisecond
	stuck := calmModel(t)
	stuck.TTFT = workload.TTFT{HangFraction: 1}
	type route struct{ provider, url string }
	routes := map[string]route{
		"claude-a": {"anthropic", fakeServer(t, 0, calm, fakellm.Options{})},
		"claude-b": {"anthropic", fakeServer(t, 1, calm, fakellm.Options{})},
		"mixed-a":  {"openai", fakeServer(t, 0, calm, fakellm.Options{}) + "/v1"},
		"mixed-b":  {"anthropic", fakeServer(t, 1, calm, fakellm.Options{})},
		"broken-a": {"anthropic", fakeServer(t, 0, broken, fakellm.Options{})},
		"broken-b": {"anthropic", fakeServer(t, 1, broken, fakellm.Options{})},
		// Ten model hours of hang cap: far beyond any test's deadline.
		"stuck-a":   {"anthropic", fakeServer(t, 0, stuck, fakellm.Options{HangCap: 10 * time.Hour})},
		"stuck-b":   {"anthropic", fakeServer(t, 1, stuck, fakellm.Options{HangCap: 10 * time.Hour})},
		"limited-a": {"anthropic", exhaustedRoute(t, 0)},
		"limited-b": {"anthropic", exhaustedRoute(t, 1)},
	}
	var y strings.Builder
	y.WriteString("http:\n  listen: 127.0.0.1:0\nroutes:\n")
	for _, name := range slices.Sorted(maps.Keys(routes)) {
		r := routes[name]
		fmt.Fprintf(&y, "  - {name: %s, provider: %s, base_url: %q, model: claude-m, labels: {region: %s}}\n",
			name, r.provider, r.url, name[len(name)-1:])
	}
	fmt.Fprintf(&y, `pools:
  claude: {routes: [claude-a, claude-b], models: [claude-3.5-sonnet]}
  mixed: {routes: [mixed-a, mixed-b]}
  broken: {routes: [broken-a, broken-b]}
  stuck: {routes: [stuck-a, stuck-b]}
  limited: {routes: [limited-a, limited-b]}
policies:
  default: {control_fraction: 0, deadline: 5s, heartbeat_interval: 50ms}
  metered: {control_fraction: 0, deadline: 5s, heartbeat_interval: 50ms, spend: {per_tenant_window: 100, window: 1h}}
tenants:
  acme: {api_key_hashes: [%q]}
`, config.HashAPIKey(claudeKey))
	return serveYAML(t, "claude.yaml", y.String())
}

// claudeClient is the official Anthropic client against base with key,
// retrying nothing, reading nothing from the environment, on a transport
// whose connections are closed when the test ends.
func claudeClient(t *testing.T, base, key string) anthropic.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return anthropic.NewClient(
		option.WithoutEnvironmentDefaults(),
		option.WithBaseURL(base),
		option.WithAPIKey(key),
		option.WithMaxRetries(0),
		option.WithHTTPClient(&http.Client{Transport: tr, Timeout: wait}),
	)
}

func claudeQuestion(pool string) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     anthropic.Model(pool),
		MaxTokens: 100,
		System:    []anthropic.TextBlockParam{{Text: "Answer briefly."}},
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("What is a hedgerow?"))},
	}
}

func TestAnthropicSDKMessageThroughTheGateway(t *testing.T) {
	client := claudeClient(t, startClaudeServe(t), claudeKey)
	var raw *http.Response
	msg, err := client.Messages.New(context.Background(), claudeQuestion("claude"),
		option.WithHeader(frontdoor.HeaderIdempotencyKey, "claude-action-1"), option.WithResponseInto(&raw))
	if err != nil {
		t.Fatalf("Messages.New: %v", err)
	}
	if !strings.HasPrefix(msg.ID, "msg_") || msg.Role != "assistant" || msg.Model != "claude" || msg.StopReason != anthropic.StopReasonEndTurn {
		t.Fatalf("message %s", msg.RawJSON())
	}
	if len(msg.Content) != 1 || msg.Content[0].Type != "text" || msg.Content[0].Text == "" {
		t.Fatalf("content %s", msg.RawJSON())
	}
	// The simulator answers one word per token.
	if words := len(strings.Fields(msg.Content[0].Text)); msg.Usage.OutputTokens != int64(words) || msg.Usage.InputTokens <= 0 {
		t.Fatalf("usage %+v for an answer of %d words", msg.Usage, words)
	}
	if r := raw.Header.Get(frontdoor.HeaderWinnerRoute); r != "claude-a" && r != "claude-b" {
		t.Errorf("%s = %q, want a route of the pool", frontdoor.HeaderWinnerRoute, r)
	}
	if raw.Header.Get(frontdoor.HeaderGate) == "" || raw.Header.Get(frontdoor.HeaderAttempts) == "" {
		t.Errorf("hedge headers %v", raw.Header)
	}
	// The SDK's request id is the group's, which names the message too.
	if id := raw.Header.Get("request-id"); "msg_"+id != msg.ID || raw.Header.Get("x-request-id") != id {
		t.Errorf("request-id %q, x-request-id %q; want the group id of %s", id, raw.Header.Get("x-request-id"), msg.ID)
	}
}

func TestAnthropicSDKStreamAccumulatesTheMessageAndItsUsage(t *testing.T) {
	client := claudeClient(t, startClaudeServe(t), claudeKey)
	want, err := client.Messages.New(context.Background(), claudeQuestion("claude"))
	if err != nil {
		t.Fatalf("Messages.New: %v", err)
	}
	var raw *http.Response
	stream := client.Messages.NewStreaming(context.Background(), claudeQuestion("claude"), option.WithResponseInto(&raw))
	defer stream.Close()
	var acc anthropic.Message
	var text strings.Builder
	events := 0
	var startInput int64
	for stream.Next() {
		ev := stream.Current()
		if err := acc.Accumulate(ev); err != nil {
			t.Fatalf("Accumulate %s: %v", ev.Type, err)
		}
		switch ev.Type {
		case "content_block_delta":
			text.WriteString(ev.Delta.Text)
		case "message_start":
			// The prompt's input, estimated until the winner's count ends
			// the stream: never zero, as a provider's message_start is not.
			startInput = ev.Message.Usage.InputTokens
		}
		events++
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if raw == nil || raw.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("response %v", raw)
	}
	// The same conversation draws the same answer, streamed or not.
	if len(acc.Content) != 1 || acc.Content[0].Text != want.Content[0].Text || acc.Content[0].Text != text.String() ||
		acc.StopReason != anthropic.StopReasonEndTurn || !strings.HasPrefix(acc.ID, "msg_") || acc.Model != "claude" {
		t.Fatalf("accumulated %s from %d events; the non-streaming answer was %q", acc.RawJSON(), events, want.Content[0].Text)
	}
	if acc.Usage.OutputTokens != want.Usage.OutputTokens || acc.Usage.InputTokens != want.Usage.InputTokens {
		t.Fatalf("accumulated usage %+v, want the message's %+v", acc.Usage, want.Usage)
	}
	if startInput <= 0 {
		t.Errorf("message_start reported %d input tokens, want the prompt's estimate", startInput)
	}
}

func TestAnthropicSDKMaxTokensStopsWithMaxTokens(t *testing.T) {
	client := claudeClient(t, startClaudeServe(t), claudeKey)
	params := claudeQuestion("claude")
	params.MaxTokens = 3
	msg, err := client.Messages.New(context.Background(), params)
	if err != nil {
		t.Fatalf("Messages.New: %v", err)
	}
	if msg.StopReason != anthropic.StopReasonMaxTokens || msg.Usage.OutputTokens != 3 || len(strings.Fields(msg.Content[0].Text)) != 3 {
		t.Fatalf("message %s, want three tokens cut at max_tokens", msg.RawJSON())
	}
}

func TestAnthropicSDKGetsTheSameAnswerFromOpenAIAndAnthropicRoutes(t *testing.T) {
	// Pool "mixed" hedges over an OpenAI-compatible and an Anthropic route;
	// both adapters translate the conversation so the simulator draws the
	// same answer for it, whichever route wins.
	client := claudeClient(t, startClaudeServe(t), claudeKey)
	want, err := client.Messages.New(context.Background(), claudeQuestion("claude"))
	if err != nil {
		t.Fatalf("claude: %v", err)
	}
	winners := map[string]bool{}
	for i := range 8 {
		var raw *http.Response
		got, err := client.Messages.New(context.Background(), claudeQuestion("mixed"), option.WithResponseInto(&raw))
		if err != nil {
			t.Fatalf("mixed request %d: %v", i, err)
		}
		winners[raw.Header.Get(frontdoor.HeaderWinnerRoute)] = true
		if got.Content[0].Text != want.Content[0].Text || got.Usage.InputTokens != want.Usage.InputTokens ||
			got.Usage.OutputTokens != want.Usage.OutputTokens || got.StopReason != want.StopReason {
			t.Fatalf("mixed request %d won on %s: %s, want %s", i, raw.Header.Get(frontdoor.HeaderWinnerRoute), got.RawJSON(), want.RawJSON())
		}
	}
	t.Logf("winning routes: %v", slices.Sorted(maps.Keys(winners)))
}

func TestAnthropicSDKErrorsAreTypedAnthropicErrors(t *testing.T) {
	base := startClaudeServe(t)
	ctx := context.Background()
	call := func(key string, params anthropic.MessageNewParams, opts ...option.RequestOption) error {
		client := claudeClient(t, base, key)
		_, err := client.Messages.New(ctx, params, opts...)
		return err
	}
	stream := func(key string, params anthropic.MessageNewParams, opts ...option.RequestOption) error {
		client := claudeClient(t, base, key)
		s := client.Messages.NewStreaming(ctx, params, opts...)
		defer s.Close()
		for s.Next() {
		}
		return s.Err()
	}
	with := func(f func(*anthropic.MessageNewParams)) anthropic.MessageNewParams {
		p := claudeQuestion("claude")
		f(&p)
		return p
	}
	tests := []struct {
		name   string
		call   func() error
		status int
		typ    string
	}{
		{"an empty stop sequence", func() error {
			return call(claudeKey, with(func(p *anthropic.MessageNewParams) { p.StopSequences = []string{""} }))
		}, 400, "invalid_request_error"},
		{"max_tokens of zero", func() error {
			return call(claudeKey, with(func(p *anthropic.MessageNewParams) { p.MaxTokens = 0 }))
		}, 400, "invalid_request_error"},
		{"an unknown API key", func() error { return call("sk-ant-someone-else", claudeQuestion("claude")) }, 401, "authentication_error"},
		{"an unknown model", func() error { return call(claudeKey, claudeQuestion("claude-nope")) }, 404, "not_found_error"},
		{"the tenant's spend window refusing the request", func() error {
			return call(claudeKey, with(func(p *anthropic.MessageNewParams) { p.MaxTokens = 500 }),
				option.WithHeader(frontdoor.HeaderOperation, "metered"))
		}, 429, "rate_limit_error"},
		{"every route failing", func() error { return call(claudeKey, claudeQuestion("broken")) }, 503, "api_error"},
		{"a deadline passing", func() error {
			return call(claudeKey, claudeQuestion("stuck"), option.WithHeader(frontdoor.HeaderDeadlineMs, "300"))
		}, 504, "timeout_error"},
		{"a stream whose deadline passes before its first byte", func() error {
			return stream(claudeKey, claudeQuestion("stuck"), option.WithHeader(frontdoor.HeaderDeadlineMs, "300"))
		}, 504, "timeout_error"},
		// Both limited routes answer 429 with a long Retry-After: the first
		// request fails rate limited, and pauses both routes...
		{"every route asking for less load", func() error { return call(claudeKey, claudeQuestion("limited")) }, 429, "rate_limit_error"},
		// ...so the next finds no route to send to: overloaded.
		{"no route that is not paused", func() error { return call(claudeKey, claudeQuestion("limited")) }, 529, "overloaded_error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var apiErr *anthropic.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("error %v (%T), want an *anthropic.Error", err, err)
			}
			if apiErr.StatusCode != tc.status || string(apiErr.Type()) != tc.typ || apiErr.Message == "" {
				t.Fatalf("error %d type %q message %q, want %d %q", apiErr.StatusCode, apiErr.Type(), apiErr.Message, tc.status, tc.typ)
			}
			if strings.Contains(apiErr.RawJSON(), "hedgerow?") {
				t.Errorf("error body %s echoes the prompt", apiErr.RawJSON())
			}
		})
	}
}

func TestAnthropicSDKClientKeepsItsModelNameThroughAnAlias(t *testing.T) {
	client := claudeClient(t, startClaudeServe(t), claudeKey)
	var raw *http.Response
	msg, err := client.Messages.New(context.Background(), claudeQuestion("claude-3.5-sonnet"), option.WithResponseInto(&raw))
	if err != nil {
		t.Fatalf("message through the alias: %v", err)
	}
	if string(msg.Model) != "claude-3.5-sonnet" || len(msg.Content) == 0 || msg.Content[0].Text == "" {
		t.Fatalf("message %+v, want an answer naming the model sent", msg)
	}
	if r := raw.Header.Get(frontdoor.HeaderWinnerRoute); r != "claude-a" && r != "claude-b" {
		t.Errorf("%s = %q, want a route of the pool claude", frontdoor.HeaderWinnerRoute, r)
	}
}
