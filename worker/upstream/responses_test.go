package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/hedgerow/hedgerow/schemas"
)

// responsesProvider replays body on POST /v1/responses, answering 404
// elsewhere, and hands each request body to got.
func responsesProvider(t *testing.T, body []byte, got chan<- []byte) *provider {
	t.Helper()
	p := &provider{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.requests.Add(1)
		if r.Method != http.MethodPost || r.URL.Path != "/v1/responses" {
			http.NotFound(w, r)
			return
		}
		b, _ := io.ReadAll(r.Body)
		if got != nil {
			got <- b
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(body)
	}))
	t.Cleanup(p.Close)
	return p
}

// responsesCaller is a Responses caller's request, as the door reads it.
func responsesCaller() *schemas.ChatRequest {
	temp := 0.2
	return &schemas.ChatRequest{
		Model: "general", Dialect: schemas.DialectResponses, Temperature: &temp,
		MaxTokens: 64, MaxTokensField: schemas.ParamMaxCompletionTokens,
		Messages: []schemas.Message{
			{Role: schemas.MessageSystem, Content: schemas.TextContent("Be brief.")},
			{Role: schemas.MessageUser, Content: json.RawMessage(`[{"type":"text","text":"Weather?"},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]`)},
			{Role: schemas.MessageAssistant, ToolCalls: json.RawMessage(`[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]`)},
			{Role: schemas.MessageTool, ToolCallID: "c1", Content: schemas.TextContent("sunny")},
		},
		Tools:          json.RawMessage(`[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]`),
		ToolChoice:     json.RawMessage(`{"type":"function","function":{"name":"get_weather"}}`),
		ResponseFormat: json.RawMessage(`{"type":"json_schema","json_schema":{"name":"w","schema":{"type":"object"}}}`),
		Extra:          map[string]json.RawMessage{"previous_response_id": json.RawMessage(`"resp_0"`), "store": json.RawMessage(`true`)},
	}
}

func TestResponsesCallerGoesToTheProvidersResponses(t *testing.T) {
	got := make(chan []byte, 1)
	p := responsesProvider(t, fixture(t, "responses_stream_text.sse"), got)
	var rec recorder
	out, err := newAdapter(t, p, testKey).Stream(context.Background(), responsesCaller(), &rec)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	want := `{"model":"route-model-2024","instructions":"Be brief.","input":[
		{"type":"message","role":"user","content":[{"type":"input_text","text":"Weather?"},{"type":"input_image","image_url":"https://x/y.png"}]},
		{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{}"},
		{"type":"function_call_output","call_id":"c1","output":"sunny"}],
		"max_output_tokens":64,"temperature":0.2,
		"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}],
		"tool_choice":{"type":"function","name":"get_weather"},
		"text":{"format":{"type":"json_schema","name":"w","schema":{"type":"object"}}},
		"stream":true,"previous_response_id":"resp_0","store":true}`
	if body := <-got; !sameJSON(t, body, []byte(want)) {
		t.Errorf("request body\n%s\nwant\n%s", body, want)
	}
	if rec.firstBytes != 1 || len(rec.deltas) != 2 || rec.deltas[0].Content != "Hi" || rec.deltas[1].Content != " there!" {
		t.Fatalf("first bytes %d, deltas %+v: created and in_progress are no output", rec.firstBytes, rec.deltas)
	}
	if out.Content != "Hi there!" || out.FinishReason != "stop" || !out.WellFormed ||
		out.Usage != (schemas.Usage{InputUnits: 37, OutputUnits: 11}) {
		t.Fatalf("outcome %+v", out)
	}
}

func TestResponsesFunctionCallsBecomeToolCallDeltas(t *testing.T) {
	p := responsesProvider(t, fixture(t, "responses_stream_tool_calls.sse"), nil)
	var rec recorder
	out, err := newAdapter(t, p, "").Stream(context.Background(), responsesCaller(), &rec)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	wantDeltas := []string{
		`[{"index":0,"id":"call_abc123","type":"function","function":{"name":"get_weather","arguments":""}}]`,
		`[{"index":0,"function":{"arguments":"{\"location\":"}}]`,
		`[{"index":0,"function":{"arguments":" \"Paris\"}"}}]`,
	}
	if len(rec.deltas) != len(wantDeltas) {
		t.Fatalf("deltas %+v", rec.deltas)
	}
	for i, w := range wantDeltas {
		if !sameJSON(t, rec.deltas[i].ToolCalls, []byte(w)) || rec.deltas[i].Tokens != 1 {
			t.Errorf("delta %d = %s, want %s", i, rec.deltas[i].ToolCalls, w)
		}
	}
	calls := `[{"id":"call_abc123","type":"function","function":{"name":"get_weather","arguments":"{\"location\": \"Paris\"}"}}]`
	if !sameJSON(t, out.ToolCalls, []byte(calls)) || out.FinishReason != "tool_calls" || out.Usage != (schemas.Usage{InputUnits: 82, OutputUnits: 17}) {
		t.Fatalf("outcome %+v, tool calls %s", out, out.ToolCalls)
	}
}

func TestResponsesStreamEnds(t *testing.T) {
	t.Run("incomplete is length", func(t *testing.T) {
		p := responsesProvider(t, fixture(t, "responses_stream_incomplete.sse"), nil)
		out, err := newAdapter(t, p, "").Stream(context.Background(), responsesCaller(), nil)
		if err != nil || out.FinishReason != "length" || out.Content != "Once" || out.Usage.Estimated {
			t.Fatalf("outcome %+v, err %v", out, err)
		}
	})
	t.Run("failed is a server error", func(t *testing.T) {
		p := responsesProvider(t, fixture(t, "responses_stream_failed.sse"), nil)
		_, err := newAdapter(t, p, "").Stream(context.Background(), responsesCaller(), nil)
		var ue *Error
		if !errors.As(err, &ue) || ue.Status != schemas.StatusServerError {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("cut before its end", func(t *testing.T) {
		body := fixture(t, "responses_stream_text.sse")
		p := responsesProvider(t, body[:len(body)/2], nil)
		out, err := newAdapter(t, p, "").Stream(context.Background(), responsesCaller(), nil)
		var ue *Error
		if !errors.As(err, &ue) || ue.Scope != schemas.ScopeTransient || out.WellFormed {
			t.Fatalf("outcome %+v, err %v", out, err)
		}
	})
}

func TestResponsesCallerReachesAnAnthropicRouteAsMessages(t *testing.T) {
	req := responsesCaller()
	req.ResponseFormat = nil // Messages has no JSON mode
	req.Extra = map[string]json.RawMessage{"user": json.RawMessage(`"u-9"`), "store": json.RawMessage(`false`)}
	got := make(chan captured, 1)
	p := newMessagesProvider(t, capture(t, got))
	if _, err := newAnthropicAdapter(t, p, "").Stream(context.Background(), req, nil); err != nil {
		t.Fatalf("Stream: %v", err)
	}
	m := bodyMembers(t, (<-got).body)
	if !sameJSON(t, m["metadata"], []byte(`{"user_id":"u-9"}`)) || m["store"] != nil || m["user"] != nil ||
		!sameJSON(t, m["system"], []byte(`"Be brief."`)) || !sameJSON(t, m["max_tokens"], []byte(`64`)) {
		t.Fatalf("body %v", m)
	}

	req.Extra = map[string]json.RawMessage{"previous_response_id": json.RawMessage(`"resp_0"`)}
	_, err := newAnthropicAdapter(t, p, "").Stream(context.Background(), req, nil)
	var ue *Error
	if !errors.As(err, &ue) || ue.Scope != schemas.ScopeGroup || ue.Message != "request member 'previous_response_id' has no equivalent at this provider" {
		t.Fatalf("err = %v", err)
	}
}
