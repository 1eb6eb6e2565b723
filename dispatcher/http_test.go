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
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/worker"
)

// prompt is distinctive so a test can prove no answer echoes it.
const prompt = "tell-me-the-secret-plan"

func chatBody(stream bool, extra string) string {
	s := fmt.Sprintf(`{"model":"general","messages":[{"role":"user","content":%q}],"max_tokens":50,"stream":%t`, prompt, stream)
	if extra != "" {
		s += "," + extra
	}
	return s + "}"
}

// frontDoor serves d over HTTP with opts, filling the cluster's connection
// and pools when opts leaves them out.
func frontDoor(t *testing.T, c *cluster, d *Dispatcher, opts HTTPOptions) *httptest.Server {
	t.Helper()
	if opts.Conn == nil {
		opts.Conn = c.nc
	}
	if opts.Pools == nil {
		opts.Pools = PoolRoutes(c.d.pools)
	}
	h, err := NewHTTPHandler(d, opts)
	if err != nil {
		t.Fatalf("NewHTTPHandler: %v", err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, ctx context.Context, url, body string, headers map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	return resp
}

func get(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// openAIError checks body is an OpenAI error object — message, type, param
// and code all present — and returns it.
func openAIError(t *testing.T, body []byte) (typ, code, param string) {
	t.Helper()
	var obj map[string]map[string]any
	if err := json.Unmarshal(body, &obj); err != nil || obj["error"] == nil {
		t.Fatalf("body %s is not an OpenAI error object", body)
	}
	e := obj["error"]
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := e[k]; !ok {
			t.Fatalf("error object %s has no %q", body, k)
		}
	}
	if m, _ := e["message"].(string); m == "" {
		t.Fatalf("error object %s has no message", body)
	}
	typ, _ = e["type"].(string)
	code, _ = e["code"].(string)
	param, _ = e["param"].(string)
	return typ, code, param
}

// sseEvents reads a whole event stream: the data of each event.
func sseEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var events []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("stream line %q is not a data line", line)
		}
		events = append(events, data)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read stream: %v", err)
	}
	return events
}

type testChunk struct {
	ID      string           `json:"id"`
	Object  string           `json:"object"`
	Model   string           `json:"model"`
	Choices []map[string]any `json:"choices"`
	Usage   *openAIUsage     `json:"usage"`
}

func TestHTTPNonStreamingAnswerIsAChatCompletionWithUsageAndHedgeHeaders(t *testing.T) {
	c, _ := twoRoutes(t, newScript(behaviour{words: 3}))
	srv := frontDoor(t, c, c.d, HTTPOptions{})
	resp := post(t, context.Background(), srv.URL, chatBody(false, ""), map[string]string{HeaderIdempotencyKey: "action-1"})
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var cc chatCompletion
	if err := json.NewDecoder(resp.Body).Decode(&cc); err != nil {
		t.Fatal(err)
	}
	route := resp.Header.Get(HeaderWinnerRoute)
	if route != "a" && route != "b" {
		t.Fatalf("winner route %q", route)
	}
	if cc.Object != "chat.completion" || !strings.HasPrefix(cc.ID, "chatcmpl-") || cc.Model != "general" || cc.Created == 0 || len(cc.Choices) != 1 {
		t.Fatalf("completion %+v", cc)
	}
	ch := cc.Choices[0]
	if ch.Message.Role != "assistant" || ch.Message.Content == nil || *ch.Message.Content != route+"0 "+route+"1 "+route+"2 " || ch.FinishReason != "stop" {
		t.Fatalf("choice %+v", ch)
	}
	if cc.Usage == nil || *cc.Usage != (openAIUsage{PromptTokens: 10, CompletionTokens: 3, TotalTokens: 13}) {
		t.Fatalf("usage %+v", cc.Usage)
	}
	if resp.Header.Get(HeaderAttempts) != "1" || resp.Header.Get(HeaderHedged) != "false" || resp.Header.Get(HeaderGate) == "" {
		t.Fatalf("hedge headers %v", resp.Header)
	}
}

func TestHTTPStreamCarriesOnlyTheWinnersChunksThenFinishUsageAndDone(t *testing.T) {
	for _, includeUsage := range []bool{true, false} {
		t.Run(fmt.Sprintf("include_usage=%t", includeUsage), func(t *testing.T) {
			// The primary hangs: the hedge on the other route wins.
			c, ps := twoRoutes(t, newScript(behaviour{words: 4}, behaviour{hang: true}))
			srv := frontDoor(t, c, c.d, HTTPOptions{})
			extra := ""
			if includeUsage {
				extra = `"stream_options":{"include_usage":true}`
			}
			resp := post(t, context.Background(), srv.URL, chatBody(true, extra), nil)
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			events := sseEvents(t, resp.Body)
			if len(events) < 4 || events[len(events)-1] != "[DONE]" {
				t.Fatalf("events %q: want role, content, finish (, usage) and [DONE]", events)
			}
			// The dispatcher tells the stream of its commit before the first
			// byte: how the answer was won travels in the headers.
			route := resp.Header.Get(HeaderWinnerRoute)
			loser := map[string]string{"a": "b", "b": "a"}[route]
			if resp.Header.Get(HeaderHedged) != "true" || resp.Header.Get(HeaderAttempts) != "2" || loser == "" ||
				resp.Header.Get(HeaderGate) == "" || resp.Header.Get("Trailer") != "" || len(resp.Trailer) != 0 {
				t.Fatalf("hedge headers %v, trailers %v", resp.Header, resp.Trailer)
			}
			var chunks []testChunk
			for _, e := range events[:len(events)-1] {
				var raw map[string]json.RawMessage
				var ck testChunk
				if json.Unmarshal([]byte(e), &raw) != nil || json.Unmarshal([]byte(e), &ck) != nil {
					t.Fatalf("event %q is not a JSON chunk", e)
				}
				if _, has := raw["usage"]; has != includeUsage {
					t.Fatalf("chunk %s: usage key present = %t, want %t", e, has, includeUsage)
				}
				if ck.Object != "chat.completion.chunk" || ck.Model != "general" || ck.ID == "" || ck.ID != chunks0ID(chunks, ck.ID) {
					t.Fatalf("chunk %s", e)
				}
				chunks = append(chunks, ck)
			}
			if d := chunks[0].Choices[0]["delta"].(map[string]any); d["role"] != "assistant" {
				t.Fatalf("first chunk %+v, want the assistant role", chunks[0])
			}
			body := chunks[1:]
			if includeUsage {
				last := body[len(body)-1]
				if len(last.Choices) != 0 || last.Usage == nil || *last.Usage != (openAIUsage{PromptTokens: 10, CompletionTokens: 4, TotalTokens: 14}) {
					t.Fatalf("usage chunk %+v", last)
				}
				body = body[:len(body)-1]
			}
			finish := body[len(body)-1]
			if finish.Choices[0]["finish_reason"] != "stop" {
				t.Fatalf("finish chunk %+v", finish)
			}
			var text strings.Builder
			for _, ck := range body[:len(body)-1] {
				if ck.Choices[0]["finish_reason"] != nil {
					t.Fatalf("content chunk %+v has a finish reason", ck)
				}
				content, _ := ck.Choices[0]["delta"].(map[string]any)["content"].(string)
				text.WriteString(content)
			}
			if want := route + "0 " + route + "1 " + route + "2 " + route + "3 "; text.String() != want {
				t.Fatalf("streamed %q, want only the winner's %q", text.String(), want)
			}
			waitGone(t, ps[loser]) // the stalled primary was cancelled
		})
	}
}

// chunks0ID is the id every chunk of a stream shares: the first chunk's.
func chunks0ID(chunks []testChunk, id string) string {
	if len(chunks) == 0 {
		return id
	}
	return chunks[0].ID
}

// tightPolicyYAML adds an operation class whose spend ceiling per user
// action is smaller than any request, so admission refuses every one.
const tightPolicyYAML = `
  tight:
    control_fraction: 0
    deadline: 3s
    spend: {per_user_action: 5}
`

// anyValue in an expected header means "present, whatever its value".
const anyValue = "*"

func TestHTTPErrorsAnswerTheirStatusWithAnOpenAIErrorObject(t *testing.T) {
	unknownModel := strings.Replace(chatBody(false, ""), `"general"`, `"nope"`, 1)
	tests := []struct {
		name    string
		script  *script // nil: the routes have no workers
		extra   string  // YAML appended to the cluster's policies
		limit   int64
		tenants bool // require the API key "good-key"
		method  string
		body    string
		headers map[string]string
		// prior is the status an identical request sent first must get.
		prior     int
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
		{name: "a response schema with an external reference", body: chatBody(false, `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"$ref":"http://127.0.0.1:1/s.json"}}}`),
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: "response_format.json_schema.schema"},
		{name: "an unknown operation class", body: chatBody(false, ""), headers: map[string]string{HeaderOperation: "nightly-batch"},
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: HeaderOperation},
		{name: "an idempotency key over its length", body: chatBody(false, ""), headers: map[string]string{HeaderIdempotencyKey: strings.Repeat("k", 256)},
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: HeaderIdempotencyKey},
		{name: "a negative deadline header", body: chatBody(false, ""), headers: map[string]string{HeaderDeadlineMs: "-5"},
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: HeaderDeadlineMs},
		{name: "a deadline header that is no number", body: chatBody(false, ""), headers: map[string]string{HeaderDeadlineMs: "soon"},
			status: 400, typ: "invalid_request_error", code: "invalid_value", param: HeaderDeadlineMs},
		{name: "no API key", tenants: true, body: chatBody(false, ""),
			status: 401, typ: "authentication_error", code: "invalid_api_key", want: map[string]string{"WWW-Authenticate": anyValue}},
		{name: "an unknown API key", tenants: true, body: chatBody(false, ""), headers: map[string]string{"Authorization": "Bearer bad-key"},
			status: 401, typ: "authentication_error", code: "invalid_api_key", want: map[string]string{"WWW-Authenticate": anyValue}},
		{name: "an unknown model", body: unknownModel, status: 404, typ: "invalid_request_error", code: "model_not_found", param: "model"},
		{name: "an unknown model with a response schema", body: strings.Replace(chatBody(false, `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}}`), `"general"`, `"nope"`, 1),
			status: 404, typ: "invalid_request_error", code: "model_not_found", param: "model"},
		{name: "a wrong method", method: http.MethodGet, status: 405, typ: "invalid_request_error", code: "method_not_allowed",
			want: map[string]string{"Allow": http.MethodPost}},
		{name: "a user action that already committed", script: newScript(behaviour{words: 2}), body: chatBody(false, ""),
			headers: map[string]string{HeaderIdempotencyKey: "action-409"}, prior: 200,
			status: 409, typ: "invalid_request_error", code: "already_committed", want: map[string]string{HeaderGate: anyValue, headerShouldRetry: "false"}},
		{name: "a body over the limit", limit: 1024, body: chatBody(false, `"pad":"`+strings.Repeat("x", 2048)+`"`),
			status: 413, typ: "invalid_request_error", code: "request_too_large"},
		{name: "a spend ceiling refusing the request", script: newScript(behaviour{words: 2}), extra: tightPolicyYAML, body: chatBody(false, ""),
			headers: map[string]string{HeaderOperation: "tight"},
			status:  429, typ: "insufficient_quota", code: "budget_exhausted", want: map[string]string{headerShouldRetry: "false"}},
		{name: "every route pushing back", script: newScript(behaviour{status: 429}), body: chatBody(false, ""),
			status: 429, typ: "rate_limit_error", code: "rate_limited", want: map[string]string{"Retry-After": anyValue}},
		{name: "every route refusing the gateway's credentials", script: newScript(behaviour{status: 401}), body: chatBody(false, ""),
			status: 502, typ: "server_error", code: "route_failed"},
		{name: "providers answering 500", script: newScript(behaviour{status: 500}), body: chatBody(false, ""),
			status: 503, typ: "server_error", code: "all_routes_failed"},
		{name: "routes without workers", body: chatBody(false, ""), status: 503, typ: "server_error", code: "all_routes_failed"},
		{name: "a hanging provider past a short deadline", script: newScript(behaviour{hang: true}), body: chatBody(false, ""),
			headers: map[string]string{HeaderDeadlineMs: "300"}, status: 504, typ: "timeout_error", code: "deadline_exceeded"},
		{name: "a stream failing before its first byte", script: newScript(behaviour{hang: true}), body: chatBody(true, ""),
			headers: map[string]string{HeaderDeadlineMs: "300"}, status: 504, typ: "timeout_error", code: "deadline_exceeded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var c *cluster
			if tc.script != nil {
				ps := map[string]*provider{"a": newProvider(t, "a", tc.script), "b": newProvider(t, "b", tc.script)}
				c = newCluster(t, []string{"a", "b"}, ps, tc.extra)
			} else {
				c = newCluster(t, []string{"a", "b"}, nil, tc.extra)
			}
			opts := HTTPOptions{BodyLimit: tc.limit}
			if tc.tenants {
				opts.TenantByKeyHash = TenantKeyring(map[string]*config.Tenant{"acme": {APIKeyHashes: []string{config.HashAPIKey("good-key")}}})
			}
			srv := frontDoor(t, c, c.d, opts)
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			send := func() (*http.Response, []byte) {
				req, err := http.NewRequest(method, srv.URL+"/v1/chat/completions", strings.NewReader(tc.body))
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
				body, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatal(err)
				}
				return resp, body
			}
			if tc.prior != 0 {
				if resp, body := send(); resp.StatusCode != tc.prior {
					t.Fatalf("first request: status %d, want %d: %s", resp.StatusCode, tc.prior, body)
				}
			}
			resp, body := send()
			if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d (%s), want %d: %s", resp.StatusCode, resp.Header.Get("Content-Type"), tc.status, body)
			}
			typ, code, param := openAIError(t, body)
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
		})
	}
}

// stallingProvider streams one content chunk, then holds the response open
// until its client goes away, which it reports on gone.
func stallingProvider(t *testing.T, route string) *provider {
	p := &provider{arrived: make(chan string, 16), gone: make(chan string, 16), route: route}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		p.arrived <- route
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"first "},"finish_reason":null}]}`+"\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		p.gone <- route
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func TestHTTPClientLeavingMidStreamCancelsTheGroup(t *testing.T) {
	p := stallingProvider(t, "a")
	c := newCluster(t, []string{"a"}, map[string]*provider{"a": p}, "")
	srv := frontDoor(t, c, c.d, HTTPOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := post(t, ctx, srv.URL, chatBody(true, ""), nil)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// Read until the committed content arrives, then go away.
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before its content: %v", err)
		}
		if strings.Contains(line, `"content":"first "`) {
			break
		}
	}
	cancel()
	waitGone(t, p) // the worker closed the provider connection
	select {
	case g := <-c.groups:
		// The group committed at the first token; the caller leaving
		// afterwards cancels the winner's attempt, and nothing replaces it.
		rec := c.attemptRecords(g.HedgeGroupID, 1)[1]
		if g.Attempts != 1 || rec.Outcome != schemas.OutcomeCanceled || !rec.CancellationSent || !rec.CancellationObserved {
			t.Fatalf("group %+v, attempt %+v: want the one attempt cancelled", g, rec)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no group record")
	}
}

func TestHTTPModelsListThePools(t *testing.T) {
	c := newCluster(t, []string{"a"}, nil, "")
	srv := frontDoor(t, c, c.d, HTTPOptions{})
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
	if _, code, _ := openAIError(t, body); resp.StatusCode != http.StatusNotFound || code != "model_not_found" {
		t.Fatalf("GET /v1/models/nope: %d %s", resp.StatusCode, body)
	}
	if resp, _ := get(t, srv.URL+"/healthz"); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: %d", resp.StatusCode)
	}
}

func TestHTTPReadinessNeedsNATSAndALiveWorkerForEveryPool(t *testing.T) {
	c, _ := twoRoutes(t, newScript(behaviour{words: 1}))
	closed := connect(t, c.ns)
	closed.Close()
	tests := []struct {
		name    string
		opts    HTTPOptions
		status  int
		missing map[string][]string
		nats    string
	}{
		{name: "every pool has a live worker", opts: HTTPOptions{}, status: 200, nats: "CONNECTED"},
		{name: "a pool whose routes have no worker", opts: HTTPOptions{Pools: map[string][]string{"general": {"a", "b"}, "dark": {"x", "y"}}},
			status: 503, missing: map[string][]string{"dark": {"x", "y"}}, nats: "CONNECTED"},
		{name: "a closed NATS connection", opts: HTTPOptions{Conn: closed}, status: 503, nats: "CLOSED"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.ReadyProbeWindow = 100 * time.Millisecond
			srv := frontDoor(t, c, c.d, tc.opts)
			resp, body := get(t, srv.URL+"/readyz")
			var rep readyReport
			if err := json.Unmarshal(body, &rep); err != nil {
				t.Fatalf("body %s: %v", body, err)
			}
			if resp.StatusCode != tc.status || rep.Ready != (tc.status == 200) || rep.NATS != tc.nats ||
				fmt.Sprint(rep.PoolsWithoutWorkers) != fmt.Sprint(tc.missing) {
				t.Fatalf("status %d %s, want %d with missing %v", resp.StatusCode, body, tc.status, tc.missing)
			}
		})
	}
}

// testClock is a settable clock.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestHTTPReadinessIsReusedUntilItsTTLExpires(t *testing.T) {
	c, _ := twoRoutes(t, newScript(behaviour{words: 1}))
	clock := &testClock{now: time.Unix(1_700_000_000, 0)}
	srv := frontDoor(t, c, c.d, HTTPOptions{Now: clock.Now, ReadyCacheTTL: time.Second, ReadyProbeWindow: 100 * time.Millisecond})
	status := func() int { resp, _ := get(t, srv.URL+"/readyz"); return resp.StatusCode }
	if s := status(); s != http.StatusOK {
		t.Fatalf("readyz %d with live workers", s)
	}
	for _, w := range c.workers {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := w.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	if s := status(); s != http.StatusOK {
		t.Fatalf("readyz %d within the TTL, want the cached 200", s)
	}
	clock.Add(time.Second)
	if s := status(); s != http.StatusServiceUnavailable {
		t.Fatalf("readyz %d after the TTL with every worker stopped, want 503", s)
	}
}

func TestHTTPMetricsExposeTheDispatchersCounters(t *testing.T) {
	c, _ := twoRoutes(t, newScript(behaviour{words: 2}))
	reg := prometheus.NewRegistry()
	gate, err := arbiter.NewLocalGate(arbiter.LocalGateConfig{})
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(withConfig(Config{Conn: connect(t, c.ns), Store: budgets.NewMemory(nil), Gate: gate, Registerer: reg}, c.cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	srv := frontDoor(t, c, d, HTTPOptions{Gatherer: reg})
	resp := post(t, context.Background(), srv.URL, chatBody(false, ""), nil)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion status %d", resp.StatusCode)
	}
	resp, body := get(t, srv.URL+"/metrics")
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `hedgerow_groups_total{outcome="committed"} 1`) {
		t.Fatalf("metrics %d:\n%s", resp.StatusCode, body)
	}
}

func TestHTTPTenantKeyringFindsTheTenantOfAKeyHash(t *testing.T) {
	tenants := map[string]*config.Tenant{
		"acme":   {APIKeyHashes: []string{config.HashAPIKey("acme-1"), config.HashAPIKey("acme-2")}},
		"globex": {APIKeyHashes: []string{config.HashAPIKey("globex-1")}},
		"ghost":  nil,
	}
	lookup := TenantKeyring(tenants)
	for _, tc := range []struct {
		key, tenant string
		ok          bool
	}{
		{"acme-1", "acme", true},
		{"acme-2", "acme", true},
		{"globex-1", "globex", true},
		{"acme-3", "", false},
		{"", "", false},
	} {
		if tenant, ok := lookup(config.HashAPIKey(tc.key)); tenant != tc.tenant || ok != tc.ok {
			t.Errorf("key %q: tenant %q %t, want %q %t", tc.key, tenant, ok, tc.tenant, tc.ok)
		}
	}
	// A hash is compared as given: a truncated one or a plaintext key is
	// no key.
	for _, presented := range []string{config.HashAPIKey("acme-1")[:20], "acme-1", ""} {
		if tenant, ok := lookup(presented); ok {
			t.Errorf("lookup(%q) = %q", presented, tenant)
		}
	}
	if tenant, ok := TenantKeyring(nil)(config.HashAPIKey("acme-1")); ok {
		t.Errorf("an empty keyring admitted %q", tenant)
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

func TestHTTPTenantOfTheAPIKeyIsChargedItsSpendWindow(t *testing.T) {
	// The metered class lets each tenant reserve 100 units an hour: a
	// request asking for 500 output tokens cannot fit, one asking for 50 can.
	const metered = `
  metered:
    control_fraction: 0
    deadline: 3s
    spend: {per_tenant_window: 100, window: 1h}
`
	small := chatBody(false, "")
	large := strings.Replace(small, `"max_tokens":50`, `"max_tokens":500`, 1)
	keyring := TenantKeyring(map[string]*config.Tenant{"acme": {APIKeyHashes: []string{config.HashAPIKey("good-key")}}})
	for _, tc := range []struct {
		name    string
		keyring func(string) (string, bool)
		body    string
		status  int
	}{
		{"a keyed caller's request that fits its tenant's window", keyring, small, 200},
		{"a keyed caller's request beyond its tenant's window", keyring, large, 429},
		{"a keyless caller, who has no tenant window", nil, large, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := newScript(behaviour{words: 2})
			c := newCluster(t, []string{"a", "b"}, map[string]*provider{"a": newProvider(t, "a", sc), "b": newProvider(t, "b", sc)}, metered)
			srv := frontDoor(t, c, c.d, HTTPOptions{TenantByKeyHash: tc.keyring})
			resp := post(t, context.Background(), srv.URL, tc.body, map[string]string{"Authorization": "Bearer good-key", HeaderOperation: "metered"})
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if tc.status == 429 {
				if _, code, _ := openAIError(t, body); code != string(schemas.ErrBudgetExhausted) {
					t.Fatalf("code %q", code)
				}
			}
		})
	}
}

func TestHTTPWorkerServiceNameMatchesTheWorkers(t *testing.T) {
	if workerServiceName != worker.ServiceName {
		t.Fatalf("readiness pings %q, workers register %q", workerServiceName, worker.ServiceName)
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
		{&GroupError{Code: schemas.ErrDeadlineExceeded}, 504, "timeout_error", "deadline_exceeded", "", "", ""},
		{&GroupError{Code: schemas.ErrAlreadyCommitted, Holder: "g1/2/7"}, 409, "invalid_request_error", "already_committed", "", "g1/2/7", "false"},
		{&GroupError{Code: schemas.ErrRateLimited}, 429, "rate_limit_error", "rate_limited", "1", "", ""},
		{&GroupError{Code: schemas.ErrRateLimited, RetryAfter: 2500 * time.Millisecond}, 429, "rate_limit_error", "rate_limited", "3", "", ""},
		{&GroupError{Code: schemas.ErrBudgetExhausted}, 429, "insufficient_quota", "budget_exhausted", "", "", "false"},
		{&GroupError{Code: schemas.ErrBudgetExhausted, RetryAfter: 90 * time.Second}, 429, "insufficient_quota", "budget_exhausted", "90", "", ""},
		{&GroupError{Code: schemas.ErrAllRoutesFailed}, 503, "server_error", "all_routes_failed", "", "", ""},
		{&GroupError{Code: schemas.ErrRouteFailed}, 502, "server_error", "route_failed", "", "", ""},
		{&GroupError{Code: schemas.ErrNoRoute}, 503, "server_error", "no_route", "", "", ""},
		{&GroupError{Code: schemas.ErrInvalidRequest, Scope: schemas.ScopeGroup}, 400, "invalid_request_error", "invalid_request", "", "", ""},
		{fmt.Errorf("%w: x", ErrBadRequest), 400, "invalid_request_error", "invalid_request", "", "", ""},
		{fmt.Errorf("%w: %q", ErrUnknownPool, "x"), 404, "invalid_request_error", "model_not_found", "", "", ""},
		{ErrShuttingDown, 503, "server_error", "shutting_down", "1", "", ""},
		{errors.New("surprise"), 500, "server_error", "internal_error", "", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.err.Error(), func(t *testing.T) {
			rec := httptest.NewRecorder()
			writeAPIError(rec, errorFor(tc.err))
			typ, code, _ := openAIError(t, rec.Body.Bytes())
			h := rec.Header()
			if rec.Code != tc.status || typ != tc.typ || code != tc.code ||
				h.Get("Retry-After") != tc.retryAfter || h.Get(HeaderGate) != tc.gate || h.Get(headerShouldRetry) != tc.shouldRetry {
				t.Fatalf("%d %s %s Retry-After %q gate %q x-should-retry %q", rec.Code, typ, code,
					h.Get("Retry-After"), h.Get(HeaderGate), h.Get(headerShouldRetry))
			}
		})
	}
	for _, err := range []error{context.Canceled, fmt.Errorf("caller: %w", context.Canceled), &GroupError{Code: schemas.ErrCanceled}} {
		if e := errorFor(err); e != nil {
			t.Errorf("errorFor(%v) = %+v, want nothing written for a departed caller", err, e)
		}
	}
}

func TestHTTPStreamSendsHedgeHeadersWhenTheCommitIsKnownBeforeTheFirstByte(t *testing.T) {
	rec := httptest.NewRecorder()
	s := &sseStream{w: rec, rc: http.NewResponseController(rec), model: "general", created: 1}
	resp := &Response{GroupID: "g-1", Attempts: 2, Hedged: true, WinnerRoute: "b", Gate: "g-1/2/1", FinishReason: "stop"}
	s.Committed(resp)
	if err := s.Delta(Delta{Content: "hi"}); err != nil {
		t.Fatal(err)
	}
	if err := s.finish(resp); err != nil {
		t.Fatal(err)
	}
	h := rec.Header()
	if h.Get(HeaderHedged) != "true" || h.Get(HeaderWinnerRoute) != "b" || h.Get("Trailer") != "" {
		t.Fatalf("headers %v", h)
	}
	events := sseEvents(t, rec.Body)
	if len(events) != 4 || !strings.Contains(events[0], `"id":"chatcmpl-g-1"`) || events[3] != "[DONE]" {
		t.Fatalf("events %q", events)
	}
}

func TestHTTPStreamFailingAfterItsFirstByteEndsWithAnErrorEventAndNoDone(t *testing.T) {
	rec := httptest.NewRecorder()
	s := &sseStream{w: rec, rc: http.NewResponseController(rec), model: "general", created: 1}
	if err := s.Delta(Delta{Content: "partial"}); err != nil {
		t.Fatal(err)
	}
	if err := s.fail(errorFor(&GroupError{Code: schemas.ErrAllRoutesFailed, Streamed: true})); err != nil {
		t.Fatal(err)
	}
	events := sseEvents(t, rec.Body)
	last := events[len(events)-1]
	if rec.Code != http.StatusOK || len(events) != 3 || !strings.HasPrefix(last, `{"error":`) || strings.Contains(rec.Body.String(), "[DONE]") {
		t.Fatalf("status %d events %q", rec.Code, events)
	}
	if _, code, _ := openAIError(t, []byte(last)); code != "all_routes_failed" {
		t.Fatalf("error event %s", last)
	}
}

func TestHTTPRequestBodyMapsOntoTheCanonicalRequest(t *testing.T) {
	body := `{"model":"general","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],
		"max_tokens":10,"max_completion_tokens":20,"temperature":0.5,"top_p":0.9,"stop":"END","seed":7,
		"presence_penalty":0.1,"frequency_penalty":-0.1,"tools":[{"type":"function","function":{"name":"f"}}],
		"tool_choice":"auto","response_format":{"type":"json_object"},"stream":true,"stream_options":{"include_usage":true},
		"n":1,"user":"ignored","logit_bias":{"1":2}}`
	pool, req, includeUsage, aerr := parseChatRequest([]byte(body))
	if aerr != nil {
		t.Fatalf("parse: %+v", aerr)
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
	// stream_options without stream asks for nothing.
	_, _, includeUsage, aerr = parseChatRequest([]byte(`{"model":"general","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}`))
	if aerr != nil || includeUsage {
		t.Fatalf("include_usage %t, err %+v", includeUsage, aerr)
	}
}

// hedgyPolicyYAML adds an operation class that hedges after 50 ms and
// tolerates a second of silence before a first byte, so a fake worker can
// hold its primary until the hedge arrived without sending heartbeats.
const hedgyPolicyYAML = `
  hedgy:
    control_fraction: 0
    delay: {initial: 50ms, min: 10ms, warmup_samples: 1000000}
    deadline: 5s
    heartbeat_interval: 1s
    heartbeat_timeout: 4s
    duplicate_rate: {ceiling: 1, capacity: 10, initial_fill: 10}
`

// sendChunk streams one content chunk of an attempt: its first byte and
// its only chunk.
func sendChunk(fw *fakeWorker, a schemas.Attempt, content string) {
	fw.send(a, schemas.FirstByte{GroupID: a.GroupID, Attempt: a.Attempt})
	fw.send(a, schemas.Chunk{GroupID: a.GroupID, Attempt: a.Attempt, Seq: 1, Delta: content, Tokens: 1, CumulativeTokens: 1, First: true})
}

// sendResult ends an attempt whose one chunk was sent.
func sendResult(fw *fakeWorker, a schemas.Attempt, status schemas.StatusClass, content string) {
	scope := schemas.ScopeNone
	if status != schemas.StatusOK {
		scope = schemas.ScopeTransient
	}
	fw.send(a, schemas.AttemptResult{GroupID: a.GroupID, Attempt: a.Attempt, WorkerID: "fake", StatusClass: status, ErrorScope: scope,
		FinishReason: "stop", Content: content, LastSeq: 1, Usage: schemas.Usage{InputUnits: 10, OutputUnits: 1}})
}

// waitClosed waits for a fake worker's step to be reached by another
// attempt's goroutine; it reports false when it never is.
func waitClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-time.After(10 * time.Second):
		return false
	}
}

// failAfterCommit serves a cluster whose primary commits at its first
// chunk while a hedge is running, then fails; the hedge sends a chunk of
// its own after the commit. It returns the front door.
func failAfterCommit(t *testing.T) *httptest.Server {
	t.Helper()
	c := newCluster(t, []string{"a", "b"}, nil, hedgyPolicyYAML)
	hedgeArrived, firstSent, secondSent := make(chan struct{}), make(chan struct{}), make(chan struct{})
	startFakeWorker(t, c, []string{"a", "b"}, func(fw *fakeWorker, a schemas.Attempt) {
		fw.accept(a)
		switch a.Attempt {
		case 1:
			if !waitClosed(hedgeArrived) {
				t.Error("the hedge never arrived")
				return
			}
			sendChunk(fw, a, "from-1 ")
			close(firstSent)
			if !waitClosed(secondSent) {
				t.Error("the hedge never sent its chunk")
				return
			}
			sendResult(fw, a, schemas.StatusServerError, "")
		case 2:
			close(hedgeArrived)
			if !waitClosed(firstSent) {
				return
			}
			// Published after the primary's chunk on the same connection,
			// so it reaches the dispatcher after the commit.
			sendChunk(fw, a, "from-2 ")
			close(secondSent)
			// The loser is cancelled; it ends as a cancelled attempt does.
			select {
			case <-fw.cancels:
				fw.send(a, schemas.AttemptResult{GroupID: a.GroupID, Attempt: a.Attempt, WorkerID: "fake", StatusClass: schemas.StatusCanceled,
					ErrorScope: schemas.ScopeNone, LastSeq: 1, CancellationObserved: true, Usage: schemas.Usage{InputUnits: 10, OutputUnits: 1}})
			case <-time.After(10 * time.Second):
				t.Error("the losing hedge was never cancelled")
			}
		}
	})
	return frontDoor(t, c, c.d, HTTPOptions{})
}

// stallAfterCommit serves a cluster whose one attempt commits at its first
// chunk and then sends nothing until it is cancelled. Its fake worker keeps
// no deadline of its own, so only the dispatcher's deadline ends it.
func stallAfterCommit(t *testing.T) *httptest.Server {
	t.Helper()
	c := newCluster(t, []string{"a"}, nil, "")
	startFakeWorker(t, c, []string{"a"}, func(fw *fakeWorker, a schemas.Attempt) {
		fw.accept(a)
		sendChunk(fw, a, "from-1 ")
		select {
		case <-fw.cancels:
			fw.send(a, schemas.AttemptResult{GroupID: a.GroupID, Attempt: a.Attempt, WorkerID: "fake", StatusClass: schemas.StatusCanceled,
				ErrorScope: schemas.ScopeNone, LastSeq: 1, CancellationObserved: true, Usage: schemas.Usage{InputUnits: 10, OutputUnits: 1}})
		case <-time.After(10 * time.Second):
			t.Error("the stalled winner was never cancelled")
		}
	})
	return frontDoor(t, c, c.d, HTTPOptions{})
}

func TestHTTPStreamFailingAfterCommitEndsWithAnErrorEventAndNeverAnotherAttemptsBytes(t *testing.T) {
	tests := []struct {
		name      string
		serve     func(t *testing.T) *httptest.Server
		headers   map[string]string
		attempts  string
		typ, code string
	}{
		{name: "the winner failing while a hedge has bytes", serve: failAfterCommit, headers: map[string]string{HeaderOperation: "hedgy"},
			attempts: "2", typ: "server_error", code: "all_routes_failed"},
		{name: "the deadline passing mid-stream", serve: stallAfterCommit,
			headers: map[string]string{HeaderDeadlineMs: "500"}, attempts: "1", typ: "timeout_error", code: "deadline_exceeded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := tc.serve(t)
			resp := post(t, context.Background(), srv.URL, chatBody(true, ""), tc.headers)
			defer resp.Body.Close()
			raw, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("status %d (%s): %s", resp.StatusCode, resp.Header.Get("Content-Type"), raw)
			}
			// The commit was known before the first byte: its values are
			// headers, not trailers.
			if resp.Header.Get(HeaderAttempts) != tc.attempts || resp.Header.Get(HeaderWinnerRoute) == "" || resp.Header.Get(HeaderGate) == "" {
				t.Fatalf("hedge headers %v", resp.Header)
			}
			events := sseEvents(t, strings.NewReader(string(raw)))
			if len(events) != 3 || !strings.Contains(events[1], `"content":"`) || strings.Contains(string(raw), "[DONE]") {
				t.Fatalf("events %q: want the role chunk, the committed content and an error, without [DONE]", events)
			}
			if strings.Contains(string(raw), "from-2") {
				t.Fatalf("the stream carries another attempt's bytes: %q", events)
			}
			if typ, code, _ := openAIError(t, []byte(events[2])); typ != tc.typ || code != tc.code {
				t.Fatalf("error event %s, want %s %s", events[2], tc.typ, tc.code)
			}
		})
	}
}

func TestHTTPResponseSchemaIsTheContractAnAnswerMustMeet(t *testing.T) {
	const format = `"response_format":{"type":"json_schema","json_schema":{"name":"answer","strict":true,` +
		`"schema":{"type":"object","required":["answer"],"properties":{"answer":{"type":"integer"}}}}}`
	const valid = `{"answer":42}`
	tests := []struct {
		name     string
		stream   bool
		extra    string
		want     string
		attempts string
	}{
		{name: "an answer failing the schema is replaced", extra: format, want: valid, attempts: "2"},
		{name: "a stream shows nothing of an answer failing the schema", stream: true, extra: format, want: valid, attempts: "2"},
		{name: "without a schema the first answer wins", want: "not json", attempts: "1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, []string{"a", "b"}, nil, "")
			startFakeWorker(t, c, []string{"a", "b"}, func(fw *fakeWorker, a schemas.Attempt) {
				content := valid
				if a.Attempt == 1 {
					content = "not json"
				}
				fw.accept(a)
				sendChunk(fw, a, content)
				sendResult(fw, a, schemas.StatusOK, content)
			})
			srv := frontDoor(t, c, c.d, HTTPOptions{})
			resp := post(t, context.Background(), srv.URL, chatBody(tc.stream, tc.extra), nil)
			defer resp.Body.Close()
			raw, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderAttempts) != tc.attempts {
				t.Fatalf("status %d, attempts %q, want 200 after %s: %s", resp.StatusCode, resp.Header.Get(HeaderAttempts), tc.attempts, raw)
			}
			var got string
			if tc.stream {
				events := sseEvents(t, strings.NewReader(string(raw)))
				for _, e := range events[:len(events)-1] {
					var ck testChunk
					if err := json.Unmarshal([]byte(e), &ck); err != nil {
						t.Fatalf("event %q: %v", e, err)
					}
					if len(ck.Choices) > 0 {
						s, _ := ck.Choices[0]["delta"].(map[string]any)["content"].(string)
						got += s
					}
				}
			} else {
				var cc chatCompletion
				if err := json.Unmarshal(raw, &cc); err != nil {
					t.Fatal(err)
				}
				got = *cc.Choices[0].Message.Content
			}
			if got != tc.want {
				t.Fatalf("answer %q, want %q (body %s)", got, tc.want, raw)
			}
		})
	}
}

func TestHTTPSDKStreamFailingAfterCommitSurfacesAsAStreamError(t *testing.T) {
	srv := failAfterCommit(t)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0),
		option.WithHTTPClient(&http.Client{Transport: tr, Timeout: 10 * time.Second}))
	stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:    "general",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
	}, option.WithHeader(HeaderOperation, "hedgy"))
	defer stream.Close()
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	var se *ssestream.StreamError
	if err := stream.Err(); !errors.As(err, &se) || !strings.Contains(se.Message, "all_routes_failed") {
		t.Fatalf("stream error %v (%T), want a stream error naming all_routes_failed", err, err)
	}
	// The caller holds exactly what was committed: the winner's bytes,
	// with no finish reason, and nothing of the hedge.
	if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != "from-1 " || acc.Choices[0].FinishReason != "" {
		t.Fatalf("accumulated %+v", acc.Choices)
	}
}
