package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/schemas"
)

// messagesProvider is a test server that serves POST /v1/messages with h
// and answers 404 elsewhere, counting the requests it received.
type messagesProvider struct {
	*httptest.Server
	requests atomic.Int32
}

func newMessagesProvider(t *testing.T, h http.HandlerFunc) *messagesProvider {
	t.Helper()
	p := &messagesProvider{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.requests.Add(1)
		if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
			http.NotFound(w, r)
			return
		}
		h(w, r)
	}))
	t.Cleanup(p.Close)
	return p
}

// newAnthropicAdapter returns an adapter for p with the route model
// "route-model-2024", the API root as Anthropic's SDKs take it, and key.
func newAnthropicAdapter(t *testing.T, p *messagesProvider, key string) *Anthropic {
	t.Helper()
	a, err := NewAnthropic(AnthropicOptions{Options: Options{BaseURL: p.URL, Model: "route-model-2024", APIKey: key, Now: func() time.Time { return fixedNow }}})
	if err != nil {
		t.Fatalf("NewAnthropic: %v", err)
	}
	t.Cleanup(a.CloseIdleConnections)
	return a
}

func TestAnthropicStreamDeliversTextDeltasWithTheReportedUsage(t *testing.T) {
	p := newMessagesProvider(t, replay(answer{body: fixture(t, "anthropic_stream_text.sse")}))
	var rec recorder

	out, err := newAnthropicAdapter(t, p, "").Stream(context.Background(), hello(), &rec)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	if rec.firstBytes != 1 {
		t.Errorf("FirstByte called %d times, want 1", rec.firstBytes)
	}
	wantDeltas := []Delta{{Content: "Hello", Tokens: 1}, {Content: " there", Tokens: 1}, {Content: "!", Tokens: 1}}
	if !reflect.DeepEqual(rec.deltas, wantDeltas) {
		t.Errorf("deltas = %+v, want %+v", rec.deltas, wantDeltas)
	}
	// input_tokens from message_start, cumulative output_tokens from
	// message_delta (4, not the 3 deltas counted).
	want := Outcome{FinishReason: "stop", Usage: schemas.Usage{InputUnits: 25, OutputUnits: 4}, Content: "Hello there!", WellFormed: true}
	if out.MaxTokenGap <= 0 {
		t.Error("no gap measured between the stream's three tokens")
	}
	out.MaxTokenGap = 0 // a timing: TestTheOutcomeCarriesTheLongestGapBetweenTokensAfterTheFirst checks it
	if !reflect.DeepEqual(out, want) {
		t.Errorf("outcome = %+v, want %+v", out, want)
	}
}

func TestAnthropicStopReasonsMapToCanonicalFinishReasons(t *testing.T) {
	for _, tc := range []struct {
		fixture, want string
	}{
		{"anthropic_stream_text.sse", "stop"},          // end_turn
		{"anthropic_stream_stop_sequence.sse", "stop"}, // stop_sequence
		{"anthropic_stream_max_tokens.sse", "length"},  // max_tokens
		{"anthropic_stream_tool_use.sse", "tool_calls"},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			p := newMessagesProvider(t, replay(answer{body: fixture(t, tc.fixture)}))
			out, err := newAnthropicAdapter(t, p, "").Stream(context.Background(), hello(), nil)
			if err != nil {
				t.Fatalf("Stream: %v", err)
			}
			if out.FinishReason != tc.want || !out.WellFormed || out.Usage.Estimated {
				t.Errorf("outcome = %+v, want finish %q, well-formed, reported usage", out, tc.want)
			}
		})
	}
	for stop, want := range map[string]string{
		"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
		"refusal": "content_filter", "model_context_window_exceeded": "length", "pause_turn": "pause_turn",
	} {
		if got := FinishReason(stop); got != want {
			t.Errorf("FinishReason(%q) = %q, want %q", stop, got, want)
		}
	}
}

func TestAnthropicToolUseBlocksBecomeOpenAIToolCallDeltas(t *testing.T) {
	p := newMessagesProvider(t, replay(answer{body: fixture(t, "anthropic_stream_tool_use.sse")}))
	var rec recorder

	out, err := newAnthropicAdapter(t, p, "").Stream(context.Background(), hello(), &rec)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	// text, get_weather's start and two argument fragments (the empty one
	// carries nothing), get_time's start and its "{}" completion.
	want := []struct {
		content, calls string
		tokens         int
	}{
		{"Checking the weather.", "", 1},
		{"", `[{"index":0,"id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","type":"function","function":{"name":"get_weather","arguments":""}}]`, 1},
		{"", `[{"index":0,"function":{"arguments":"{\"location\":"}}]`, 1},
		{"", `[{"index":0,"function":{"arguments":" \"Paris\"}"}}]`, 1},
		{"", `[{"index":1,"id":"toolu_01Vb2kLmN3pQr4sTuV5wXy6Z","type":"function","function":{"name":"get_time","arguments":""}}]`, 1},
		{"", `[{"index":1,"function":{"arguments":"{}"}}]`, 0},
	}
	if len(rec.deltas) != len(want) {
		t.Fatalf("got %d deltas, want %d: %+v", len(rec.deltas), len(want), rec.deltas)
	}
	for i, w := range want {
		d := rec.deltas[i]
		if d.Content != w.content || d.Tokens != w.tokens || (w.calls == "") != (d.ToolCalls == nil) ||
			(w.calls != "" && !sameJSON(t, d.ToolCalls, []byte(w.calls))) {
			t.Errorf("delta %d = {%q %s %d}, want {%q %s %d}", i, d.Content, d.ToolCalls, d.Tokens, w.content, w.calls, w.tokens)
		}
	}
	wantCalls := `[
	  {"id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","type":"function","function":{"name":"get_weather","arguments":"{\"location\": \"Paris\"}"}},
	  {"id":"toolu_01Vb2kLmN3pQr4sTuV5wXy6Z","type":"function","function":{"name":"get_time","arguments":"{}"}}
	]`
	if !sameJSON(t, out.ToolCalls, []byte(wantCalls)) {
		t.Errorf("tool calls = %s, want %s", out.ToolCalls, wantCalls)
	}
	if out.Content != "Checking the weather." || out.FinishReason != "tool_calls" || !out.WellFormed {
		t.Errorf("outcome = %+v", out)
	}
	if want := (schemas.Usage{InputUnits: 472, OutputUnits: 89}); out.Usage != want {
		t.Errorf("usage = %+v, want %+v", out.Usage, want)
	}
}

func TestAnthropicThinkingIsNotDeliveredAndCachedInputIsBilled(t *testing.T) {
	p := newMessagesProvider(t, replay(answer{body: fixture(t, "anthropic_stream_thinking.sse")}))
	var rec recorder

	out, err := newAnthropicAdapter(t, p, "").Stream(context.Background(), hello(), &rec)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	if want := []Delta{{Content: "42", Tokens: 1}}; !reflect.DeepEqual(rec.deltas, want) {
		t.Errorf("deltas = %+v, want only the answer %+v", rec.deltas, want)
	}
	// 30 uncached + 100 written to the cache + 2000 read from it.
	if want := (schemas.Usage{InputUnits: 2130, OutputUnits: 17}); out.Usage != want || out.Content != "42" {
		t.Errorf("outcome = %+v, want content 42 and usage %+v", out, want)
	}
}

func TestAnthropicErrorStatusesAreClassifiedIntoScopes(t *testing.T) {
	for _, tc := range []struct {
		status         int
		typ            string
		header         map[string]string
		wantStatus     schemas.StatusClass
		wantScope      schemas.ErrorScope
		wantRetryAfter time.Duration
	}{
		{400, "invalid_request_error", nil, schemas.StatusInvalidRequest, schemas.ScopeGroup, 0},
		{413, "request_too_large", nil, schemas.StatusInvalidRequest, schemas.ScopeGroup, 0},
		{401, "authentication_error", nil, schemas.StatusAuth, schemas.ScopeRoute, 0},
		{402, "billing_error", nil, schemas.StatusAuth, schemas.ScopeRoute, 0},
		{403, "permission_error", nil, schemas.StatusAuth, schemas.ScopeRoute, 0},
		{404, "not_found_error", nil, schemas.StatusNotFound, schemas.ScopeRoute, 0},
		{429, "rate_limit_error", map[string]string{"Retry-After": "20"}, schemas.StatusRateLimited, schemas.ScopePushback, 20 * time.Second},
		{429, "rate_limit_error", nil, schemas.StatusRateLimited, schemas.ScopePushback, 0},
		{500, "api_error", nil, schemas.StatusServerError, schemas.ScopeTransient, 0},
		{504, "timeout_error", nil, schemas.StatusTimeout, schemas.ScopeTransient, 0},
		{529, "overloaded_error", map[string]string{"Retry-After": "3"}, schemas.StatusOverloaded, schemas.ScopePushback, 3 * time.Second},
		{529, "overloaded_error", nil, schemas.StatusOverloaded, schemas.ScopePushback, 0},
	} {
		t.Run(fmt.Sprintf("%d %s retry-after %v", tc.status, tc.typ, tc.wantRetryAfter), func(t *testing.T) {
			body := fixture(t, fmt.Sprintf("anthropic_error_%d_%s.json", tc.status, tc.typ))
			p := newMessagesProvider(t, replay(answer{status: tc.status, header: tc.header, body: body}))
			var rec recorder

			out, err := newAnthropicAdapter(t, p, testKey).Stream(context.Background(), hello(), &rec)
			ue := asError(t, err)
			if ue.Status != tc.wantStatus || ue.Scope != tc.wantScope || ue.HTTPStatus != tc.status || ue.RetryAfter != tc.wantRetryAfter {
				t.Errorf("error = %v (HTTP %d, retry after %v), want %s (%s), HTTP %d, retry after %v",
					ue, ue.HTTPStatus, ue.RetryAfter, tc.wantStatus, tc.wantScope, tc.status, tc.wantRetryAfter)
			}
			if !strings.Contains(ue.Message, tc.typ) {
				t.Errorf("message %q does not name the error type %q", ue.Message, tc.typ)
			}
			if rec.firstBytes != 0 || len(rec.deltas) != 0 || !reflect.DeepEqual(out, Outcome{}) {
				t.Errorf("sink saw %d first bytes, %d deltas; outcome %+v: want nothing for a rejected request", rec.firstBytes, len(rec.deltas), out)
			}
			if n := p.requests.Load(); n != 1 {
				t.Errorf("provider saw %d requests, want exactly 1 (no retry)", n)
			}
		})
	}
}

func TestAnthropicErrorEventMidStreamEndsTheAttemptWithWhatArrived(t *testing.T) {
	p := newMessagesProvider(t, replay(answer{body: fixture(t, "anthropic_stream_error_overloaded.sse")}))
	var rec recorder

	out, err := newAnthropicAdapter(t, p, "").Stream(context.Background(), hello(), &rec)
	ue := asError(t, err)
	if ue.Status != schemas.StatusOverloaded || ue.Scope != schemas.ScopePushback || ue.HTTPStatus != 0 {
		t.Errorf("error = %v (HTTP %d), want pushback overloaded inside a 200 stream", ue, ue.HTTPStatus)
	}
	if rec.firstBytes != 1 || len(rec.deltas) != 1 {
		t.Errorf("sink saw %d first bytes and %d deltas, want the one delta before the error", rec.firstBytes, len(rec.deltas))
	}
	want := Outcome{Content: "Hello", Usage: schemas.Usage{InputUnits: 25, OutputUnits: 1, Estimated: true}}
	if !reflect.DeepEqual(out, want) {
		t.Errorf("outcome = %+v, want %+v", out, want)
	}
}

func TestAnthropicErrorEventsAreClassifiedByTheirType(t *testing.T) {
	for _, tc := range []struct {
		typ        string
		wantStatus schemas.StatusClass
		wantScope  schemas.ErrorScope
	}{
		{"invalid_request_error", schemas.StatusInvalidRequest, schemas.ScopeGroup},
		{"request_too_large", schemas.StatusInvalidRequest, schemas.ScopeGroup},
		{"authentication_error", schemas.StatusAuth, schemas.ScopeRoute},
		{"permission_error", schemas.StatusAuth, schemas.ScopeRoute},
		{"billing_error", schemas.StatusAuth, schemas.ScopeRoute},
		{"not_found_error", schemas.StatusNotFound, schemas.ScopeRoute},
		{"rate_limit_error", schemas.StatusRateLimited, schemas.ScopePushback},
		{"overloaded_error", schemas.StatusOverloaded, schemas.ScopePushback},
		{"timeout_error", schemas.StatusTimeout, schemas.ScopeTransient},
		{"api_error", schemas.StatusServerError, schemas.ScopeTransient},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			// The recorded overloaded stream with its error type replaced.
			body := strings.Replace(string(fixture(t, "anthropic_stream_error_overloaded.sse")), `"overloaded_error"`, `"`+tc.typ+`"`, 1)
			p := newMessagesProvider(t, replay(answer{body: []byte(body)}))

			_, err := newAnthropicAdapter(t, p, "").Stream(context.Background(), hello(), nil)
			if ue := asError(t, err); ue.Status != tc.wantStatus || ue.Scope != tc.wantScope {
				t.Errorf("classified as %s (%s), want %s (%s)", ue.Status, ue.Scope, tc.wantStatus, tc.wantScope)
			}
		})
	}
}

func TestAnthropicStreamsThatBreakAreTransientWithEstimatedUsage(t *testing.T) {
	for _, tc := range []struct {
		name, fixture string
		want          Outcome
	}{
		{"cut before message_delta", "anthropic_stream_cut.sse",
			Outcome{Content: "Hello there", Usage: schemas.Usage{InputUnits: 25, OutputUnits: 2, Estimated: true}}},
		{"a malformed event", "anthropic_stream_malformed.sse",
			Outcome{Usage: schemas.Usage{InputUnits: 25, OutputUnits: 1, Estimated: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newMessagesProvider(t, replay(answer{body: fixture(t, tc.fixture)}))

			out, err := newAnthropicAdapter(t, p, "").Stream(context.Background(), hello(), nil)
			if ue := asError(t, err); ue.Status != schemas.StatusServerError || ue.Scope != schemas.ScopeTransient {
				t.Errorf("error = %v, want a transient server error", ue)
			}
			out.MaxTokenGap = 0 // a timing: TestTheOutcomeCarriesTheLongestGapBetweenTokensAfterTheFirst checks it
			if !reflect.DeepEqual(out, tc.want) {
				t.Errorf("outcome = %+v, want %+v", out, tc.want)
			}
		})
	}
}

func TestAnthropicAnswerWithoutMessageStopIsCompleteButNotWellFormed(t *testing.T) {
	p := newMessagesProvider(t, replay(answer{body: fixture(t, "anthropic_stream_no_message_stop.sse")}))

	out, err := newAnthropicAdapter(t, p, "").Stream(context.Background(), hello(), nil)
	if err != nil {
		t.Fatalf("Stream: %v, want the complete answer for the arbiter to judge", err)
	}
	want := Outcome{FinishReason: "stop", Content: "Done.", Usage: schemas.Usage{InputUnits: 25, OutputUnits: 3}}
	if !reflect.DeepEqual(out, want) {
		t.Errorf("outcome = %+v, want %+v", out, want)
	}
}

func TestAnthropicUnstreamedAnswerIsARouteError(t *testing.T) {
	p := newMessagesProvider(t, replay(answer{contentType: "application/json", body: fixture(t, "anthropic_message.json")}))
	var rec recorder

	_, err := newAnthropicAdapter(t, p, "").Stream(context.Background(), hello(), &rec)
	if ue := asError(t, err); ue.Status != schemas.StatusServerError || ue.Scope != schemas.ScopeRoute {
		t.Errorf("error = %v, want route-local: an endpoint ignoring stream cannot serve hedged attempts", ue)
	}
	if rec.firstBytes != 0 {
		t.Errorf("FirstByte called for an answer that is no stream")
	}
}

func TestAnthropicCancelClosesTheProviderConnection(t *testing.T) {
	gone := make(chan struct{})
	body := string(fixture(t, "anthropic_stream_text.sse"))
	first := body[:strings.Index(body, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" there\"}}")]
	p := newMessagesProvider(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, first)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(gone)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := recorder{onDelta: func(Delta) { cancel() }}

	out, err := newAnthropicAdapter(t, p, "").Stream(ctx, hello(), &rec)
	eventually.Closed(t, wait, "the provider to see its request context done", gone)
	ue := asError(t, err)
	if ue.Status != schemas.StatusCanceled || ue.Scope != schemas.ScopeNone || !errors.Is(err, context.Canceled) {
		t.Errorf("error = %v, want canceled with no scope", ue)
	}
	if want := (schemas.Usage{InputUnits: 25, OutputUnits: 1, Estimated: true}); out.Content != "Hello" || out.Usage != want {
		t.Errorf("outcome = %+v, want the partial answer with usage %+v", out, want)
	}
}

// captured is what a provider saw of one request.
type captured struct {
	body   []byte
	header http.Header
}

func capture(t *testing.T, got chan<- captured) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- captured{b, r.Header.Clone()}
		replay(answer{body: fixture(t, "anthropic_stream_text.sse")})(w, r)
	}
}

func TestAnthropicRequestBodyTranslatesTheCanonicalRequest(t *testing.T) {
	temp, topP := 0.2, 0.9
	req := &schemas.ChatRequest{
		Model: "general",
		Messages: []schemas.Message{
			{Role: schemas.MessageSystem, Content: schemas.TextContent("You answer briefly.")},
			{Role: schemas.MessageUser, Content: json.RawMessage(`[
				{"type":"text","text":"What is in this image, and the weather?"},
				{"type":"image_url","image_url":{"url":"https://example.com/cat.png","detail":"low"}},
				{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]`)},
			{Role: schemas.MessageAssistant, Content: schemas.TextContent("Let me check."), ToolCalls: json.RawMessage(
				`[{"id":"call_abc123","type":"function","function":{"name":"get_weather","arguments":"{\"location\":\"Paris\"}"}}]`)},
			{Role: schemas.MessageTool, ToolCallID: "call_abc123", Content: schemas.TextContent("18C, cloudy")},
			{Role: schemas.MessageUser, Name: "alice", Content: schemas.TextContent("Thanks <3")},
		},
		MaxTokens:   256,
		Temperature: &temp,
		TopP:        &topP,
		Stop:        []string{"\n\n", "END"},
		Tools: json.RawMessage(`[{"type":"function","function":{"name":"get_weather","description":"Current weather",
			"parameters":{"type":"object","properties":{"location":{"type":"string"}},"required":["location"]}}},
			{"type":"function","function":{"name":"get_time"}}]`),
		ToolChoice:        json.RawMessage(`{"type":"function","function":{"name":"get_weather"}}`),
		ResponseFormat:    json.RawMessage(`{"type":"text"}`),
		ParallelToolCalls: new(false),
		MaxTokensField:    schemas.ParamMaxCompletionTokens,
		Extra: map[string]json.RawMessage{
			"user": json.RawMessage(`"user-7"`), "n": json.RawMessage(`1`), "store": json.RawMessage(`false`),
			"logprobs": json.RawMessage(`false`), "max_tokens": json.RawMessage(`999`),
		},
	}
	got := make(chan captured, 1)
	p := newMessagesProvider(t, capture(t, got))

	if _, err := newAnthropicAdapter(t, p, testKey).Stream(context.Background(), req, nil); err != nil {
		t.Fatalf("Stream: %v", err)
	}
	c := <-got
	if want := fixture(t, "anthropic_request_body.golden.json"); !sameJSON(t, c.body, want) {
		t.Errorf("request body\n%s\nwant\n%s", c.body, want)
	}
	for h, want := range map[string]string{
		"X-Api-Key": testKey, "Anthropic-Version": "2023-06-01", "Content-Type": "application/json",
		"Accept": "text/event-stream", "Authorization": "",
	} {
		if got := c.header.Get(h); got != want {
			t.Errorf("header %s = %q, want %q", h, got, want)
		}
	}
}

func TestAnthropicRequestFieldsFollowTheMessagesRules(t *testing.T) {
	for _, tc := range []struct {
		name      string
		maxTokens int // the adapter's configured default; 0 for the package's
		req       func(*schemas.ChatRequest)
		check     func(t *testing.T, body map[string]any)
	}{
		{"max_tokens defaults to DefaultAnthropicMaxTokens", 0, func(*schemas.ChatRequest) {}, func(t *testing.T, b map[string]any) {
			if b["max_tokens"] != float64(DefaultAnthropicMaxTokens) {
				t.Errorf("max_tokens = %v, want %d", b["max_tokens"], DefaultAnthropicMaxTokens)
			}
		}},
		{"max_tokens defaults to the configured default", 512, func(*schemas.ChatRequest) {}, func(t *testing.T, b map[string]any) {
			if b["max_tokens"] != float64(512) {
				t.Errorf("max_tokens = %v, want 512", b["max_tokens"])
			}
		}},
		{"the request's max_tokens wins over the default", 512, func(r *schemas.ChatRequest) { r.MaxTokens = 7 }, func(t *testing.T, b map[string]any) {
			if b["max_tokens"] != float64(7) {
				t.Errorf("max_tokens = %v, want 7", b["max_tokens"])
			}
		}},
		{"several system and developer messages fold into system blocks", 0, func(r *schemas.ChatRequest) {
			r.Messages = append([]schemas.Message{
				{Role: schemas.MessageSystem, Content: schemas.TextContent("Be brief.")},
				{Role: schemas.MessageDeveloper, Content: json.RawMessage(`[{"type":"text","text":"Use French."}]`)},
			}, r.Messages...)
		}, func(t *testing.T, b map[string]any) {
			want := []any{map[string]any{"type": "text", "text": "Be brief."}, map[string]any{"type": "text", "text": "Use French."}}
			if !reflect.DeepEqual(b["system"], want) {
				t.Errorf("system = %v, want %v", b["system"], want)
			}
			if msgs := b["messages"].([]any); len(msgs) != 1 || msgs[0].(map[string]any)["role"] != "user" {
				t.Errorf("messages = %v, want only the user turn", msgs)
			}
		}},
		{"no system message sends no system", 0, func(*schemas.ChatRequest) {}, func(t *testing.T, b map[string]any) {
			for _, k := range []string{"system", "tools", "tool_choice", "stop_sequences", "temperature", "top_p"} {
				if _, ok := b[k]; ok {
					t.Errorf("body has %q = %v, want it absent", k, b[k])
				}
			}
			if b["model"] != "route-model-2024" || b["stream"] != true {
				t.Errorf("model %v stream %v", b["model"], b["stream"])
			}
		}},
		{"tool_choice without tools is not sent; required is any", 0, func(r *schemas.ChatRequest) {
			r.ToolChoice = json.RawMessage(`"required"`)
		}, func(t *testing.T, b map[string]any) {
			if _, ok := b["tool_choice"]; ok {
				t.Errorf("tool_choice = %v without tools", b["tool_choice"])
			}
		}},
		{"tool_choice required is any", 0, func(r *schemas.ChatRequest) {
			r.Tools = json.RawMessage(`[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]`)
			r.ToolChoice = json.RawMessage(`"required"`)
		}, func(t *testing.T, b map[string]any) {
			if !reflect.DeepEqual(b["tool_choice"], map[string]any{"type": "any"}) {
				t.Errorf("tool_choice = %v, want {type: any}", b["tool_choice"])
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan captured, 1)
			p := newMessagesProvider(t, capture(t, got))
			a, err := NewAnthropic(AnthropicOptions{Options: Options{BaseURL: p.URL, Model: "route-model-2024"}, MaxTokens: tc.maxTokens})
			if err != nil {
				t.Fatal(err)
			}
			defer a.CloseIdleConnections()
			req := hello()
			tc.req(req)

			if _, err := a.Stream(context.Background(), req, nil); err != nil {
				t.Fatalf("Stream: %v", err)
			}
			var body map[string]any
			if err := json.Unmarshal((<-got).body, &body); err != nil {
				t.Fatal(err)
			}
			tc.check(t, body)
		})
	}
}

func TestAnthropicRequestsItCannotTranslateEndTheGroupUnsent(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  func(*schemas.ChatRequest)
	}{
		{"an audio part", func(r *schemas.ChatRequest) {
			r.Messages[0].Content = json.RawMessage(`[{"type":"input_audio","input_audio":{"data":"AAA=","format":"wav"}}]`)
		}},
		{"an image URL that is no http or data URL", func(r *schemas.ChatRequest) {
			r.Messages[0].Content = json.RawMessage(`[{"type":"image_url","image_url":{"url":"file:///etc/passwd"}}]`)
		}},
		{"a tool that is no function", func(r *schemas.ChatRequest) {
			r.Tools = json.RawMessage(`[{"type":"code_interpreter"}]`)
		}},
		{"tool-call arguments that are no JSON object", func(r *schemas.ChatRequest) {
			r.Messages = append(r.Messages, schemas.Message{Role: schemas.MessageAssistant,
				ToolCalls: json.RawMessage(`[{"id":"c1","type":"function","function":{"name":"f","arguments":"[1"}}]`)})
		}},
		{"an image in the system prompt", func(r *schemas.ChatRequest) {
			r.Messages = append([]schemas.Message{{Role: schemas.MessageSystem,
				Content: json.RawMessage(`[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]`)}}, r.Messages...)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newMessagesProvider(t, replay(answer{body: fixture(t, "anthropic_stream_text.sse")}))
			req := hello()
			tc.req(req)

			_, err := newAnthropicAdapter(t, p, "").Stream(context.Background(), req, nil)
			if ue := asError(t, err); ue.Status != schemas.StatusInvalidRequest || ue.Scope != schemas.ScopeGroup {
				t.Errorf("error = %v, want group-scoped invalid_request", ue)
			}
			if n := p.requests.Load(); n != 0 {
				t.Errorf("provider saw %d requests, want none", n)
			}
		})
	}
}

func TestAnthropicBaseURLIsTheAPIRootWithOrWithoutTheVersion(t *testing.T) {
	for _, suffix := range []string{"", "/", "/v1", "/v1/"} {
		t.Run("root"+suffix, func(t *testing.T) {
			p := newMessagesProvider(t, replay(answer{body: fixture(t, "anthropic_stream_text.sse")}))
			a, err := NewAnthropic(AnthropicOptions{Options: Options{BaseURL: p.URL + suffix}})
			if err != nil {
				t.Fatal(err)
			}
			defer a.CloseIdleConnections()
			if _, err := a.Stream(context.Background(), hello(), nil); err != nil {
				t.Errorf("Stream against %q: %v, want POST /v1/messages", suffix, err)
			}
		})
	}
}

func TestAnthropicKeyIsSentOnlyWhenConfiguredAndNeverInErrors(t *testing.T) {
	got := make(chan captured, 1)
	p := newMessagesProvider(t, capture(t, got))
	if _, err := newAnthropicAdapter(t, p, "").Stream(context.Background(), hello(), nil); err != nil {
		t.Fatal(err)
	}
	if _, present := (<-got).header["X-Api-Key"]; present {
		t.Error("x-api-key sent although no key is configured")
	}

	echo := `{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key ` + testKey + `"}}`
	p401 := newMessagesProvider(t, replay(answer{status: 401, body: []byte(echo)}))
	_, err := newAnthropicAdapter(t, p401, testKey).Stream(context.Background(), hello(), nil)
	ue := asError(t, err)
	if strings.Contains(ue.Error(), testKey) || strings.Contains(ue.Message, testKey) {
		t.Errorf("error text %q leaks the key", ue.Error())
	}
}

func TestNewAnthropicRefusesBadSettings(t *testing.T) {
	for _, cfg := range []AnthropicOptions{
		{Options: Options{BaseURL: ""}},
		{Options: Options{BaseURL: "api.anthropic.com"}},
		{Options: Options{BaseURL: "ftp://host"}},
		{Options: Options{BaseURL: "https://api.anthropic.com"}, MaxTokens: -1},
	} {
		if _, err := NewAnthropic(cfg); err == nil {
			t.Errorf("NewAnthropic(%+v) succeeded, want an error", cfg)
		}
	}
}
