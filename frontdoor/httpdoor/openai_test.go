package httpdoor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/schemas"
)

func TestHTTPNonStreamingAnswerIsAChatCompletionWithUsageAndHedgeHeaders(t *testing.T) {
	srv, sub := scripted(t, frontdoortest.Answer(&dispatcher.Response{
		GroupID: "g-1", Content: "a0 a1 a2 ", Usage: schemas.Usage{InputUnits: 10, OutputUnits: 3},
		Attempts: 1, Winner: 1, WinnerRoute: "a", Gate: "g-1/1/1",
	}, false), Options{})
	resp := post(t, context.Background(), srv.URL, chatBody(false, ""), map[string]string{frontdoor.HeaderIdempotencyKey: "action-1"})
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var cc chatCompletion
	if err := json.NewDecoder(resp.Body).Decode(&cc); err != nil {
		t.Fatal(err)
	}
	route := resp.Header.Get(frontdoor.HeaderWinnerRoute)
	if route != "a" && route != "b" {
		t.Fatalf("winner route %q", route)
	}
	if cc.Object != "chat.completion" || cc.ID != "chatcmpl-g-1" || cc.Model != "general" || cc.Created == 0 || len(cc.Choices) != 1 {
		t.Fatalf("completion %+v", cc)
	}
	ch := cc.Choices[0]
	if ch.Message.Role != "assistant" || ch.Message.Content == nil || *ch.Message.Content != route+"0 "+route+"1 "+route+"2 " || ch.FinishReason != "stop" {
		t.Fatalf("choice %+v", ch)
	}
	if cc.Usage == nil || *cc.Usage != (openAIUsage{PromptTokens: 10, CompletionTokens: 3, TotalTokens: 13}) {
		t.Fatalf("usage %+v", cc.Usage)
	}
	if resp.Header.Get(frontdoor.HeaderAttempts) != "1" || resp.Header.Get(frontdoor.HeaderHedged) != "false" || resp.Header.Get(frontdoor.HeaderGate) == "" {
		t.Fatalf("hedge headers %v", resp.Header)
	}
	// The door hands the runtime what the caller asked for, and nothing
	// of the request goes unread.
	subs := sub.Submissions()
	if len(subs) != 1 || subs[0].Pool != "general" || subs[0].IdempotencyKey != "action-1" || subs[0].Request.MaxTokens != 50 || subs[0].Request.Stream {
		t.Fatalf("submissions %+v", subs)
	}
}

func TestHTTPStreamIsTheRoleChunkTheContentTheFinishTheUsageThenDone(t *testing.T) {
	for _, includeUsage := range []bool{true, false} {
		t.Run(fmt.Sprintf("include_usage=%t", includeUsage), func(t *testing.T) {
			var deltas []dispatcher.Delta
			for i := range 4 {
				deltas = append(deltas, dispatcher.Delta{Content: fmt.Sprintf("b%d ", i)})
			}
			srv, _ := scripted(t, frontdoortest.Answer(&dispatcher.Response{
				GroupID: "g-1", Content: "b0 b1 b2 b3 ", FinishReason: "stop", Usage: schemas.Usage{InputUnits: 10, OutputUnits: 4},
				Attempts: 2, Hedged: true, Winner: 2, WinnerRoute: "b", Gate: "g-1/2/1",
			}, true, deltas...), Options{})
			extra := ""
			if includeUsage {
				extra = `"stream_options":{"include_usage":true}`
			}
			resp := post(t, context.Background(), srv.URL, chatBody(true, extra), nil)
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			// The runtime told the stream of its commit before the first
			// byte: how the answer was won travels in the headers.
			if resp.Header.Get(frontdoor.HeaderHedged) != "true" || resp.Header.Get(frontdoor.HeaderAttempts) != "2" ||
				resp.Header.Get(frontdoor.HeaderWinnerRoute) != "b" || resp.Header.Get(frontdoor.HeaderGate) == "" ||
				resp.Header.Get("Trailer") != "" || len(resp.Trailer) != 0 {
				t.Fatalf("hedge headers %v, trailers %v", resp.Header, resp.Trailer)
			}
			got := frontdoortest.ReadChatStream(t, sseEvents(t, resp.Body), includeUsage)
			if got.ID != "chatcmpl-g-1" || got.FinishReason != "stop" || got.Content != "b0 b1 b2 b3 " {
				t.Fatalf("stream %+v, want chatcmpl-g-1 streaming %q then stop", got, "b0 b1 b2 b3 ")
			}
			if includeUsage && *got.Usage != (frontdoortest.Usage{PromptTokens: 10, CompletionTokens: 4, TotalTokens: 14}) {
				t.Fatalf("usage %+v", got.Usage)
			}
		})
	}
}

func TestHTTPErrorsAnswerTheirStatusWithAnOpenAIErrorObject(t *testing.T) {
	unknownModel := strings.Replace(chatBody(false, ""), `"general"`, `"nope"`, 1)
	tests := []struct {
		name    string
		limit   int64
		tenants bool // require the API key "good-key"
		method  string
		body    string
		headers map[string]string
		// fail, when set, is what the runtime answers.
		fail      error
		status    int
		typ, code string
		param     string
		// want are response headers and their values (anyValue: present).
		want map[string]string
	}{
		{name: "malformed JSON", body: `{"model":"general","messages":[`, status: 400, typ: "invalid_request_error", code: "invalid_json"},
		{name: "a body that is not an object", body: `[1,2]`, status: 400, typ: "invalid_request_error", code: "invalid_json"},
		{name: "no model", body: `{"messages":[{"role":"user","content":"x"}]}`, status: 400, typ: "invalid_request_error", code: "invalid_value", param: "model"},
		{name: "empty messages", body: `{"model":"general","messages":[]}`, status: 400, typ: "invalid_request_error", code: "invalid_value", param: "messages"},
		{name: "a message without content", body: `{"model":"general","messages":[{"role":"user","content":"x"},{"role":"user"}]}`,
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: "messages[1]"},
		{name: "a message of an unknown role", body: `{"model":"general","messages":[{"role":"wizard","content":"x"}]}`,
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: "messages[0]"},
		{name: "more than one choice", body: chatBody(false, `"n":2`), status: 400, typ: "invalid_request_error", code: "invalid_value", param: "n"},
		{name: "a negative max_tokens", body: strings.Replace(chatBody(false, ""), `"max_tokens":50`, `"max_tokens":-1`, 1),
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: "max_tokens"},
		{name: "a zero max_completion_tokens", body: chatBody(false, `"max_completion_tokens":0`),
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: "max_completion_tokens"},
		{name: "a temperature out of range", body: chatBody(false, `"temperature":2.5`),
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: "temperature"},
		{name: "a parameter of the wrong type", body: chatBody(false, `"temperature":"hot"`),
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: "temperature"},
		{name: "a top_p out of range", body: chatBody(false, `"top_p":3`),
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: "top_p"},
		{name: "a stop of the wrong type", body: chatBody(false, `"stop":7`),
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: "stop"},
		{name: "a response_format of an unknown type", body: chatBody(false, `"response_format":{"type":"xml"}`),
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: "response_format"},
		{name: "a json_schema response_format without a schema", body: chatBody(false, `"response_format":{"type":"json_schema","json_schema":{"name":"x"}}`),
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: "response_format"},
		{name: "a response schema that does not compile", body: chatBody(false, `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"objekt"}}}`),
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: "response_format.json_schema.schema"},
		{name: "a schema bomb 1600 levels deep, refused before compiling", body: chatBody(false, `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":`+schemaBomb(1600)+`}}`),
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: "response_format.json_schema.schema"},
		{name: "a response schema with an external reference", body: chatBody(false, `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"$ref":"http://127.0.0.1:1/s.json"}}}`),
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: "response_format.json_schema.schema"},
		{name: "an unknown operation class", body: chatBody(false, ""), headers: map[string]string{frontdoor.HeaderOperation: "nightly-batch"},
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: frontdoor.HeaderOperation},
		{name: "an idempotency key over its length", body: chatBody(false, ""), headers: map[string]string{frontdoor.HeaderIdempotencyKey: strings.Repeat("k", 256)},
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: frontdoor.HeaderIdempotencyKey},
		{name: "a negative deadline header", body: chatBody(false, ""), headers: map[string]string{frontdoor.HeaderDeadlineMs: "-5"},
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: frontdoor.HeaderDeadlineMs},
		{name: "a deadline header that is no number", body: chatBody(false, ""), headers: map[string]string{frontdoor.HeaderDeadlineMs: "soon"},
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: frontdoor.HeaderDeadlineMs},
		{name: "no API key", tenants: true, body: chatBody(false, ""),
			status: 401, typ: "authentication_error", code: "invalid_api_key", want: map[string]string{"WWW-Authenticate": anyValue}},
		{name: "an unknown API key", tenants: true, body: chatBody(false, ""), headers: map[string]string{"Authorization": "Bearer bad-key"},
			status: 401, typ: "authentication_error", code: "invalid_api_key", want: map[string]string{"WWW-Authenticate": anyValue}},
		{name: "an unknown model", body: unknownModel, status: 404, typ: "invalid_request_error", code: "model_not_found", param: "model"},
		{name: "an unknown model with a response schema", body: strings.Replace(chatBody(false, `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}}`), `"general"`, `"nope"`, 1),
			status: 404, typ: "invalid_request_error", code: "model_not_found", param: "model"},
		{name: "a wrong method", method: http.MethodGet, status: 405, typ: "invalid_request_error", code: "method_not_allowed",
			want: map[string]string{"Allow": http.MethodPost}},
		{name: "a body over the limit", limit: 1024, body: chatBody(false, `"pad":"`+strings.Repeat("x", 2048)+`"`),
			status: 413, typ: "invalid_request_error", code: "request_too_large"},
		{name: "a user action that already committed", body: chatBody(false, ""),
			fail:   &dispatcher.GroupError{Code: schemas.ErrAlreadyCommitted, Holder: "g-0/1/1"},
			status: 409, typ: "invalid_request_error", code: "already_committed", want: map[string]string{frontdoor.HeaderGate: "g-0/1/1", frontdoor.HeaderShouldRetry: "false"}},
		{name: "a stream failing before its first byte", body: chatBody(true, ""), fail: &dispatcher.GroupError{Code: schemas.ErrDeadlineExceeded},
			status: 504, typ: "timeout_error", code: "deadline_exceeded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := Options{BodyLimit: tc.limit}
			if tc.tenants {
				opts.Keyring = frontdoor.NewKeyring(map[string][]string{"acme": {policy.HashAPIKey("good-key")}})
			}
			answer := frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false)
			if tc.fail != nil {
				answer = frontdoortest.Fail(tc.fail)
			}
			srv, sub := scripted(t, answer, opts)
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			resp, body := frontdoortest.Do(t, method, srv.URL+"/v1/chat/completions", tc.body, tc.headers)
			if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d (%s), want %d: %s", resp.StatusCode, resp.Header.Get("Content-Type"), tc.status, body)
			}
			typ, code, param := openAIErrorOf(t, body)
			if typ != tc.typ || code != tc.code || param != tc.param {
				t.Fatalf("error type %q code %q param %q, want %q %q %q", typ, code, param, tc.typ, tc.code, tc.param)
			}
			for k, v := range tc.want {
				if got := resp.Header.Get(k); got == "" || v != anyValue && got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
			if tc.status != http.StatusTooManyRequests && resp.Header.Get("Retry-After") != "" {
				t.Errorf("Retry-After %q on a %d", resp.Header.Get("Retry-After"), tc.status)
			}
			for _, leak := range []string{prompt, "soon", "bad-key", "nightly-batch", "objekt", "127.0.0.1:1"} {
				if strings.Contains(string(body), leak) {
					t.Fatalf("error body %s echoes the request (%q)", body, leak)
				}
			}
			// What the door refuses never reaches the runtime.
			if n := len(sub.Submissions()); (tc.fail != nil || tc.code == "model_not_found" && !strings.Contains(tc.body, "schema")) != (n == 1) {
				t.Errorf("%d submissions reached the runtime", n)
			}
		})
	}
}

func TestHTTPClientLeavingMidStreamCancelsItsSubmission(t *testing.T) {
	gone := make(chan struct{}, 1)
	srv, _ := scripted(t, frontdoortest.Hold(gone, dispatcher.Delta{Content: "first "}), Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := post(t, ctx, srv.URL, chatBody(true, ""), nil)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// Read until the committed content arrives, then go away.
	frontdoortest.ReadUntil(t, resp.Body, `"content":"first "`)
	cancel()
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the submission's context was never cancelled")
	}
}

func TestHTTPModelsListThePools(t *testing.T) {
	srv, _ := scripted(t, nil, Options{})
	resp, body := get(t, srv.URL+"/v1/models")
	var list modelList
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &list) != nil {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	want := modelList{Object: "list", Data: []model{{ID: "general", Object: "model", OwnedBy: "hedgerow"}}}
	if fmt.Sprint(list) != fmt.Sprint(want) || !strings.Contains(string(body), `"created":0`) {
		t.Fatalf("models %s, want %+v", body, want)
	}
	if resp, _ := get(t, srv.URL+"/v1/models/general"); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/models/general: %d", resp.StatusCode)
	}
	resp, body = get(t, srv.URL+"/v1/models/nope")
	if _, code, _ := openAIErrorOf(t, body); resp.StatusCode != http.StatusNotFound || code != "model_not_found" {
		t.Fatalf("GET /v1/models/nope: %d %s", resp.StatusCode, body)
	}
	if resp, _ := get(t, srv.URL+"/healthz"); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: %d", resp.StatusCode)
	}
}

func TestHTTPPresentedKeyIsTheBearerTokenOrTheXAPIKey(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers map[string]string
		want    string
	}{
		{"a bearer token", map[string]string{"Authorization": "Bearer k1"}, "k1"},
		{"the scheme in another case", map[string]string{"Authorization": "bearer k1"}, "k1"},
		{"spaces around the token", map[string]string{"Authorization": "Bearer   k1  "}, "k1"},
		{"an x-api-key", map[string]string{"X-Api-Key": "k2"}, "k2"},
		{"the bearer token before the x-api-key", map[string]string{"Authorization": "Bearer k1", "X-Api-Key": "k2"}, "k1"},
		{"another scheme", map[string]string{"Authorization": "Basic azE6"}, ""},
		{"a scheme without a token", map[string]string{"Authorization": "Bearer"}, ""},
		{"nothing", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			if got := presentedKey(r); got != tc.want {
				t.Fatalf("key %q, want %q", got, tc.want)
			}
		})
	}
}

func TestHTTPAPIKeyNamesTheTenantOfTheSubmission(t *testing.T) {
	srv, sub := scripted(t, frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false),
		Options{Keyring: frontdoor.NewKeyring(map[string][]string{"acme": {policy.HashAPIKey("good-key")}})})
	resp := post(t, context.Background(), srv.URL, chatBody(false, ""), map[string]string{"Authorization": "Bearer good-key"})
	resp.Body.Close()
	if subs := sub.Submissions(); resp.StatusCode != http.StatusOK || len(subs) != 1 || subs[0].Tenant != "acme" {
		t.Fatalf("status %d, submissions %+v: want one of tenant acme", resp.StatusCode, subs)
	}
}

func TestHTTPDispatcherErrorsMapToStatusAndRetryHints(t *testing.T) {
	tests := []struct {
		err         error
		status      int
		typ, code   string
		retryAfter  string
		gate        string
		shouldRetry string
	}{
		{&dispatcher.GroupError{Code: schemas.ErrDeadlineExceeded}, 504, "timeout_error", "deadline_exceeded", "", "", "true"},
		{&dispatcher.GroupError{Code: schemas.ErrAlreadyCommitted, Holder: "g1/2/7"}, 409, "invalid_request_error", "already_committed", "", "g1/2/7", "false"},
		{&dispatcher.GroupError{Code: schemas.ErrRateLimited}, 429, "rate_limit_error", "rate_limited", "1", "", "true"},
		{&dispatcher.GroupError{Code: schemas.ErrRateLimited, RetryAfter: 2500 * time.Millisecond}, 429, "rate_limit_error", "rate_limited", "3", "", "true"},
		{&dispatcher.GroupError{Code: schemas.ErrOverloaded, RetryAfter: time.Second}, 429, "rate_limit_error", "overloaded", "1", "", "true"},
		{&dispatcher.GroupError{Code: schemas.ErrBudgetExhausted}, 429, "insufficient_quota", "budget_exhausted", "", "", "false"},
		{&dispatcher.GroupError{Code: schemas.ErrBudgetExhausted, RetryAfter: 90 * time.Second}, 429, "insufficient_quota", "budget_exhausted", "90", "", "true"},
		{&dispatcher.GroupError{Code: schemas.ErrAllRoutesFailed}, 503, "server_error", "all_routes_failed", "1", "", "true"},
		{&dispatcher.GroupError{Code: schemas.ErrRouteFailed}, 502, "server_error", "route_failed", "", "", "false"},
		{&dispatcher.GroupError{Code: schemas.ErrNoRoute}, 503, "server_error", "no_route", "1", "", "true"},
		{&dispatcher.GroupError{Code: schemas.ErrGateUnavailable}, 503, "server_error", "gate_unavailable", "1", "", "true"},
		{&dispatcher.GroupError{Code: schemas.ErrStreamInterrupted}, 502, "server_error", "stream_interrupted", "", "", "true"},
		{&dispatcher.GroupError{Code: schemas.ErrInvalidRequest, Scope: schemas.ScopeGroup}, 400, "invalid_request_error", "invalid_request", "", "", "false"},
		{fmt.Errorf("%w: x", dispatcher.ErrBadRequest), 400, "invalid_request_error", "invalid_request", "", "", "false"},
		{fmt.Errorf("%w: %q", dispatcher.ErrUnknownPool, "x"), 404, "invalid_request_error", "model_not_found", "", "", "false"},
		{dispatcher.ErrShuttingDown, 503, "server_error", "shutting_down", "1", "", "true"},
		{errors.New("surprise"), 500, "server_error", "internal_error", "", "", "true"},
	}
	for _, tc := range tests {
		t.Run(tc.err.Error(), func(t *testing.T) {
			rec := httptest.NewRecorder()
			openAIDialect{}.writeFailure(rec, frontdoor.FailureFor(tc.err))
			typ, code, _ := openAIErrorOf(t, rec.Body.Bytes())
			h := rec.Header()
			if rec.Code != tc.status || typ != tc.typ || code != tc.code ||
				h.Get("Retry-After") != tc.retryAfter || h.Get(frontdoor.HeaderGate) != tc.gate || h.Get(frontdoor.HeaderShouldRetry) != tc.shouldRetry {
				t.Fatalf("%d %s %s Retry-After %q gate %q x-should-retry %q", rec.Code, typ, code,
					h.Get("Retry-After"), h.Get(frontdoor.HeaderGate), h.Get(frontdoor.HeaderShouldRetry))
			}
		})
	}
	for _, err := range []error{context.Canceled, fmt.Errorf("caller: %w", context.Canceled), &dispatcher.GroupError{Code: schemas.ErrCanceled}} {
		if f := frontdoor.FailureFor(err); f != nil {
			t.Errorf("FailureFor(%v) = %+v, want nothing written for a departed caller", err, f)
		}
	}
}

func TestHTTPStreamSendsHedgeHeadersWhenTheCommitIsKnownBeforeTheFirstByte(t *testing.T) {
	rec := httptest.NewRecorder()
	s := openAIDialect{}.stream(rec, "general", time.Unix(1, 0), false)
	resp := &dispatcher.Response{GroupID: "g-1", Attempts: 2, Hedged: true, WinnerRoute: "b", Gate: "g-1/2/1", FinishReason: "stop"}
	s.(dispatcher.CommitSink).Committed(resp)
	if err := s.Delta(dispatcher.Delta{Content: "hi"}); err != nil {
		t.Fatal(err)
	}
	if err := s.finish(resp); err != nil {
		t.Fatal(err)
	}
	h := rec.Header()
	if h.Get(frontdoor.HeaderHedged) != "true" || h.Get(frontdoor.HeaderWinnerRoute) != "b" || h.Get("Trailer") != "" {
		t.Fatalf("headers %v", h)
	}
	events := sseEvents(t, rec.Body)
	if len(events) != 4 || !strings.Contains(events[0], `"id":"chatcmpl-g-1"`) || events[3] != "[DONE]" {
		t.Fatalf("events %q", events)
	}
}

func TestHTTPStreamWithoutAnEarlyCommitSendsHedgeTrailers(t *testing.T) {
	srv, _ := scripted(t, frontdoortest.Answer(&dispatcher.Response{
		GroupID: "g-2", Content: "hi", FinishReason: "stop", Attempts: 1, WinnerRoute: "a", Gate: "g-2/1/1",
	}, false, dispatcher.Delta{Content: "hi"}), Options{})
	resp := post(t, context.Background(), srv.URL, chatBody(true, ""), nil)
	defer resp.Body.Close()
	events := sseEvents(t, resp.Body)
	if len(events) != 4 || events[3] != "[DONE]" || resp.Header.Get(frontdoor.HeaderWinnerRoute) != "" {
		t.Fatalf("events %q, headers %v", events, resp.Header)
	}
	if resp.Trailer.Get(frontdoor.HeaderWinnerRoute) != "a" || resp.Trailer.Get(frontdoor.HeaderGate) != "g-2/1/1" {
		t.Fatalf("trailers %v: want the hedge values after the last event", resp.Trailer)
	}
}

func TestHTTPStreamFailingAfterItsFirstByteEndsWithAnErrorEventAndNoDone(t *testing.T) {
	srv, _ := scripted(t, frontdoortest.Fail(&dispatcher.GroupError{Code: schemas.ErrAllRoutesFailed, Streamed: true},
		dispatcher.Delta{Content: "partial"}), Options{})
	resp := post(t, context.Background(), srv.URL, chatBody(true, ""), nil)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	events := sseEvents(t, strings.NewReader(string(raw)))
	last := events[len(events)-1]
	if resp.StatusCode != http.StatusOK || len(events) != 3 || !strings.HasPrefix(last, `{"error":`) || strings.Contains(string(raw), "[DONE]") {
		t.Fatalf("status %d events %q", resp.StatusCode, events)
	}
	if _, code, _ := openAIErrorOf(t, []byte(last)); code != "all_routes_failed" {
		t.Fatalf("error event %s", last)
	}
}

func TestHTTPRequestBodyMapsOntoTheCanonicalRequest(t *testing.T) {
	body := `{"model":"general","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],
		"max_tokens":10,"max_completion_tokens":20,"temperature":0.5,"top_p":0.9,"stop":"END","seed":7,
		"presence_penalty":0.1,"frequency_penalty":-0.1,"tools":[{"type":"function","function":{"name":"f"}}],
		"tool_choice":"auto","response_format":{"type":"json_object"},"stream":true,"stream_options":{"include_usage":true},
		"n":1,"user":"u-1","logit_bias":{"1":2},"parallel_tool_calls":false,"x_vendor":{"a":[1, null]}}`
	pool, req, includeUsage, f := parseChatRequest([]byte(body))
	if f != nil {
		t.Fatalf("parse: %+v", f)
	}
	if pool != "general" || req.Model != "general" || !includeUsage || !req.Stream || len(req.Messages) != 2 {
		t.Fatalf("pool %q include_usage %t request %+v", pool, includeUsage, req)
	}
	if req.MaxTokens != 20 || *req.Temperature != 0.5 || *req.TopP != 0.9 || *req.Seed != 7 || *req.PresencePenalty != 0.1 ||
		*req.FrequencyPenalty != -0.1 || fmt.Sprint(req.Stop) != "[END]" {
		t.Fatalf("parameters %+v", req)
	}
	if string(req.ToolChoice) != `"auto"` || string(req.ResponseFormat) != `{"type":"json_object"}` || !strings.Contains(string(req.Tools), `"name":"f"`) {
		t.Fatalf("raw parameters %s %s %s", req.Tools, req.ToolChoice, req.ResponseFormat)
	}
	if text, err := req.Messages[1].Text(); err != nil || text != "hi" {
		t.Fatalf("content parts: %q %v", text, err)
	}
	// Every member the door does not type goes to the route as sent; the
	// cap keeps its name, and the max_tokens it supersedes goes along.
	if req.Dialect != schemas.DialectOpenAI || req.MaxTokensField != schemas.ParamMaxCompletionTokens || req.ParallelToolCalls == nil || *req.ParallelToolCalls {
		t.Fatalf("dialect %q, cap name %q, parallel_tool_calls %v", req.Dialect, req.MaxTokensField, req.ParallelToolCalls)
	}
	wantExtra := map[string]string{"n": `1`, "user": `"u-1"`, "logit_bias": `{"1":2}`, "x_vendor": `{"a":[1, null]}`, "max_tokens": `10`}
	if len(req.Extra) != len(wantExtra) {
		t.Fatalf("extra members %v, want %v", req.ExtraNames(), wantExtra)
	}
	for name, want := range wantExtra {
		if string(req.Extra[name]) != want {
			t.Errorf("extra %s = %s, want %s", name, req.Extra[name], want)
		}
	}
	// stream_options without stream asks for nothing.
	_, _, includeUsage, f = parseChatRequest([]byte(`{"model":"general","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}`))
	if f != nil || includeUsage {
		t.Fatalf("include_usage %t, err %+v", includeUsage, f)
	}
}
