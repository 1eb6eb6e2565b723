package dispatcher_test

// The front doors in front of the real runtime: what only the two together
// can show — only the winner's bytes reach a caller, a departing caller
// cancels its group, the runtime's failures reach callers with the status
// and the records they imply. Statuses, parsing and stream shapes are the
// door packages' own tests, against a scripted Submitter.

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

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicstream "github.com/anthropics/anthropic-sdk-go/v2/packages/ssestream"
	"github.com/nats-io/nats.go"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/frontdoor/httpdoor"
	"github.com/hedgerow/hedgerow/frontdoor/natsdoor"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/schemas"
)

const prompt = frontdoortest.Prompt

var (
	chatBody    = frontdoortest.ChatBody
	sseEvents   = frontdoortest.SSEEvents
	openAIError = frontdoortest.OpenAIError
)

// anyValue in an expected header means "present, whatever its value".
const anyValue = "*"

type testChunk struct {
	ID      string               `json:"id"`
	Object  string               `json:"object"`
	Model   string               `json:"model"`
	Choices []map[string]any     `json:"choices"`
	Usage   *frontdoortest.Usage `json:"usage"`
}

// httpDoor serves d over HTTP with opts, on the cluster's connection and
// pools.
func httpDoor(t *testing.T, c *dispatcher.TestCluster, d *dispatcher.Dispatcher, opts httpdoor.Options) *httptest.Server {
	t.Helper()
	opts.Conn, opts.Pools = c.Conn(), c.PoolRoutes()
	h, err := httpdoor.New(d, opts)
	if err != nil {
		t.Fatalf("httpdoor.New: %v", err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, ctx context.Context, url, body string, headers map[string]string) *http.Response {
	return frontdoortest.Post(t, ctx, url+"/v1/chat/completions", body, headers)
}

func TestHTTPStreamCarriesOnlyTheWinnersChunksThenFinishUsageAndDone(t *testing.T) {
	for _, includeUsage := range []bool{true, false} {
		t.Run(fmt.Sprintf("include_usage=%t", includeUsage), func(t *testing.T) {
			// The primary hangs: the hedge on the other route wins.
			c, ps := dispatcher.TwoRoutes(t, dispatcher.NewTestScript(dispatcher.Words(4), dispatcher.Hang()))
			srv := httpDoor(t, c, c.Dispatcher(), httpdoor.Options{})
			extra := ""
			if includeUsage {
				extra = `"stream_options":{"include_usage":true}`
			}
			resp := post(t, context.Background(), srv.URL, chatBody(true, extra), nil)
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			// The dispatcher tells the stream of its commit before the first
			// byte: how the answer was won travels in the headers.
			route := resp.Header.Get(frontdoor.HeaderWinnerRoute)
			loser := map[string]string{"a": "b", "b": "a"}[route]
			if resp.Header.Get(frontdoor.HeaderHedged) != "true" || resp.Header.Get(frontdoor.HeaderAttempts) != "2" || loser == "" ||
				resp.Header.Get(frontdoor.HeaderGate) == "" || resp.Header.Get("Trailer") != "" || len(resp.Trailer) != 0 {
				t.Fatalf("hedge headers %v, trailers %v", resp.Header, resp.Trailer)
			}
			got := frontdoortest.ReadChatStream(t, sseEvents(t, resp.Body), includeUsage)
			if want := route + "0 " + route + "1 " + route + "2 " + route + "3 "; got.Content != want || got.FinishReason != "stop" {
				t.Fatalf("streamed %q then %q, want only the winner's %q then stop", got.Content, got.FinishReason, want)
			}
			if includeUsage && *got.Usage != (frontdoortest.Usage{PromptTokens: 10, CompletionTokens: 4, TotalTokens: 14}) {
				t.Fatalf("usage %+v", got.Usage)
			}
			dispatcher.WaitGone(t, ps[loser]) // the stalled primary was cancelled
		})
	}
}

// tightPolicyYAML adds an operation class whose spend ceiling per user
// action is smaller than any request, so admission refuses every one.
const tightPolicyYAML = `
  tight:
    control_fraction: 0
    deadline: 3s
    spend: {per_user_action: 5}
`

func TestHTTPRuntimeFailuresAnswerTheirStatusWithAnOpenAIErrorObject(t *testing.T) {
	tests := []struct {
		name    string
		script  *dispatcher.TestScript // nil: the routes have no workers
		extra   string                 // YAML appended to the cluster's policies
		body    string
		headers map[string]string
		// prior is the status an identical request sent first must get.
		prior     int
		status    int
		typ, code string
		// want are response headers and their values (anyValue: present).
		want map[string]string
	}{
		{name: "a user action that already committed", script: dispatcher.NewTestScript(dispatcher.Words(2)), body: chatBody(false, ""),
			headers: map[string]string{frontdoor.HeaderIdempotencyKey: "action-409"}, prior: 200,
			status: 409, typ: "invalid_request_error", code: "already_committed", want: map[string]string{frontdoor.HeaderGate: anyValue, frontdoor.HeaderShouldRetry: "false"}},
		{name: "a spend ceiling refusing the request", script: dispatcher.NewTestScript(dispatcher.Words(2)), extra: tightPolicyYAML, body: chatBody(false, ""),
			headers: map[string]string{frontdoor.HeaderOperation: "tight"},
			status:  429, typ: "insufficient_quota", code: "budget_exhausted", want: map[string]string{frontdoor.HeaderShouldRetry: "false"}},
		{name: "every route pushing back", script: dispatcher.NewTestScript(dispatcher.Status(429)), body: chatBody(false, ""),
			status: 429, typ: "rate_limit_error", code: "rate_limited", want: map[string]string{"Retry-After": anyValue}},
		{name: "every route refusing the gateway's credentials", script: dispatcher.NewTestScript(dispatcher.Status(401)), body: chatBody(false, ""),
			status: 502, typ: "server_error", code: "route_failed"},
		{name: "providers answering 500", script: dispatcher.NewTestScript(dispatcher.Status(500)), body: chatBody(false, ""),
			status: 503, typ: "server_error", code: "all_routes_failed", want: map[string]string{"Retry-After": "1"}},
		{name: "routes without workers", body: chatBody(false, ""), status: 503, typ: "server_error", code: "no_workers",
			want: map[string]string{"Retry-After": "1"}},
		{name: "a hanging provider past a short deadline", script: dispatcher.NewTestScript(dispatcher.Hang()), body: chatBody(false, ""),
			headers: map[string]string{frontdoor.HeaderDeadlineMs: "300"}, status: 504, typ: "timeout_error", code: "deadline_exceeded"},
		{name: "a stream failing before its first byte", script: dispatcher.NewTestScript(dispatcher.Hang()), body: chatBody(true, ""),
			headers: map[string]string{frontdoor.HeaderDeadlineMs: "300"}, status: 504, typ: "timeout_error", code: "deadline_exceeded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ps map[string]*dispatcher.TestProvider
			if tc.script != nil {
				ps = map[string]*dispatcher.TestProvider{"a": dispatcher.NewTestProvider(t, "a", tc.script), "b": dispatcher.NewTestProvider(t, "b", tc.script)}
			}
			c := dispatcher.NewTestCluster(t, []string{"a", "b"}, ps, tc.extra)
			srv := httpDoor(t, c, c.Dispatcher(), httpdoor.Options{})
			send := func() (*http.Response, []byte) {
				resp := post(t, context.Background(), srv.URL, tc.body, tc.headers)
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
			typ, code, _ := openAIError(t, body)
			if typ != tc.typ || code != tc.code {
				t.Fatalf("error type %q code %q, want %q %q", typ, code, tc.typ, tc.code)
			}
			for k, v := range tc.want {
				if got := resp.Header.Get(k); got == "" || v != anyValue && got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
			if _, hinted := tc.want["Retry-After"]; !hinted && resp.Header.Get("Retry-After") != "" {
				t.Errorf("Retry-After %q on a %d", resp.Header.Get("Retry-After"), tc.status)
			}
			if strings.Contains(string(body), prompt) {
				t.Fatalf("error body %s echoes the request", body)
			}
		})
	}
}

func TestHTTPClientLeavingMidStreamCancelsTheGroup(t *testing.T) {
	p := dispatcher.NewStallingProvider(t, "a")
	c := dispatcher.NewTestCluster(t, []string{"a"}, map[string]*dispatcher.TestProvider{"a": p}, "")
	srv := httpDoor(t, c, c.Dispatcher(), httpdoor.Options{})
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
	dispatcher.WaitGone(t, p) // the worker closed the provider connection
	select {
	case g := <-c.Groups():
		// The group committed at the first token; the caller leaving
		// afterwards cancels the winner's attempt, and nothing replaces it.
		rec := c.AttemptRecords(g.HedgeGroupID, 1)[1]
		if g.Attempts != 1 || rec.Outcome != schemas.OutcomeCanceled || !rec.CancellationSent || !rec.CancellationObserved {
			t.Fatalf("group %+v, attempt %+v: want the one attempt cancelled", g, rec)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no group record")
	}
}

func TestHTTPMetricsExposeTheDispatchersCounters(t *testing.T) {
	c, _ := dispatcher.TwoRoutes(t, dispatcher.NewTestScript(dispatcher.Words(2)))
	reg := prometheus.NewRegistry()
	gate, err := arbiter.NewLocalGate(arbiter.LocalGateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := c.AddDispatcher(dispatcher.Options{Store: budgets.NewMemory(nil), Gate: gate, Registerer: reg})
	srv := httpDoor(t, c, d, httpdoor.Options{Gatherer: reg})
	resp := post(t, context.Background(), srv.URL, chatBody(false, ""), nil)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion status %d", resp.StatusCode)
	}
	resp, err = http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `hedgerow_groups_total{outcome="committed"} 1`) {
		t.Fatalf("metrics %d:\n%s", resp.StatusCode, body)
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
	keyring := frontdoor.NewKeyring(map[string][]string{"acme": {policy.HashAPIKey("good-key")}})
	for _, tc := range []struct {
		name    string
		keyring *frontdoor.Keyring
		body    string
		status  int
	}{
		{"a keyed caller's request that fits its tenant's window", keyring, small, 200},
		{"a keyed caller's request beyond its tenant's window", keyring, large, 429},
		{"a keyless caller, who has no tenant window", nil, large, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := dispatcher.NewTestScript(dispatcher.Words(2))
			c := dispatcher.NewTestCluster(t, []string{"a", "b"},
				map[string]*dispatcher.TestProvider{"a": dispatcher.NewTestProvider(t, "a", sc), "b": dispatcher.NewTestProvider(t, "b", sc)}, metered)
			srv := httpDoor(t, c, c.Dispatcher(), httpdoor.Options{Keyring: tc.keyring})
			resp := post(t, context.Background(), srv.URL, tc.body, map[string]string{"Authorization": "Bearer good-key", frontdoor.HeaderOperation: "metered"})
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
    duplicate_rate: {ceiling: 1}
`

// sendChunk streams one content chunk of an attempt: its first byte and
// its only chunk.
func sendChunk(fw *dispatcher.FakeWorker, a schemas.Attempt, content string) {
	fw.Send(a, schemas.FirstByte{GroupID: a.GroupID, Attempt: a.Attempt})
	fw.Send(a, schemas.Chunk{GroupID: a.GroupID, Attempt: a.Attempt, Seq: 1, Delta: content, Tokens: 1, CumulativeTokens: 1, First: true})
}

// sendResult ends an attempt whose one chunk was sent.
func sendResult(fw *dispatcher.FakeWorker, a schemas.Attempt, status schemas.StatusClass, content string) {
	scope := schemas.ScopeNone
	if status != schemas.StatusOK {
		scope = schemas.ScopeTransient
	}
	fw.Send(a, schemas.AttemptResult{GroupID: a.GroupID, Attempt: a.Attempt, WorkerID: "fake", StatusClass: status, ErrorScope: scope,
		FinishReason: "stop", Content: content, LastSeq: 1, Usage: schemas.Usage{InputUnits: 10, OutputUnits: 1}})
}

// sendCancelled ends a cancelled attempt as a worker does.
func sendCancelled(fw *dispatcher.FakeWorker, a schemas.Attempt) {
	fw.Send(a, schemas.AttemptResult{GroupID: a.GroupID, Attempt: a.Attempt, WorkerID: "fake", StatusClass: schemas.StatusCanceled,
		ErrorScope: schemas.ScopeNone, LastSeq: 1, CancellationObserved: true, Usage: schemas.Usage{InputUnits: 10, OutputUnits: 1}})
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
	c := dispatcher.NewTestCluster(t, []string{"a", "b"}, nil, hedgyPolicyYAML)
	hedgeArrived, firstSent, secondSent := make(chan struct{}), make(chan struct{}), make(chan struct{})
	dispatcher.StartFakeWorker(t, c, []string{"a", "b"}, func(fw *dispatcher.FakeWorker, a schemas.Attempt) {
		fw.Accept(a)
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
			case <-fw.Cancels():
				sendCancelled(fw, a)
			case <-time.After(10 * time.Second):
				t.Error("the losing hedge was never cancelled")
			}
		}
	})
	return httpDoor(t, c, c.Dispatcher(), httpdoor.Options{})
}

// stallAfterCommit serves a cluster whose one attempt commits at its first
// chunk and then sends nothing until it is cancelled. Its fake worker keeps
// no deadline of its own, so only the dispatcher's deadline ends it.
func stallAfterCommit(t *testing.T) *httptest.Server {
	t.Helper()
	c := dispatcher.NewTestCluster(t, []string{"a"}, nil, "")
	dispatcher.StartFakeWorker(t, c, []string{"a"}, func(fw *dispatcher.FakeWorker, a schemas.Attempt) {
		fw.Accept(a)
		sendChunk(fw, a, "from-1 ")
		// A live worker whose provider stalls: it goes on beating, so what
		// ends the stream is the deadline, not lost heartbeats
		// (docs/architecture.md §4 rule 4).
		beat := time.NewTicker(50 * time.Millisecond)
		defer beat.Stop()
		deadline := time.After(10 * time.Second)
		for seq := int64(1); ; seq++ {
			select {
			case <-beat.C:
				fw.Send(a, schemas.Heartbeat{GroupID: a.GroupID, Attempt: a.Attempt, Seq: seq})
			case <-fw.Cancels():
				sendCancelled(fw, a)
				return
			case <-deadline:
				t.Error("the stalled winner was never cancelled")
				return
			}
		}
	})
	return httpDoor(t, c, c.Dispatcher(), httpdoor.Options{})
}

func TestHTTPStreamFailingAfterCommitEndsWithAnErrorEventAndNeverAnotherAttemptsBytes(t *testing.T) {
	tests := []struct {
		name      string
		serve     func(t *testing.T) *httptest.Server
		headers   map[string]string
		attempts  string
		typ, code string
	}{
		{name: "the winner failing while a hedge has bytes", serve: failAfterCommit, headers: map[string]string{frontdoor.HeaderOperation: "hedgy"},
			attempts: "2", typ: "server_error", code: "stream_interrupted"},
		{name: "the deadline passing mid-stream", serve: stallAfterCommit,
			headers: map[string]string{frontdoor.HeaderDeadlineMs: "500"}, attempts: "1", typ: "timeout_error", code: "deadline_exceeded"},
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
			if resp.Header.Get(frontdoor.HeaderAttempts) != tc.attempts || resp.Header.Get(frontdoor.HeaderWinnerRoute) == "" || resp.Header.Get(frontdoor.HeaderGate) == "" {
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
			c := dispatcher.NewTestCluster(t, []string{"a", "b"}, nil, "")
			dispatcher.StartFakeWorker(t, c, []string{"a", "b"}, func(fw *dispatcher.FakeWorker, a schemas.Attempt) {
				content := valid
				if a.Attempt == 1 {
					content = "not json"
				}
				fw.Accept(a)
				sendChunk(fw, a, content)
				sendResult(fw, a, schemas.StatusOK, content)
			})
			srv := httpDoor(t, c, c.Dispatcher(), httpdoor.Options{})
			resp := post(t, context.Background(), srv.URL, chatBody(tc.stream, tc.extra), nil)
			defer resp.Body.Close()
			raw, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK || resp.Header.Get(frontdoor.HeaderAttempts) != tc.attempts {
				t.Fatalf("status %d, attempts %q, want 200 after %s: %s", resp.StatusCode, resp.Header.Get(frontdoor.HeaderAttempts), tc.attempts, raw)
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
				var cc struct {
					Choices []struct {
						Message struct {
							Content *string `json:"content"`
						} `json:"message"`
					} `json:"choices"`
				}
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
	}, option.WithHeader(frontdoor.HeaderOperation, "hedgy"))
	defer stream.Close()
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	var se *ssestream.StreamError
	if err := stream.Err(); !errors.As(err, &se) || !strings.Contains(se.Message, "stream_interrupted") {
		t.Fatalf("stream error %v (%T), want a stream error naming stream_interrupted", err, err)
	}
	// The caller holds exactly what was committed: the winner's bytes,
	// with no finish reason, and nothing of the hedge.
	if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != "from-1 " || acc.Choices[0].FinishReason != "" {
		t.Fatalf("accumulated %+v", acc.Choices)
	}
}

// messagesCluster starts routes a and b as Anthropic routes sharing sc
// (nil: the routes have no workers) behind the HTTP front door.
func messagesCluster(t *testing.T, sc *dispatcher.TestScript) (*httptest.Server, map[string]*dispatcher.TestProvider) {
	t.Helper()
	var ps map[string]*dispatcher.TestProvider
	if sc != nil {
		ps = map[string]*dispatcher.TestProvider{"a": dispatcher.NewTestMessagesProvider(t, "a", sc), "b": dispatcher.NewTestMessagesProvider(t, "b", sc)}
	}
	c := dispatcher.NewTestCluster(t, []string{"a", "b"}, ps, "")
	return httpDoor(t, c, c.Dispatcher(), httpdoor.Options{}), ps
}

func postMessages(t *testing.T, url, body string, headers map[string]string) *http.Response {
	t.Helper()
	h := map[string]string{"Anthropic-Version": "2023-06-01"}
	for k, v := range headers {
		h[k] = v
	}
	return frontdoortest.Post(t, context.Background(), url+"/v1/messages", body, h)
}

// headerOrTrailer reads an X-Hedgerow-* value from the headers, or from
// the trailers of a stream whose commit came after its headers.
func headerOrTrailer(resp *http.Response, name string) string {
	if v := resp.Header.Get(name); v != "" {
		return v
	}
	return resp.Trailer.Get(name)
}

func TestMessagesDoorStreamsOnlyTheHedgeWinnerOverAnthropicRoutes(t *testing.T) {
	// The primary hangs: after the hedge delay, the other route wins.
	srv, ps := messagesCluster(t, dispatcher.NewTestScript(dispatcher.Words(4), dispatcher.Hang()))
	resp := postMessages(t, srv.URL, frontdoortest.MessagesBody(true, ""), nil)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	stream := anthropicstream.NewStream[anthropic.MessageStreamEventUnion](anthropicstream.NewDecoder(resp), nil)
	defer stream.Close()
	var m anthropic.Message
	var types []string
	for stream.Next() {
		ev := stream.Current()
		if len(types) == 0 || ev.Type != "content_block_delta" || types[len(types)-1] != ev.Type {
			types = append(types, ev.Type) // workers coalesce chunks, so the number of deltas varies
		}
		if err := m.Accumulate(ev); err != nil {
			t.Fatalf("accumulate %s: %v", ev.Type, err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	want := "message_start,content_block_start,content_block_delta,content_block_stop,message_delta,message_stop"
	if got := strings.Join(types, ","); got != want {
		t.Fatalf("events %v, want %s (deltas collapsed)", types, want)
	}
	route := headerOrTrailer(resp, frontdoor.HeaderWinnerRoute)
	loser := map[string]string{"a": "b", "b": "a"}[route]
	if headerOrTrailer(resp, frontdoor.HeaderHedged) != "true" || headerOrTrailer(resp, frontdoor.HeaderAttempts) != "2" || loser == "" {
		t.Fatalf("hedged %q attempts %q winner %q", headerOrTrailer(resp, frontdoor.HeaderHedged), headerOrTrailer(resp, frontdoor.HeaderAttempts), route)
	}
	if len(m.Content) != 1 || m.Content[0].Text != route+"0 "+route+"1 "+route+"2 "+route+"3 " {
		t.Fatalf("accumulated content %+v, want only the winner's words", m.Content)
	}
	if m.StopReason != anthropic.StopReasonEndTurn || m.Usage.InputTokens != 10 || m.Usage.OutputTokens != 4 || !strings.HasPrefix(m.ID, "msg_") {
		t.Fatalf("message %+v", m)
	}
	dispatcher.WaitGone(t, ps[loser]) // the stalled primary was cancelled
}

func TestMessagesDoorRuntimeFailuresAreAnthropicErrorObjects(t *testing.T) {
	tests := []struct {
		name    string
		script  *dispatcher.TestScript // nil: the routes have no workers
		body    string
		headers map[string]string
		status  int
		typ     string
	}{
		{name: "a hanging provider past a short deadline", script: dispatcher.NewTestScript(dispatcher.Hang()), body: frontdoortest.MessagesBody(false, ""),
			headers: map[string]string{frontdoor.HeaderDeadlineMs: "300"}, status: 504, typ: "timeout_error"},
		{name: "a stream failing before its first byte", script: dispatcher.NewTestScript(dispatcher.Hang()), body: frontdoortest.MessagesBody(true, ""),
			headers: map[string]string{frontdoor.HeaderDeadlineMs: "300"}, status: 504, typ: "timeout_error"},
		{name: "routes without workers", body: frontdoortest.MessagesBody(false, ""), status: 503, typ: "api_error"},
		{name: "providers rejecting the key", script: dispatcher.NewTestScript(dispatcher.Status(401)), body: frontdoortest.MessagesBody(false, ""), status: 502, typ: "api_error"},
		{name: "providers rejecting the request", script: dispatcher.NewTestScript(dispatcher.Status(400)), body: frontdoortest.MessagesBody(false, ""), status: 400, typ: "invalid_request_error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv, _ := messagesCluster(t, tc.script)
			resp := postMessages(t, srv.URL, tc.body, tc.headers)
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d (%s), want %d: %s", resp.StatusCode, resp.Header.Get("Content-Type"), tc.status, body)
			}
			if typ := frontdoortest.AnthropicErrorType(t, body); typ != tc.typ {
				t.Fatalf("error type %q, want %q: %s", typ, tc.typ, body)
			}
			if strings.Contains(string(body), prompt) {
				t.Fatalf("error body %s echoes the request", body)
			}
		})
	}
}

func TestMessagesDoorPushbackIsRateLimitedThenOverloaded(t *testing.T) {
	// Every route answers 429 with a Retry-After longer than the test: the
	// first request fails rate_limited, and the next finds no route that is
	// not paused.
	srv, _ := messagesCluster(t, dispatcher.NewTestScript(dispatcher.Status(429)))
	for _, want := range []struct {
		status int
		typ    string
	}{{429, "rate_limit_error"}, {529, "overloaded_error"}} {
		resp := postMessages(t, srv.URL, frontdoortest.MessagesBody(false, ""), nil)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want.status || frontdoortest.AnthropicErrorType(t, body) != want.typ {
			t.Fatalf("status %d: %s, want %d %s", resp.StatusCode, body, want.status, want.typ)
		}
		if want.status == 429 && resp.Header.Get("Retry-After") == "" {
			t.Errorf("429 without Retry-After")
		}
	}
}

// natsWait bounds every wait for something the NATS door does as soon as
// the test acts; reaching it is a failure.
const natsWait = 10 * time.Second

// natsDoor starts the NATS front door of c's dispatcher and stops it when
// the test ends (before the dispatcher closes).
func natsDoor(t *testing.T, c *dispatcher.TestCluster) {
	t.Helper()
	s, err := natsdoor.Start(c.Dispatcher(), natstest.Connect(t, c.Server()), natsdoor.Options{DispatcherID: c.Dispatcher().ID()})
	if err != nil {
		t.Fatalf("natsdoor.Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), natsWait)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
}

// submitBody encodes a submit request to pool "general".
func submitBody(t *testing.T, stream bool, deadline time.Duration) []byte {
	t.Helper()
	data, err := json.Marshal(schemas.SubmitRequest{OperationClass: "default", ModelClass: "general", DeadlineMs: deadline.Milliseconds(),
		Request: dispatcher.TestChat(stream)})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestNATSSubmitAnswersTheCommittedAnswerOfItsGroup(t *testing.T) {
	c, _ := dispatcher.TwoRoutes(t, dispatcher.NewTestScript(dispatcher.Words(4)))
	natsDoor(t, c)
	m, err := c.Conn().RequestMsg(&nats.Msg{Subject: schemas.SubmitSubject, Data: submitBody(t, false, 0)}, natsWait)
	if err != nil {
		t.Fatal(err)
	}
	var resp schemas.SubmitResponse
	if err := schemas.Decode(m.Data, &resp); err != nil || m.Header.Get(schemas.HeaderStatus) != schemas.StatusDone {
		t.Fatalf("answer %s (%v)", m.Data, err)
	}
	want := resp.WinnerRoute + "0 " + resp.WinnerRoute + "1 " + resp.WinnerRoute + "2 " + resp.WinnerRoute + "3 "
	if resp.Content != want || resp.Attempts != 1 || resp.WinnerAttempt != 1 || resp.Gate == nil || resp.Gate.GroupID != resp.GroupID {
		t.Fatalf("response %+v, want the primary's answer %q", resp, want)
	}
	if g := c.GroupRecord(resp.GroupID); g.Outcome != schemas.GroupCommitted {
		t.Errorf("group record %+v, want committed", g)
	}
}

func TestNATSGroupErrorNamesTheGroupItsRecordDescribes(t *testing.T) {
	c, _ := dispatcher.TwoRoutes(t, dispatcher.NewTestScript(dispatcher.Hang()))
	natsDoor(t, c)
	m, err := c.Conn().RequestMsg(&nats.Msg{Subject: schemas.SubmitSubject, Data: submitBody(t, false, 300*time.Millisecond)}, natsWait)
	if err != nil {
		t.Fatal(err)
	}
	if code := m.Header.Get(schemas.HeaderErrorCode); code != string(schemas.ErrDeadlineExceeded) {
		t.Fatalf("error code %q (%s), want deadline_exceeded", code, m.Data)
	}
	group := m.Header.Get(schemas.HeaderGroup)
	if group == "" {
		t.Fatalf("no %s header on a group's failure", schemas.HeaderGroup)
	}
	if g := c.GroupRecord(group); g.Outcome != schemas.GroupFailed || g.ErrorCode != schemas.ErrDeadlineExceeded {
		t.Errorf("group record %+v, want failed with deadline_exceeded", g)
	}
}

func TestNATSCancelSubjectCancelsTheGroup(t *testing.T) {
	c, ps := dispatcher.TwoRoutes(t, dispatcher.NewTestScript(dispatcher.Hang()))
	natsDoor(t, c)
	nc := c.Conn()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	const id = "cancel-me-1-0123456789abcdef0123" // unguessable: it alone proves the caller (no tenants, no NATS user)
	if err := nc.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: inbox,
		Header: nats.Header{schemas.HeaderRequestID: {id}}, Data: submitBody(t, false, 0)}); err != nil {
		t.Fatal(err)
	}
	var hung *dispatcher.TestProvider
	select {
	case r := <-ps["a"].Arrived():
		hung = ps[r]
	case r := <-ps["b"].Arrived():
		hung = ps[r]
	case <-time.After(natsWait):
		t.Fatal("the primary never reached a provider")
	}
	if err := nc.Publish(schemas.SubmitCancelSubject(id), nil); err != nil {
		t.Fatal(err)
	}
	dispatcher.WaitGone(t, hung)
	select {
	case g := <-c.Groups():
		if g.Outcome != schemas.GroupFailed || g.ErrorCode != schemas.ErrCanceled {
			t.Fatalf("group record %+v, want failed with canceled", g)
		}
	case <-time.After(natsWait):
		t.Fatal("no group record after the cancel")
	}
	// The caller that cancelled is told so, never left to its timeout.
	m, err := sub.NextMsg(natsWait)
	if err != nil {
		t.Fatalf("no final answer after the cancel: %v", err)
	}
	if code := m.Header.Get(schemas.HeaderErrorCode); code != string(schemas.ErrCanceled) {
		t.Fatalf("final answer %s %q (%s), want canceled", schemas.HeaderErrorCode, code, m.Data)
	}
}

func TestNATSStreamWhoseCallerLeftCancelsItsAttempt(t *testing.T) {
	// Route "x" has no real worker: the fake one commits the stream at its
	// first chunk, then streams a chunk every few milliseconds until it is
	// cancelled, as a provider does.
	c := dispatcher.NewTestCluster(t, []string{"x"}, nil, "")
	cancelled := make(chan schemas.Cancel, 1)
	dispatcher.StartFakeWorker(t, c, []string{"x"}, func(fw *dispatcher.FakeWorker, a schemas.Attempt) {
		fw.Accept(a)
		fw.Send(a, schemas.FirstByte{GroupID: a.GroupID, Attempt: a.Attempt})
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		give := time.After(natsWait)
		for seq := int64(1); ; seq++ {
			fw.Send(a, schemas.Chunk{GroupID: a.GroupID, Attempt: a.Attempt, Seq: seq, Delta: "word ", Tokens: 1, CumulativeTokens: seq, First: seq == 1})
			select {
			case <-tick.C:
				continue
			case cancel := <-fw.Cancels():
				fw.Send(a, schemas.AttemptResult{GroupID: a.GroupID, Attempt: a.Attempt, WorkerID: "fake", StatusClass: schemas.StatusCanceled,
					ErrorScope: schemas.ScopeTransient, LastSeq: seq, CancellationObserved: true, Usage: schemas.Usage{OutputUnits: seq}})
				cancelled <- cancel
			case <-give:
			}
			return
		}
	})
	natsDoor(t, c)
	caller := natstest.Connect(t, c.Server())
	inbox := caller.NewInbox()
	sub, err := caller.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := caller.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: inbox, Data: submitBody(t, true, 0)}); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(natsWait)
	if err != nil || m.Header.Get(schemas.HeaderStatus) != schemas.StatusChunk {
		t.Fatalf("first message %v (%v), want a chunk", m, err)
	}
	// The caller goes away without a word: its inbox has no subscriber, so
	// the next chunk comes back to the gateway as "no responders".
	caller.Close()
	select {
	case cancel := <-cancelled:
		if cancel.Reason != schemas.CancelCallerGone {
			t.Fatalf("cancel %+v, want reason %s", cancel, schemas.CancelCallerGone)
		}
	case <-time.After(natsWait):
		t.Fatal("the attempt of a stream whose caller left was never cancelled")
	}
}

// TestHTTPASchemaOverTheCompiledSizeBudgetIsA400NamingItAndNothingRuns: a
// 21 KB schema within the limits whose patterns would compile to about
// 17 MB is refused by the gateway's default budget (docs/architecture.md
// §6) with an OpenAI error naming the schema and the limit, and no attempt
// reaches a worker.
func TestHTTPASchemaOverTheCompiledSizeBudgetIsA400NamingItAndNothingRuns(t *testing.T) {
	c := dispatcher.NewTestCluster(t, []string{"a"}, nil, "")
	attempts := make(chan schemas.Attempt, 4)
	dispatcher.StartFakeWorker(t, c, []string{"a"}, func(fw *dispatcher.FakeWorker, a schemas.Attempt) {
		attempts <- a
		fw.Accept(a)
		sendResult(fw, a, schemas.StatusOK, `{}`)
	})
	srv := httpDoor(t, c, c.Dispatcher(), httpdoor.Options{})
	var schema strings.Builder
	schema.WriteString(`{"type":"object","properties":{`)
	for i := range 400 {
		if i > 0 {
			schema.WriteByte(',')
		}
		fmt.Fprintf(&schema, `"p%d":{"type":"string","pattern":"^[a-z]{1000}$"}`, i)
	}
	schema.WriteString(`}}`)
	resp := post(t, context.Background(), srv.URL,
		chatBody(false, `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":`+schema.String()+`}}`), nil)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d, want 400: %s", resp.StatusCode, body)
	}
	typ, code, param := openAIError(t, body)
	if typ != "invalid_request_error" || code != frontdoor.CodeInvalidValue || param != frontdoor.ParamResponseSchema {
		t.Errorf("error %s, want invalid_request_error invalid_value naming %s", body, frontdoor.ParamResponseSchema)
	}
	if want := fmt.Sprintf("compiled size budget of %d MiB", arbiter.DefaultSchemaCacheBytes/arbiter.SchemaShareDivisor>>20); !strings.Contains(string(body), want) {
		t.Errorf("error %s does not name the limit (%q)", body, want)
	}
	if strings.Contains(string(body), "[a-z]") {
		t.Errorf("error %s quotes the schema", body)
	}
	select {
	case a := <-attempts:
		t.Errorf("attempt %d reached a worker for a refused request", a.Attempt)
	default:
	}
}
