package worker

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/worker/upstream"
)

// outputCanary opens the partial answer every continuation test sends:
// model output, which must never reach a log, a record or a metric.
const outputCanary = "OUTPUT-CANARY-do-not-record-41c9"

// partialAnswer is the text the caller already has; it ends in a space,
// which an Anthropic prefill strips.
const partialAnswer = outputCanary + " Once upon a time, "

// continuingProvider is a provider of one API behind httptest that
// records the body of each request and answers it with one stream.
type continuingProvider struct {
	bodies chan []byte
	url    string
}

func startContinuingProvider(t *testing.T, path, stream string) *continuingProvider {
	t.Helper()
	p := &continuingProvider{bodies: make(chan []byte, 4)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path {
			http.NotFound(w, r)
			return
		}
		b, _ := io.ReadAll(r.Body)
		p.bodies <- b
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, stream)
	}))
	t.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}

// finalMessage is the last message of the one request the provider
// received, and the request's other members.
func (p *continuingProvider) finalMessage(t *testing.T) (last map[string]any, body map[string]any) {
	t.Helper()
	select {
	case b := <-p.bodies:
		if err := json.Unmarshal(b, &body); err != nil {
			t.Fatalf("request body %s: %v", b, err)
		}
		msgs := body["messages"].([]any)
		return msgs[len(msgs)-1].(map[string]any), body
	case <-time.After(wait):
		t.Fatal("the provider received no request")
		return nil, nil
	}
}

func sse(event, data string) string {
	if event == "" {
		return "data: " + data + "\n\n"
	}
	return "event: " + event + "\ndata: " + data + "\n\n"
}

// The continuation's text, as each API streams it: " there was a fox."
// for Messages (the prefill's stripped space repeated), "there was a
// fox." for Chat Completions; 5 output tokens either way.
var (
	chatContinuation = sse("", `{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`) +
		sse("", `{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"there was"},"finish_reason":null}]}`) +
		sse("", `{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" a fox."},"finish_reason":null}]}`) +
		sse("", `{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`) +
		sse("", `{"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":31,"completion_tokens":5,"total_tokens":36}}`) +
		sse("", "[DONE]")
	messagesContinuation = sse("message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":31,"output_tokens":1}}}`) +
		sse("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`) +
		sse("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" there was"}}`) +
		sse("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" a fox."}}`) +
		sse("content_block_stop", `{"type":"content_block_stop","index":0}`) +
		sse("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":5}}`) +
		sse("message_stop", `{"type":"message_stop"}`)
)

// continuation turns an attempt into a continuation of partialAnswer, 6
// tokens in, under a cap of 100.
func continuation(att schemas.Attempt) schemas.Attempt {
	att.Attempt, att.Role = 2, schemas.RoleContinuation
	att.Continuation = &schemas.Continuation{Text: partialAnswer, OffsetTokens: 6}
	att.Request.MaxTokens = 100
	return att
}

// A continuation attempt reaches its provider as the provider's
// continuation request, and its chunks carry exactly the text that
// follows the partial answer, with the continuation's own usage.
func TestAContinuationAttemptStreamsOnlyTheTextThatFollowsThePartialAnswer(t *testing.T) {
	for _, tc := range []struct {
		style    upstream.ContinuationStyle
		path     string
		stream   string
		adapter  func(t *testing.T, baseURL string, style upstream.ContinuationStyle) upstream.Upstream
		final    map[string]any // the final message the provider must receive
		members  map[string]any // and members of the request
		maxField string
	}{
		{upstream.ContinueFinalMessage, "/v1/chat/completions", chatContinuation, openAIContinuing,
			map[string]any{"role": "assistant", "content": partialAnswer},
			map[string]any{"continue_final_message": true, "add_generation_prompt": false}, "max_tokens"},
		{upstream.ContinuePrefix, "/v1/chat/completions", chatContinuation, openAIContinuing,
			map[string]any{"role": "assistant", "content": partialAnswer, "prefix": true}, nil, "max_tokens"},
		{upstream.ContinuePrefill, "/v1/messages", messagesContinuation, anthropicContinuing,
			map[string]any{"role": "assistant", "content": strings.TrimSuffix(partialAnswer, " ")}, nil, "max_tokens"},
	} {
		t.Run(string(tc.style), func(t *testing.T) {
			p := startContinuingProvider(t, tc.path, tc.stream)
			h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 1, 40, 1000)}, upstream: tc.adapter(t, p.url, tc.style)})
			in := h.send(continuation(h.attempt("hg_continue")))
			in.accept()
			rs, res := in.untilResult()
			chunks, _, _ := checkStream(t, rs)
			var text strings.Builder
			for _, c := range chunks {
				text.WriteString(c.Delta)
			}
			if text.String() != "there was a fox." {
				t.Errorf("chunks carry %q, want exactly the continuation's text %q", text.String(), "there was a fox.")
			}
			if res.StatusClass != schemas.StatusOK || res.FinishReason != "stop" ||
				res.Usage != (schemas.Usage{InputUnits: 31, OutputUnits: 5}) {
				t.Errorf("result %s, finish %q, usage %+v; want ok, stop, the continuation's own 31/5", res.StatusClass, res.FinishReason, res.Usage)
			}
			final, body := p.finalMessage(t)
			if !equalJSON(final, tc.final) {
				t.Errorf("final message %v, want %v", final, tc.final)
			}
			for k, want := range tc.members {
				if body[k] != want {
					t.Errorf("request member %s = %v, want %v", k, body[k], want)
				}
			}
			if body[tc.maxField] != float64(94) {
				t.Errorf("%s = %v, want 100 less the 6 tokens already produced", tc.maxField, body[tc.maxField])
			}
			if rec := h.record(); rec.Role != schemas.RoleContinuation || rec.Outcome != schemas.OutcomeCompleted {
				t.Errorf("record role %s, outcome %s; want continuation, completed", rec.Role, rec.Outcome)
			}
			if logs := h.logs.String(); strings.Contains(logs, outputCanary) {
				t.Errorf("the partial answer reached the logs:\n%s", logs)
			}
		})
	}
}

// The worker trusts no sender: a continuation it cannot join, or a route
// that cannot continue, is refused with a typed, non-retryable result
// before the provider is called.
func TestAContinuationTheWorkerCannotRunIsRefusedWithoutCallingTheProvider(t *testing.T) {
	for _, tc := range []struct {
		name       string
		style      upstream.ContinuationStyle
		change     func(*schemas.Attempt)
		scope      schemas.ErrorScope
		streamOnly bool // an Upstream with no Continue method
	}{
		{"a route of no continuation style", upstream.ContinueNone, func(*schemas.Attempt) {}, schemas.ScopeRoute, false},
		{"an upstream that cannot continue", upstream.ContinueFinalMessage, func(*schemas.Attempt) {}, schemas.ScopeRoute, true},
		{"a request with tools", upstream.ContinueFinalMessage, func(a *schemas.Attempt) {
			a.Request.Tools = json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`)
		}, schemas.ScopeGroup, false},
		{"a json_schema answer", upstream.ContinuePrefix, func(a *schemas.Attempt) {
			a.Request.ResponseFormat = json.RawMessage(`{"type":"json_schema","json_schema":{"name":"a","schema":{}}}`)
		}, schemas.ScopeGroup, false},
		{"more than one choice", upstream.ContinueFinalMessage, func(a *schemas.Attempt) {
			a.Request.Extra = map[string]json.RawMessage{"n": json.RawMessage(`3`)}
		}, schemas.ScopeGroup, false},
		{"role continuation without a partial answer", upstream.ContinueFinalMessage, func(a *schemas.Attempt) { a.Continuation = nil }, schemas.ScopeGroup, false},
		{"a partial answer on a hedge", upstream.ContinueFinalMessage, func(a *schemas.Attempt) { a.Role = schemas.RoleHedge }, schemas.ScopeGroup, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startProvider(t, fakellm.Options{Model: model(t, 1, 40, 1000)}, nil)
			up := openAIContinuing(t, p.http.URL, tc.style)
			if tc.streamOnly {
				up = struct{ upstream.Upstream }{up}
			}
			h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 1, 40, 1000)}, upstream: up})
			att := continuation(h.attempt("hg_refused"))
			tc.change(&att)
			in := h.send(att)
			in.accept()
			rs, res := in.untilResult()
			if chunks, _, firstByte := checkStream(t, rs); firstByte || len(chunks) != 0 {
				t.Errorf("replies %v: a refused continuation has no first byte or chunks", kinds(rs))
			}
			if res.StatusClass != schemas.StatusInvalidRequest || res.ErrorScope != tc.scope {
				t.Errorf("result %s/%s (%q), want invalid_request/%s", res.StatusClass, res.ErrorScope, res.ErrorMessage, tc.scope)
			}
			if !strings.HasPrefix(res.ErrorMessage, "continuation refused: ") || strings.Contains(res.ErrorMessage, outputCanary) {
				t.Errorf("error message %q: want the refusal, without the partial answer", res.ErrorMessage)
			}
			select {
			case <-p.arrived:
				t.Error("the provider was called")
			default:
			}
			if rec := h.record(); rec.Outcome != schemas.OutcomeFailed || rec.ErrorScope != tc.scope {
				t.Errorf("record %s/%s, want failed/%s", rec.Outcome, rec.ErrorScope, tc.scope)
			}
		})
	}
}

func openAIContinuing(t *testing.T, baseURL string, style upstream.ContinuationStyle) upstream.Upstream {
	t.Helper()
	o, err := upstream.NewOpenAI(upstream.Options{BaseURL: baseURL + "/v1", Model: "route-model", Continuation: style})
	if err != nil {
		t.Fatalf("NewOpenAI: %v", err)
	}
	t.Cleanup(o.CloseIdleConnections)
	return o
}

func anthropicContinuing(t *testing.T, baseURL string, style upstream.ContinuationStyle) upstream.Upstream {
	t.Helper()
	a, err := upstream.NewAnthropic(upstream.AnthropicOptions{Options: upstream.Options{BaseURL: baseURL, Model: "route-model", Continuation: style}})
	if err != nil {
		t.Fatalf("NewAnthropic: %v", err)
	}
	t.Cleanup(a.CloseIdleConnections)
	return a
}

// equalJSON compares two decoded JSON objects.
func equalJSON(got, want map[string]any) bool {
	g, err1 := json.Marshal(got)
	w, err2 := json.Marshal(want)
	return errors.Join(err1, err2) == nil && string(g) == string(w)
}
