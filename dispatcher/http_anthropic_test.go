package dispatcher

import (
	"bufio"
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

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/ssestream"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/worker"
	"github.com/hedgerow/hedgerow/worker/upstream"
)

// messagesProvider is a real Anthropic Messages server whose answers a
// script decides, as provider is for the OpenAI dialect.
type messagesProvider struct {
	srv     *httptest.Server
	script  *script
	route   string
	arrived chan string
	gone    chan string
}

// pushbackSeconds is the Retry-After of a scripted 429 or 529: long enough
// that no test outlives it.
const pushbackSeconds = "30"

func newMessagesProvider(t *testing.T, route string, sc *script) *messagesProvider {
	p := &messagesProvider{script: sc, route: route, arrived: make(chan string, 1024), gone: make(chan string, 64)}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *messagesProvider) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	if r.URL.Path != "/v1/messages" {
		http.NotFound(w, r)
		return
	}
	notify(p.arrived, p.route)
	b := p.script.take()
	if b.status != 0 {
		typ := map[int]string{400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error", 529: "overloaded_error"}[b.status]
		if b.status == 429 || b.status == 529 {
			w.Header().Set("Retry-After", pushbackSeconds)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(b.status)
		fmt.Fprintf(w, `{"type":"error","error":{"type":%q,"message":"scripted"}}`, typ)
		return
	}
	if b.hang {
		<-r.Context().Done()
		notify(p.gone, p.route)
		return
	}
	t := time.NewTimer(b.firstByte)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		notify(p.gone, p.route)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	ev := func(name, data string) {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, data)
		fl.Flush()
	}
	words := max(b.words, 1)
	ev("message_start", `{"type":"message_start","message":{"id":"msg_x","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1}}}`)
	ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
	for i := range words {
		ev("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"%s%d "}}`, p.route, i))
	}
	ev("content_block_stop", `{"type":"content_block_stop","index":0}`)
	ev("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":%d}}`, words))
	ev("message_stop", `{"type":"message_stop"}`)
}

// messagesCluster is NATS, a worker per Anthropic route, a dispatcher with
// pool "general" over the routes, and the HTTP front door.
type messagesCluster struct {
	url       string
	providers map[string]*messagesProvider
}

// newMessagesCluster starts routes a and b as Anthropic routes sharing sc
// (nil: the routes have no workers). extraYAML is appended to the config.
func newMessagesCluster(t *testing.T, sc *script, extraYAML string, opts HTTPOptions) *messagesCluster {
	t.Helper()
	ns := startNATS(t)
	mc := &messagesCluster{providers: map[string]*messagesProvider{}}
	var y strings.Builder
	y.WriteString("routes:\n")
	for _, r := range []string{"a", "b"} {
		url := "http://127.0.0.1:1"
		if sc != nil {
			p := newMessagesProvider(t, r, sc)
			mc.providers[r], url = p, p.srv.URL
		}
		fmt.Fprintf(&y, "  - {name: %s, provider: anthropic, base_url: %q, model: claude-m, labels: {provider: %s}}\n", r, url, r)
	}
	y.WriteString("pools:\n  general:\n    routes: [a, b]\n")
	y.WriteString(policyYAML + extraYAML)
	cfg, err := config.Parse("messages.yaml", []byte(y.String()), config.RoleServe, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("config: %v\n%s", err, y.String())
	}
	for _, r := range cfg.Routes {
		if mc.providers[r.Name] == nil {
			continue
		}
		up, err := upstream.NewAnthropic(upstream.AnthropicConfig{Config: upstream.Config{BaseURL: r.BaseURL, Model: r.Model}})
		if err != nil {
			t.Fatal(err)
		}
		w, err := worker.New(worker.Config{Route: r.Name, Upstream: up, Conn: connect(t, ns), HeartbeatInterval: 50 * time.Millisecond, Logger: testLogger()})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = w.Stop(ctx)
		})
	}
	gate, err := arbiter.NewLocalGate(arbiter.LocalGateConfig{})
	if err != nil {
		t.Fatal(err)
	}
	nc := connect(t, ns)
	d, err := New(withConfig(Config{Conn: nc, Store: budgets.NewMemory(nil), Gate: gate, Logger: testLogger()}, cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Close(ctx); err != nil {
			t.Errorf("dispatcher close: %v", err)
		}
	})
	opts.Conn, opts.Pools = nc, PoolRoutes(d.pools)
	h, err := NewHTTPHandler(d, opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	mc.url = srv.URL
	return mc
}

// messagesRequest is a Messages request for pool general asking prompt.
func messagesRequest(stream bool, extra string) string {
	s := fmt.Sprintf(`{"model":"general","max_tokens":50,"messages":[{"role":"user","content":%q}],"stream":%t`, prompt, stream)
	if extra != "" {
		s += "," + extra
	}
	return s + "}"
}

func postMessages(t *testing.T, url, body string, headers map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/messages", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST /v1/messages: %v", err)
	}
	return resp
}

// anthropicErrorType checks body is an Anthropic error object — type
// "error", an error with a type and a message — and returns its type.
func anthropicErrorType(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Type != "error" || e.Error.Type == "" || e.Error.Message == "" {
		t.Fatalf("body %s is not an Anthropic error object", body)
	}
	return e.Error.Type
}

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
	mc := newMessagesCluster(t, newScript(behaviour{words: 3}), "", HTTPOptions{})
	resp := postMessages(t, mc.url, messagesRequest(false, ""), nil)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d (%s): %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	route := resp.Header.Get(HeaderWinnerRoute)
	m := sdkMessage(t, body)
	if !strings.HasPrefix(m.ID, "msg_") || m.Role != "assistant" || m.Model != "general" || m.StopReason != anthropic.StopReasonEndTurn {
		t.Fatalf("message %s", body)
	}
	if len(m.Content) != 1 || m.Content[0].Type != "text" || m.Content[0].Text != route+"0 "+route+"1 "+route+"2 " {
		t.Fatalf("content %s, want route %q's three words", body, route)
	}
	if m.Usage.InputTokens != 10 || m.Usage.OutputTokens != 3 {
		t.Fatalf("usage %+v, want the provider's 10 in, 3 out", m.Usage)
	}
	if resp.Header.Get(HeaderAttempts) != "1" || resp.Header.Get(HeaderHedged) != "false" || resp.Header.Get(HeaderGate) == "" {
		t.Fatalf("hedge headers %v", resp.Header)
	}
}

func TestMessagesDoorStreamsOnlyTheHedgeWinnerOverAnthropicRoutes(t *testing.T) {
	// The primary hangs: after the hedge delay, the other route wins.
	mc := newMessagesCluster(t, newScript(behaviour{words: 4}, behaviour{hang: true}), "", HTTPOptions{})
	resp := postMessages(t, mc.url, messagesRequest(true, ""), nil)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	m, types, err := accumulate(t, resp)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	// Workers coalesce chunks, so the number of deltas varies.
	want := "message_start,content_block_start,content_block_delta,content_block_stop,message_delta,message_stop"
	if got := collapseDeltas(types); got != want {
		t.Fatalf("events %v, want %s (deltas collapsed)", types, want)
	}
	route := headerOrTrailer(resp, HeaderWinnerRoute)
	loser := map[string]string{"a": "b", "b": "a"}[route]
	if headerOrTrailer(resp, HeaderHedged) != "true" || headerOrTrailer(resp, HeaderAttempts) != "2" || loser == "" {
		t.Fatalf("hedged %q attempts %q winner %q", headerOrTrailer(resp, HeaderHedged), headerOrTrailer(resp, HeaderAttempts), route)
	}
	if len(m.Content) != 1 || m.Content[0].Text != route+"0 "+route+"1 "+route+"2 "+route+"3 " {
		t.Fatalf("accumulated content %+v, want only the winner's words", m.Content)
	}
	if m.StopReason != anthropic.StopReasonEndTurn || m.Usage.InputTokens != 10 || m.Usage.OutputTokens != 4 || !strings.HasPrefix(m.ID, "msg_") {
		t.Fatalf("message %+v", m)
	}
	select {
	case <-mc.providers[loser].gone:
	case <-time.After(10 * time.Second):
		t.Fatalf("the stalled primary on %s was not cancelled", loser)
	}
}

func TestMessagesDoorErrorsAreAnthropicErrorObjects(t *testing.T) {
	tests := []struct {
		name    string
		script  *script // nil: the routes have no workers
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
		{name: "a bad deadline header", body: messagesRequest(false, ""), headers: map[string]string{HeaderDeadlineMs: "soon"}, status: 400, typ: "invalid_request_error"},
		{name: "a body over the limit", limit: 1024, body: messagesRequest(false, `"metadata":{"pad":"`+strings.Repeat("x", 2048)+`"}`), status: 413, typ: "request_too_large"},
		{name: "a wrong method", method: http.MethodGet, status: 405, typ: "invalid_request_error"},
		{name: "a hanging provider past a short deadline", script: newScript(behaviour{hang: true}), body: messagesRequest(false, ""),
			headers: map[string]string{HeaderDeadlineMs: "300"}, status: 504, typ: "timeout_error"},
		{name: "a stream failing before its first byte", script: newScript(behaviour{hang: true}), body: messagesRequest(true, ""),
			headers: map[string]string{HeaderDeadlineMs: "300"}, status: 504, typ: "timeout_error"},
		{name: "routes without workers", body: messagesRequest(false, ""), status: 503, typ: "api_error"},
		{name: "providers rejecting the key", script: newScript(behaviour{status: 401}), body: messagesRequest(false, ""), status: 502, typ: "api_error"},
		{name: "providers rejecting the request", script: newScript(behaviour{status: 400}), body: messagesRequest(false, ""), status: 400, typ: "invalid_request_error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mc := newMessagesCluster(t, tc.script, "", HTTPOptions{BodyLimit: tc.limit})
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			req, err := http.NewRequest(method, mc.url+"/v1/messages", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
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

func TestMessagesDoorPushbackIsRateLimitedThenOverloaded(t *testing.T) {
	// Every route answers 429 with a Retry-After longer than the test: the
	// first request fails rate_limited, and the next finds no route that is
	// not paused.
	mc := newMessagesCluster(t, newScript(behaviour{status: 429}), "", HTTPOptions{})
	for _, want := range []struct {
		status int
		typ    string
	}{{429, "rate_limit_error"}, {529, "overloaded_error"}} {
		resp := postMessages(t, mc.url, messagesRequest(false, ""), nil)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want.status || anthropicErrorType(t, body) != want.typ {
			t.Fatalf("status %d: %s, want %d %s", resp.StatusCode, body, want.status, want.typ)
		}
		if want.status == 429 && resp.Header.Get("Retry-After") == "" {
			t.Errorf("429 without Retry-After")
		}
	}
}

func TestMessagesDoorTakesTheKeyFromXAPIKey(t *testing.T) {
	const key = "sk-hedgerow-tenant-key"
	hash := config.HashAPIKey(key)
	mc := newMessagesCluster(t, newScript(behaviour{words: 2}), "", HTTPOptions{
		TenantByKeyHash: func(h string) (string, bool) { return "tenant", h == hash },
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
			resp := postMessages(t, mc.url, messagesRequest(false, ""), tc.headers)
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
}

func TestMessagesDoorMapsDispatcherErrorsToAnthropicStatusesAndTypes(t *testing.T) {
	tests := []struct {
		err        error
		status     int
		typ        string
		retryAfter string
		noRetry    bool
	}{
		{&GroupError{Code: schemas.ErrDeadlineExceeded}, 504, "timeout_error", "", false},
		{&GroupError{Code: schemas.ErrAlreadyCommitted, Holder: "g1/2/7"}, 409, "invalid_request_error", "", true},
		{&GroupError{Code: schemas.ErrRateLimited}, 429, "rate_limit_error", "1", false},
		{&GroupError{Code: schemas.ErrBudgetExhausted}, 429, "rate_limit_error", "", true},
		{&GroupError{Code: schemas.ErrAllRoutesFailed}, 503, "api_error", "", false},
		{&GroupError{Code: schemas.ErrNoRoute}, 529, "overloaded_error", "", false},
		{&GroupError{Code: schemas.ErrRouteFailed}, 502, "api_error", "", false},
		{&GroupError{Code: schemas.ErrInvalidRequest, Scope: schemas.ScopeGroup}, 400, "invalid_request_error", "", false},
		{fmt.Errorf("%w: x", ErrBadRequest), 400, "invalid_request_error", "", false},
		{fmt.Errorf("%w: %q", ErrUnknownPool, "x"), 404, "not_found_error", "", false},
		{ErrShuttingDown, 503, "api_error", "1", false},
		{errors.New("surprise"), 500, "api_error", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.err.Error(), func(t *testing.T) {
			rec := httptest.NewRecorder()
			writeMessagesError(rec, anthropicErrorFor(errorFor(tc.err)))
			typ := anthropicErrorType(t, rec.Body.Bytes())
			if rec.Code != tc.status || typ != tc.typ || rec.Header().Get("Retry-After") != tc.retryAfter ||
				(rec.Header().Get(headerShouldRetry) == "false") != tc.noRetry {
				t.Fatalf("%d %s Retry-After %q x-should-retry %q", rec.Code, typ, rec.Header().Get("Retry-After"), rec.Header().Get(headerShouldRetry))
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
	pool, req, aerr := parseMessagesRequest([]byte(body))
	if aerr != nil {
		t.Fatalf("parse: %+v", aerr)
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
		got, aerr := openAIToolChoice(json.RawMessage(choice))
		if aerr != nil || string(got) != want {
			t.Errorf("tool_choice %s = %s (%v), want %s", choice, got, aerr, want)
		}
	}
	// A plain string system prompt and string content stay strings.
	_, req, aerr = parseMessagesRequest([]byte(`{"model":"general","max_tokens":5,"system":"Be brief.","messages":[{"role":"user","content":"hi"}]}`))
	if aerr != nil || string(req.Messages[0].Content) != `"Be brief."` || string(req.Messages[1].Content) != `"hi"` {
		t.Fatalf("messages %+v (%v)", req.Messages, aerr)
	}
}

func TestMessagesAnswerCarriesToolUseBlocksAndStopReasons(t *testing.T) {
	resp := &Response{GroupID: "g-1", Content: "Checking.", FinishReason: "tool_calls",
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
		if got := stopReason(&Response{FinishReason: finish}); got != want {
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
	s := &messagesStream{w: rec, rc: http.NewResponseController(rec), model: "general", block: -1}
	resp := &Response{GroupID: "g-2", Attempts: 1, WinnerRoute: "a", Gate: "g-2/1/1", FinishReason: "tool_calls", Usage: schemas.Usage{InputUnits: 5, OutputUnits: 8}}
	s.Committed(resp)
	for _, d := range []Delta{
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
	if rec.Header().Get(HeaderWinnerRoute) != "a" || rec.Header().Get("Trailer") != "" {
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
	s := &messagesStream{w: rec, rc: http.NewResponseController(rec), model: "general", block: -1}
	if err := s.Delta(Delta{Content: "partial"}); err != nil {
		t.Fatal(err)
	}
	if err := s.event("error", anthropicErrorFor(errorFor(&GroupError{Code: schemas.ErrAllRoutesFailed, Streamed: true}))); err != nil {
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
