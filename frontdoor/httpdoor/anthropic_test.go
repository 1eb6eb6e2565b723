package httpdoor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/ssestream"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/schemas"
)

func postMessages(t *testing.T, url, body string, headers map[string]string) *http.Response {
	t.Helper()
	h := map[string]string{"Anthropic-Version": "2023-06-01"}
	for k, v := range headers {
		h[k] = v
	}
	return frontdoortest.Post(t, context.Background(), url+"/v1/messages", body, h)
}

var anthropicErrorType = frontdoortest.AnthropicErrorType

// collapseDeltas joins event types with runs of content_block_delta
// written once.
func collapseDeltas(types []string) string {
	var out []string
	for _, t := range types {
		if t == "content_block_delta" && len(out) > 0 && out[len(out)-1] == t {
			continue
		}
		out = append(out, t)
	}
	return strings.Join(out, ",")
}

// headerOrTrailer reads an X-Hedgerow-* value from the headers, or from
// the trailers of a stream whose commit came after its headers.
func headerOrTrailer(resp *http.Response, name string) string {
	if v := resp.Header.Get(name); v != "" {
		return v
	}
	return resp.Trailer.Get(name)
}

// sdkMessage decodes a Message body with the official SDK's type.
func sdkMessage(t *testing.T, body []byte) anthropic.Message {
	t.Helper()
	var m anthropic.Message
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("message %s: %v", body, err)
	}
	return m
}

// accumulate reads a Messages event stream with the official SDK's decoder
// and accumulator, and returns the message and every event's type.
func accumulate(t *testing.T, resp *http.Response) (anthropic.Message, []string, error) {
	t.Helper()
	stream := ssestream.NewStream[anthropic.MessageStreamEventUnion](ssestream.NewDecoder(resp), nil)
	defer stream.Close()
	var m anthropic.Message
	var types []string
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
		if err := m.Accumulate(ev); err != nil {
			t.Fatalf("accumulate %s: %v", ev.Type, err)
		}
	}
	return m, types, stream.Err()
}

func TestMessagesDoorAnswersAMessageWithUsageAndHedgeHeaders(t *testing.T) {
	srv, sub := scripted(t, frontdoortest.Answer(&dispatcher.Response{
		GroupID: "g-1", Content: "a0 a1 a2 ", Usage: schemas.Usage{InputUnits: 10, OutputUnits: 3},
		Attempts: 1, Winner: 1, WinnerRoute: "a", Gate: "g-1/1/1",
	}, false), Options{})
	resp := postMessages(t, srv.URL, messagesRequest(false, ""), nil)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d (%s): %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	route := resp.Header.Get(frontdoor.HeaderWinnerRoute)
	m := sdkMessage(t, body)
	if m.ID != "msg_g-1" || m.Role != "assistant" || m.Model != "general" || m.StopReason != anthropic.StopReasonEndTurn {
		t.Fatalf("message %s", body)
	}
	if len(m.Content) != 1 || m.Content[0].Type != "text" || m.Content[0].Text != route+"0 "+route+"1 "+route+"2 " {
		t.Fatalf("content %s, want route %q's three words", body, route)
	}
	if m.Usage.InputTokens != 10 || m.Usage.OutputTokens != 3 {
		t.Fatalf("usage %+v, want the provider's 10 in, 3 out", m.Usage)
	}
	if resp.Header.Get(frontdoor.HeaderAttempts) != "1" || resp.Header.Get(frontdoor.HeaderHedged) != "false" || resp.Header.Get(frontdoor.HeaderGate) == "" {
		t.Fatalf("hedge headers %v", resp.Header)
	}
	if subs := sub.Submissions(); len(subs) != 1 || subs[0].Pool != "general" || subs[0].Request.MaxTokens != 50 {
		t.Fatalf("submissions %+v", subs)
	}
}

func TestMessagesDoorErrorsAreAnthropicErrorObjects(t *testing.T) {
	tests := []struct {
		name    string
		fail    error // what the runtime answers, when set
		limit   int64
		method  string
		body    string
		headers map[string]string
		status  int
		typ     string
	}{
		{name: "an unknown model", body: strings.Replace(messagesRequest(false, ""), `"general"`, `"nope"`, 1), status: 404, typ: "not_found_error"},
		{name: "malformed JSON", body: `{"model":"general","messages":[`, status: 400, typ: "invalid_request_error"},
		{name: "no max_tokens", body: `{"model":"general","messages":[{"role":"user","content":"x"}]}`, status: 400, typ: "invalid_request_error"},
		{name: "max_tokens of zero", body: strings.Replace(messagesRequest(false, ""), `"max_tokens":50`, `"max_tokens":0`, 1), status: 400, typ: "invalid_request_error"},
		{name: "no messages", body: `{"model":"general","max_tokens":5,"messages":[]}`, status: 400, typ: "invalid_request_error"},
		{name: "a system role in messages", body: `{"model":"general","max_tokens":5,"messages":[{"role":"system","content":"x"}]}`, status: 400, typ: "invalid_request_error"},
		{name: "a temperature above 1", body: messagesRequest(false, `"temperature":1.5`), status: 400, typ: "invalid_request_error"},
		{name: "a document block", body: `{"model":"general","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"x"}}]}]}`,
			status: 400, typ: "invalid_request_error"},
		{name: "a server tool", body: messagesRequest(false, `"tools":[{"type":"web_search_20250305","name":"web_search"}]`), status: 400, typ: "invalid_request_error"},
		{name: "a bad deadline header", body: messagesRequest(false, ""), headers: map[string]string{frontdoor.HeaderDeadlineMs: "soon"}, status: 400, typ: "invalid_request_error"},
		{name: "a body over the limit", limit: 1024, body: messagesRequest(false, `"metadata":{"pad":"`+strings.Repeat("x", 2048)+`"}`), status: 413, typ: "request_too_large"},
		{name: "a wrong method", method: http.MethodGet, status: 405, typ: "invalid_request_error"},
		{name: "a stream failing before its first byte", fail: &dispatcher.GroupError{Code: schemas.ErrDeadlineExceeded}, body: messagesRequest(true, ""),
			status: 504, typ: "timeout_error"},
		{name: "no healthy route", fail: &dispatcher.GroupError{Code: schemas.ErrNoRoute}, body: messagesRequest(false, ""), status: 529, typ: "overloaded_error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			answer := frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false)
			if tc.fail != nil {
				answer = frontdoortest.Fail(tc.fail)
			}
			srv, _ := scripted(t, answer, Options{BodyLimit: tc.limit})
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			resp, body := frontdoortest.Do(t, method, srv.URL+"/v1/messages", tc.body, tc.headers)
			if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d (%s), want %d: %s", resp.StatusCode, resp.Header.Get("Content-Type"), tc.status, body)
			}
			if typ := anthropicErrorType(t, body); typ != tc.typ {
				t.Fatalf("error type %q, want %q: %s", typ, tc.typ, body)
			}
			if strings.Contains(string(body), prompt) || strings.Contains(string(body), "soon") {
				t.Fatalf("error body %s echoes the request", body)
			}
		})
	}
}

func TestMessagesDoorTakesTheKeyFromXAPIKey(t *testing.T) {
	const key = "sk-hedgerow-tenant-key"
	srv, sub := scripted(t, frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false), Options{
		Keyring: frontdoor.NewKeyring(map[string][]string{"tenant": {policy.HashAPIKey(key)}}),
	})
	for _, tc := range []struct {
		name    string
		headers map[string]string
		status  int
	}{
		{"no key", nil, 401},
		{"a wrong key", map[string]string{"X-Api-Key": "sk-wrong"}, 401},
		{"the key in x-api-key", map[string]string{"X-Api-Key": key}, 200},
		{"the key as a bearer token", map[string]string{"Authorization": "Bearer " + key}, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := postMessages(t, srv.URL, messagesRequest(false, ""), tc.headers)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if tc.status == 401 {
				if typ := anthropicErrorType(t, body); typ != "authentication_error" || strings.Contains(string(body), "sk-wrong") {
					t.Fatalf("401 body %s", body)
				}
			}
		})
	}
	for _, s := range sub.Submissions() {
		if s.Tenant != "tenant" {
			t.Errorf("submission of tenant %q, want the key's tenant", s.Tenant)
		}
	}
}

func TestMessagesDoorMapsDispatcherErrorsToAnthropicStatusesAndTypes(t *testing.T) {
	tests := []struct {
		err        error
		status     int
		typ        string
		retryAfter string
		noRetry    bool
	}{
		{&dispatcher.GroupError{Code: schemas.ErrDeadlineExceeded}, 504, "timeout_error", "", false},
		{&dispatcher.GroupError{Code: schemas.ErrAlreadyCommitted, Holder: "g1/2/7"}, 409, "invalid_request_error", "", true},
		{&dispatcher.GroupError{Code: schemas.ErrRateLimited}, 429, "rate_limit_error", "1", false},
		{&dispatcher.GroupError{Code: schemas.ErrBudgetExhausted}, 429, "rate_limit_error", "", true},
		{&dispatcher.GroupError{Code: schemas.ErrAllRoutesFailed}, 503, "api_error", "1", false},
		{&dispatcher.GroupError{Code: schemas.ErrNoRoute}, 529, "overloaded_error", "1", false},
		{&dispatcher.GroupError{Code: schemas.ErrGateUnavailable}, 503, "api_error", "1", false},
		{&dispatcher.GroupError{Code: schemas.ErrStreamInterrupted}, 502, "api_error", "", false},
		{&dispatcher.GroupError{Code: schemas.ErrOverloaded, RetryAfter: time.Second}, 529, "overloaded_error", "1", false},
		{&dispatcher.GroupError{Code: schemas.ErrRouteFailed}, 502, "api_error", "", true},
		{&dispatcher.GroupError{Code: schemas.ErrInvalidRequest, Scope: schemas.ScopeGroup}, 400, "invalid_request_error", "", true},
		{fmt.Errorf("%w: x", dispatcher.ErrBadRequest), 400, "invalid_request_error", "", true},
		{fmt.Errorf("%w: %q", dispatcher.ErrUnknownPool, "x"), 404, "not_found_error", "", true},
		{dispatcher.ErrShuttingDown, 503, "api_error", "1", false},
		{errors.New("surprise"), 500, "api_error", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.err.Error(), func(t *testing.T) {
			rec := httptest.NewRecorder()
			anthropicDialect{}.writeFailure(rec, frontdoor.FailureFor(tc.err))
			typ := anthropicErrorType(t, rec.Body.Bytes())
			if rec.Code != tc.status || typ != tc.typ || rec.Header().Get("Retry-After") != tc.retryAfter ||
				rec.Header().Get(frontdoor.HeaderShouldRetry) != strconv.FormatBool(!tc.noRetry) {
				t.Fatalf("%d %s Retry-After %q x-should-retry %q", rec.Code, typ, rec.Header().Get("Retry-After"), rec.Header().Get(frontdoor.HeaderShouldRetry))
			}
		})
	}
}

func TestMessagesRequestMapsOntoTheCanonicalRequest(t *testing.T) {
	body := `{"model":"general","max_tokens":64,"stream":true,"temperature":0.3,"top_p":0.8,"top_k":5,
		"stop_sequences":["END"],"metadata":{"user_id":"u"},
		"system":[{"type":"text","text":"Be brief."},{"type":"text","text":"Use French."}],
		"messages":[
		  {"role":"user","content":[{"type":"text","text":"Weather in this city?"},
		    {"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]},
		  {"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s"},{"type":"text","text":"Checking."},
		    {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city": "Paris"}}]},
		  {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"18C"},{"type":"text","text":"Thanks"}]}],
		"tools":[{"name":"get_weather","description":"Weather now","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],
		"tool_choice":{"type":"tool","name":"get_weather"}}`
	pool, req, f := parseMessagesRequest([]byte(body))
	if f != nil {
		t.Fatalf("parse: %+v", f)
	}
	if pool != "general" || req.Model != "general" || req.MaxTokens != 64 || !req.Stream || *req.Temperature != 0.3 || *req.TopP != 0.8 ||
		fmt.Sprint(req.Stop) != "[END]" {
		t.Fatalf("parameters %+v", req)
	}
	want := []struct {
		role                     schemas.MessageRole
		content, calls, toolCall string
	}{
		{schemas.MessageSystem, `[{"type":"text","text":"Be brief."},{"type":"text","text":"Use French."}]`, "", ""},
		{schemas.MessageUser, `[{"type":"text","text":"Weather in this city?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]`, "", ""},
		{schemas.MessageAssistant, `[{"type":"text","text":"Checking."}]`, `[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]`, ""},
		{schemas.MessageTool, `"18C"`, "", "toolu_1"},
		{schemas.MessageUser, `[{"type":"text","text":"Thanks"}]`, "", ""},
	}
	if len(req.Messages) != len(want) {
		t.Fatalf("%d messages, want %d: %+v", len(req.Messages), len(want), req.Messages)
	}
	for i, w := range want {
		m := req.Messages[i]
		if m.Role != w.role || string(m.Content) != w.content || string(m.ToolCalls) != w.calls || m.ToolCallID != w.toolCall {
			t.Errorf("message %d = {%s %s %s %s}, want %+v", i, m.Role, m.Content, m.ToolCalls, m.ToolCallID, w)
		}
	}
	wantTools := `[{"type":"function","function":{"name":"get_weather","description":"Weather now","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`
	if string(req.Tools) != wantTools || string(req.ToolChoice) != `{"function":{"name":"get_weather"},"type":"function"}` {
		t.Fatalf("tools %s, tool_choice %s", req.Tools, req.ToolChoice)
	}
	for choice, want := range map[string]string{`{"type":"auto"}`: `"auto"`, `{"type":"any"}`: `"required"`, `{"type":"none"}`: `"none"`} {
		got, _, aerr := openAIToolChoice(json.RawMessage(choice))
		if aerr != nil || string(got) != want {
			t.Errorf("tool_choice %s = %s (%v), want %s", choice, got, aerr, want)
		}
	}
	// A plain string system prompt and string content stay strings.
	_, req, f = parseMessagesRequest([]byte(`{"model":"general","max_tokens":5,"system":"Be brief.","messages":[{"role":"user","content":"hi"}]}`))
	if f != nil || string(req.Messages[0].Content) != `"Be brief."` || string(req.Messages[1].Content) != `"hi"` {
		t.Fatalf("messages %+v (%v)", req.Messages, f)
	}
}

func TestMessagesAnswerCarriesToolUseBlocksAndStopReasons(t *testing.T) {
	resp := &dispatcher.Response{GroupID: "g-1", Content: "Checking.", FinishReason: "tool_calls",
		ToolCalls: []byte(`[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},` +
			`{"id":"toolu_2","type":"function","function":{"name":"cut","arguments":"{\"a\":"}}]`),
		Usage: schemas.Usage{InputUnits: 7, OutputUnits: 9}}
	m := sdkMessage(t, mustJSON(newMessage(resp, "general")))
	if m.ID != "msg_g-1" || m.StopReason != anthropic.StopReasonToolUse || len(m.Content) != 3 || m.Usage.OutputTokens != 9 {
		t.Fatalf("message %+v", m)
	}
	if m.Content[0].Text != "Checking." || m.Content[1].Type != "tool_use" || m.Content[1].ID != "toolu_1" ||
		string(m.Content[1].Input) != `{"city":"Paris"}` || string(m.Content[2].Input) != `{}` {
		t.Fatalf("content %+v", m.Content)
	}
	for finish, want := range map[string]string{"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
		"content_filter": "refusal", "pause_turn": "pause_turn", "": "end_turn"} {
		if got := stopReason(&dispatcher.Response{FinishReason: finish}); got != want {
			t.Errorf("stopReason(%q) = %q, want %q", finish, got, want)
		}
	}
}

// recordedStream is a Messages stream written to a recorder, read back as
// the response to a POST /v1/messages a client would get.
func recordedStream(rec *httptest.ResponseRecorder) *http.Response {
	res := rec.Result()
	res.Header.Set("Content-Type", "text/event-stream")
	res.Request = httptest.NewRequest(http.MethodPost, "/v1/messages", nil)
	return res
}

func TestMessagesStreamWritesTextAndToolUseBlocksTheSDKAccumulates(t *testing.T) {
	rec := httptest.NewRecorder()
	s := anthropicDialect{}.stream(rec, "general", time.Time{}, false).(*messagesStream)
	resp := &dispatcher.Response{GroupID: "g-2", Attempts: 1, WinnerRoute: "a", Gate: "g-2/1/1", FinishReason: "tool_calls", Usage: schemas.Usage{InputUnits: 5, OutputUnits: 8}}
	s.Committed(resp)
	for _, d := range []dispatcher.Delta{
		{Content: "Let me "},
		{Content: "check."},
		{ToolCalls: []byte(`[{"index":0,"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":""}}]`)},
		{ToolCalls: []byte(`[{"index":0,"function":{"arguments":"{\"city\":"}}]`)},
		{ToolCalls: []byte(`[{"index":0,"function":{"arguments":"\"Paris\"}"}}]`)},
		{ToolCalls: []byte(`[{"index":1,"id":"toolu_2","type":"function","function":{"name":"get_time","arguments":"{}"}}]`)},
	} {
		if err := s.Delta(d); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.finish(resp); err != nil {
		t.Fatal(err)
	}
	if rec.Header().Get(frontdoor.HeaderWinnerRoute) != "a" || rec.Header().Get("Trailer") != "" {
		t.Fatalf("headers %v, want the hedge values as headers", rec.Header())
	}
	m, types, err := accumulate(t, recordedStream(rec))
	if err != nil {
		t.Fatal(err)
	}
	want := "message_start,content_block_start,content_block_delta,content_block_delta,content_block_stop," +
		"content_block_start,content_block_delta,content_block_delta,content_block_stop," +
		"content_block_start,content_block_delta,content_block_stop,message_delta,message_stop"
	if strings.Join(types, ",") != want {
		t.Fatalf("events %v\nwant %s", types, want)
	}
	if m.ID != "msg_g-2" || len(m.Content) != 3 || m.Content[0].Text != "Let me check." || m.StopReason != anthropic.StopReasonToolUse ||
		m.Usage.InputTokens != 5 || m.Usage.OutputTokens != 8 {
		t.Fatalf("accumulated %+v", m)
	}
	if c := m.Content[1]; c.Type != "tool_use" || c.ID != "toolu_1" || c.Name != "get_weather" || string(c.Input) != `{"city":"Paris"}` {
		t.Fatalf("first tool %+v input %s", c, c.Input)
	}
	if c := m.Content[2]; c.Name != "get_time" || string(c.Input) != `{}` {
		t.Fatalf("second tool %+v input %s", c, c.Input)
	}
}

func TestMessagesStreamFailingAfterItsFirstByteEndsWithAnErrorEvent(t *testing.T) {
	rec := httptest.NewRecorder()
	s := anthropicDialect{}.stream(rec, "general", time.Time{}, false).(*messagesStream)
	if err := s.Delta(dispatcher.Delta{Content: "partial"}); err != nil {
		t.Fatal(err)
	}
	if err := s.fail(frontdoor.FailureFor(&dispatcher.GroupError{Code: schemas.ErrAllRoutesFailed, Streamed: true})); err != nil {
		t.Fatal(err)
	}
	if rec.Header().Get("Trailer") == "" {
		t.Errorf("no trailers declared for a stream whose commit came after its first byte")
	}
	_, types, err := accumulate(t, recordedStream(rec))
	var aerr *anthropic.Error
	if !errors.As(err, &aerr) || aerr.Type() != "api_error" || strings.Contains(strings.Join(types, ","), "message_stop") {
		t.Fatalf("events %v, error %v (%T): want the SDK to see a typed api_error and no message_stop", types, err, err)
	}
	sc := bufio.NewScanner(strings.NewReader(rec.Body.String()))
	var last string
	for sc.Scan() {
		if sc.Text() != "" {
			last = sc.Text()
		}
	}
	if !strings.HasPrefix(last, `data: {"type":"error","error":{"type":"api_error"`) {
		t.Fatalf("last line %q, want the error event", last)
	}
}

func TestMessagesRequestCarriesItsOtherMembersAsSent(t *testing.T) {
	body := `{"model":"general","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"top_k":4,
		"metadata":{"user_id":"u-1"},"thinking":{"type":"enabled","budget_tokens":1024},"x_beta":[1],
		"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"auto","disable_parallel_tool_use":true}}`
	_, req, f := parseMessagesRequest([]byte(body))
	if f != nil {
		t.Fatalf("parse: %+v", f)
	}
	if req.Dialect != schemas.DialectAnthropic || req.ParallelToolCalls == nil || *req.ParallelToolCalls || string(req.ToolChoice) != `"auto"` {
		t.Fatalf("dialect %q, parallel_tool_calls %v, tool_choice %s", req.Dialect, req.ParallelToolCalls, req.ToolChoice)
	}
	want := map[string]string{"top_k": `4`, "metadata": `{"user_id":"u-1"}`, "thinking": `{"type":"enabled","budget_tokens":1024}`, "x_beta": `[1]`}
	if len(req.Extra) != len(want) {
		t.Fatalf("extra members %v, want %v", req.ExtraNames(), want)
	}
	for name, w := range want {
		if string(req.Extra[name]) != w {
			t.Errorf("extra %s = %s, want %s", name, req.Extra[name], w)
		}
	}
}

// message_start reports the input tokens the commit carries (the
// dispatcher's estimate while the winner's count is not in), and
// message_delta the winner's count, which the SDK's accumulated message
// ends with.
func TestMessagesStreamStartReportsTheCommitsInputTokens(t *testing.T) {
	rec := httptest.NewRecorder()
	s := anthropicDialect{}.stream(rec, "general", time.Time{}, false).(*messagesStream)
	s.Committed(&dispatcher.Response{GroupID: "g-3", Attempts: 1, WinnerRoute: "a", Gate: "g-3/1/1",
		Usage: schemas.Usage{InputUnits: 12, Estimated: true}})
	if err := s.Delta(dispatcher.Delta{Content: "Hello."}); err != nil {
		t.Fatal(err)
	}
	if err := s.finish(&dispatcher.Response{GroupID: "g-3", Attempts: 1, WinnerRoute: "a", Gate: "g-3/1/1", FinishReason: "stop",
		Usage: schemas.Usage{InputUnits: 15, OutputUnits: 2}}); err != nil {
		t.Fatal(err)
	}
	var start struct {
		Message struct {
			Usage struct {
				InputTokens  *int64 `json:"input_tokens"`
				OutputTokens *int64 `json:"output_tokens"`
			} `json:"usage"`
		} `json:"message"`
	}
	body := rec.Body.String()
	_, after, ok := strings.Cut(body, "event: message_start\ndata: ")
	line, _, _ := strings.Cut(after, "\n")
	if !ok || json.Unmarshal([]byte(line), &start) != nil || start.Message.Usage.InputTokens == nil ||
		*start.Message.Usage.InputTokens != 12 || start.Message.Usage.OutputTokens == nil || *start.Message.Usage.OutputTokens != 0 {
		t.Fatalf("message_start %q, want usage input_tokens 12, output_tokens 0\n%s", line, body)
	}
	m, _, err := accumulate(t, recordedStream(rec))
	if err != nil {
		t.Fatal(err)
	}
	if m.Usage.InputTokens != 15 || m.Usage.OutputTokens != 2 {
		t.Errorf("accumulated usage %+v, want the winner's 15 in, 2 out", m.Usage)
	}
}
