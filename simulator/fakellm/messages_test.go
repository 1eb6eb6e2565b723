package fakellm_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// messagesBody is a Messages request asking prompt, with the system prompt
// chatBody sends, and extra fields.
func messagesBody(prompt string, maxTokens int, extra string) string {
	if extra != "" {
		extra = "," + extra
	}
	return fmt.Sprintf(`{"model":"claude-fake","max_tokens":%d,"system":"be brief","messages":[{"role":"user","content":%s}]%s}`,
		maxTokens, quote(prompt), extra)
}

// postMessages sends a Messages request and returns the status, headers
// and body.
func (fs *fakeServer) postMessages(t *testing.T, body string) (int, http.Header, []byte) {
	t.Helper()
	resp := fs.do(t, context.Background(), http.MethodPost, "/v1/messages", body)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	return resp.StatusCode, resp.Header, data
}

// message is a Message object as a client decodes it.
type message struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Role    string `json:"role"`
	Model   string `json:"model"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StopReason *string `json:"stop_reason"`
	Usage      struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

// namedEvent is one server-sent event of a Messages stream.
type namedEvent struct {
	name string
	data map[string]any
}

// parseNamedSSE splits a Messages stream into events, failing on a line
// that is no event, data or blank line, and on an event whose name is not
// its data's type.
func parseNamedSSE(t *testing.T, body []byte) []namedEvent {
	t.Helper()
	var events []namedEvent
	var name string
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			name = ""
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var data map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &data); err != nil {
				t.Fatalf("event %q data is not a JSON object: %v", name, err)
			}
			if data["type"] != name {
				t.Fatalf("event named %q carries type %v", name, data["type"])
			}
			events = append(events, namedEvent{name, data})
		default:
			t.Fatalf("stream line %q is neither event nor data", line)
		}
	}
	return events
}

// messagesStream is what a Messages stream said.
type messagesStream struct {
	text         string
	deltas       int
	inputTokens  float64
	outputTokens float64
	stopReason   string
}

// readMessagesStream checks the event order every Messages client relies
// on — message_start, one text block (start, deltas, stop), message_delta,
// message_stop, with pings anywhere — and returns what it carried.
func readMessagesStream(t *testing.T, body []byte) messagesStream {
	t.Helper()
	var s messagesStream
	var order []string
	for _, e := range parseNamedSSE(t, body) {
		switch e.name {
		case "ping":
			continue
		case "message_start":
			msg := e.data["message"].(map[string]any)
			if msg["role"] != "assistant" || msg["type"] != "message" || msg["stop_reason"] != nil {
				t.Errorf("message_start message = %v", msg)
			}
			s.inputTokens = msg["usage"].(map[string]any)["input_tokens"].(float64)
		case "content_block_delta":
			d := e.data["delta"].(map[string]any)
			if d["type"] != "text_delta" || e.data["index"] != float64(0) {
				t.Errorf("delta event %v", e.data)
			}
			s.text += d["text"].(string)
			s.deltas++
			if len(order) > 0 && order[len(order)-1] == "content_block_delta" {
				continue
			}
		case "message_delta":
			s.stopReason, _ = e.data["delta"].(map[string]any)["stop_reason"].(string)
			s.outputTokens = e.data["usage"].(map[string]any)["output_tokens"].(float64)
		}
		order = append(order, e.name)
	}
	want := []string{"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}
	if strings.Join(order, ",") != strings.Join(want, ",") {
		t.Errorf("event order %v, want %v (deltas collapsed)", order, want)
	}
	return s
}

// anthropicError decodes Anthropic's error envelope, failing if the body is
// not one, and returns its error type.
func anthropicError(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Type  string `json:"type"`
		Error *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Type != "error" || e.Error == nil || e.Error.Type == "" || e.Error.Message == "" {
		t.Fatalf("body is not an Anthropic error: %v: %s", err, body)
	}
	return e.Error.Type
}

func TestMessagesNonStreamingAnswerIsAMessage(t *testing.T) {
	fs := startServer(t, fakellm.Options{Model: steadyModel(t, 40), Seed: 1, TimeScale: fastScale})

	status, hdr, body := fs.postMessages(t, messagesBody("hello", 1024, ""))
	if status != http.StatusOK || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
		t.Fatalf("status %d, content type %q: %s", status, hdr.Get("Content-Type"), body)
	}
	var m message
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("not JSON: %v: %s", err, body)
	}
	if m.Type != "message" || m.Role != "assistant" || !strings.HasPrefix(m.ID, "msg_") || m.Model != "claude-fake" {
		t.Errorf("envelope = %+v", m)
	}
	var raw map[string]json.RawMessage
	_ = json.Unmarshal(body, &raw) // decoded above
	if m.StopReason == nil || *m.StopReason != "end_turn" || string(raw["stop_sequence"]) != "null" {
		t.Errorf("stop_reason %v, stop_sequence %s: want end_turn and an explicit null", m.StopReason, raw["stop_sequence"])
	}
	if len(m.Content) != 1 || m.Content[0].Type != "text" || len(strings.Fields(m.Content[0].Text)) != 40 {
		t.Fatalf("content = %+v, want one text block of 40 words", m.Content)
	}
	rec := fs.nextRecord(t)
	if m.Usage.OutputTokens != 40 || m.Usage.InputTokens < 1 || int64(m.Usage.InputTokens) != rec.BilledInputTokens ||
		rec.BilledOutputTokens != 40 || rec.End != fakellm.EndCompleted || rec.FinishReason != "stop" {
		t.Errorf("usage %+v, record %+v", m.Usage, rec)
	}
}

func TestMessagesStreamIsWellFormedWithCumulativeUsage(t *testing.T) {
	fs := startServer(t, fakellm.Options{Workload: workload.GPT4o, Seed: 7, TimeScale: fastScale})
	answered := 0
	for i := range 5 {
		status, hdr, body := fs.postMessages(t, messagesBody("stream me "+string(rune('a'+i)), 1024, `"stream":true`))
		rec := fs.nextRecord(t)
		if rec.Outcome != "ok" {
			continue // this seed's draw failed; the error tests cover that
		}
		if status != http.StatusOK || hdr.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("status %d, content type %q", status, hdr.Get("Content-Type"))
		}
		s := readMessagesStream(t, body)
		if s.stopReason != "end_turn" || s.deltas != rec.OutputTokens || int(s.outputTokens) != rec.OutputTokens ||
			int64(s.inputTokens) != rec.BilledInputTokens || len(strings.Fields(s.text)) != rec.OutputTokens {
			t.Errorf("stream %+v; record %+v", s, rec)
		}
		answered++
	}
	if answered == 0 {
		t.Fatal("no request of this seed was answered; pick another seed")
	}
}

func TestMessagesMaxTokensStopsWithMaxTokens(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%t", stream), func(t *testing.T) {
			fs := startServer(t, fakellm.Options{Model: steadyModel(t, 100), Seed: 1, TimeScale: fastScale})

			status, _, body := fs.postMessages(t, messagesBody("count", 3, fmt.Sprintf(`"stream":%t`, stream)))
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, body)
			}
			var reason string
			var output int
			if stream {
				s := readMessagesStream(t, body)
				reason, output = s.stopReason, int(s.outputTokens)
			} else {
				var m message
				if err := json.Unmarshal(body, &m); err != nil || m.StopReason == nil {
					t.Fatalf("%v: %s", err, body)
				}
				reason, output = *m.StopReason, m.Usage.OutputTokens
			}
			if reason != "max_tokens" || output != 3 {
				t.Errorf("stop_reason %q, output %d; want max_tokens and 3", reason, output)
			}
			if rec := fs.nextRecord(t); rec.FinishReason != "length" || rec.TokensSent != 3 {
				t.Errorf("record = %+v", rec)
			}
		})
	}
}

func TestTheSameConversationDrawsTheSameAnswerInEitherAPI(t *testing.T) {
	for _, tc := range []struct {
		name, messages, chat string
	}{
		{"string content, a cap beyond the longest answer", messagesBody("same question", 4096, ""), chatBody("same question", "")},
		{"text blocks and system blocks, the same cap",
			`{"model":"m","max_tokens":20,"system":[{"type":"text","text":"be brief"}],"messages":[{"role":"user","content":[{"type":"text","text":"same question"}]}]}`,
			`{"model":"m","max_tokens":20,"messages":[{"role":"system","content":[{"type":"text","text":"be brief"}]},{"role":"user","content":[{"type":"text","text":"same question"}]}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Two servers on one seed and route: identical draws. Output
			// lengths vary; only errors and hangs are left out.
			model, err := workload.ByName(workload.GPT4o)
			if err != nil {
				t.Fatal(err)
			}
			model.ErrorFraction, model.TTFT.HangFraction = 0, 0
			cfg := fakellm.Options{Model: model, Seed: 3, TimeScale: fastScale}
			a, b := startServer(t, cfg), startServer(t, cfg)
			_, _, mBody := a.postMessages(t, tc.messages)
			_, _, cBody := b.post(t, tc.chat)
			ra, rb := a.nextRecord(t), b.nextRecord(t)
			if ra.RequestID != rb.RequestID || ra.OutputTokens != rb.OutputTokens || ra.Outcome != "ok" || rb.Outcome != "ok" {
				t.Fatalf("records differ: messages %+v, chat %+v", ra, rb)
			}
			var m message
			var c completion
			if err := json.Unmarshal(mBody, &m); err != nil || len(m.Content) != 1 {
				t.Fatalf("%v: %s", err, mBody)
			}
			if err := json.Unmarshal(cBody, &c); err != nil || len(c.Choices) != 1 {
				t.Fatalf("%v: %s", err, cBody)
			}
			if m.Content[0].Text != c.Choices[0].Message.Content || m.Usage.InputTokens != c.Usage.PromptTokens {
				t.Errorf("messages said %q (%d in), chat said %q (%d in)", m.Content[0].Text, m.Usage.InputTokens,
					c.Choices[0].Message.Content, c.Usage.PromptTokens)
			}
		})
	}
}

func TestMessagesErrorsAreAnthropicShaped(t *testing.T) {
	failing := func(t *testing.T) *workload.Model { m := steadyModel(t, 10); m.ErrorFraction = 1; return m }
	for _, tc := range []struct {
		name     string
		model    func(*testing.T) *workload.Model
		method   string
		body     string
		status   int
		typ      string
		recorded bool // the request reached the provider
	}{
		{"a drawn server error", failing, "", messagesBody("fail", 100, ""), 500, "api_error", true},
		{"a drawn server error on a stream", failing, "", messagesBody("fail", 100, `"stream":true`), 500, "api_error", true},
		{"a hang at the hang cap", hangModel, "", messagesBody("hang", 100, ""), 504, "timeout_error", true},
		{"no max_tokens", nil, "", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error", false},
		{"max_tokens below 1", nil, "", messagesBody("x", 0, ""), 400, "invalid_request_error", false},
		{"no model", nil, "", `{"max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error", false},
		{"no messages", nil, "", `{"model":"m","max_tokens":5,"messages":[]}`, 400, "invalid_request_error", false},
		{"a system role in messages", nil, "", `{"model":"m","max_tokens":5,"messages":[{"role":"system","content":"x"}]}`, 400, "invalid_request_error", false},
		{"a temperature above 1", nil, "", messagesBody("x", 5, `"temperature":1.5`), 400, "invalid_request_error", false},
		{"a text block without text", nil, "", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text"}]}]}`, 400, "invalid_request_error", false},
		{"malformed JSON", nil, "", `{"model":`, 400, "invalid_request_error", false},
		{"a wrong method", nil, http.MethodGet, "", 405, "invalid_request_error", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			model := steadyModel(t, 10)
			if tc.model != nil {
				model = tc.model(t)
			}
			fs := startServer(t, fakellm.Options{Model: model, Seed: 1, TimeScale: fastScale})
			method := cmp.Or(tc.method, http.MethodPost)

			resp := fs.do(t, context.Background(), method, "/v1/messages", tc.body)
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
				t.Fatalf("status %d (%s), want %d: %s", resp.StatusCode, resp.Header.Get("Content-Type"), tc.status, body)
			}
			if typ := anthropicError(t, body); typ != tc.typ {
				t.Errorf("error type %q, want %q", typ, tc.typ)
			}
			if tc.recorded {
				if rec := fs.nextRecord(t); rec.Status != tc.status {
					t.Errorf("record = %+v", rec)
				}
			}
		})
	}
}

func TestMessagesBodyOverTheLimitIsRequestTooLarge(t *testing.T) {
	fs := startServer(t, fakellm.Options{Model: steadyModel(t, 5), TimeScale: fastScale, MaxBodyBytes: 64})
	status, _, body := fs.postMessages(t, messagesBody(strings.Repeat("x", 200), 5, ""))
	if status != http.StatusRequestEntityTooLarge || anthropicError(t, body) != "request_too_large" {
		t.Errorf("status %d: %s, want 413 request_too_large", status, body)
	}
}

func TestMessagesRateLimitAndShutdownAnswers(t *testing.T) {
	frozen := time.Unix(1_700_000_000, 0)
	fs := startServer(t, fakellm.Options{
		Model: steadyModel(t, 5), Seed: 1, TimeScale: fastScale,
		RateLimit: workload.RateLimit{RPM: 1},
		Now:       func() time.Time { return frozen },
	})
	if status, _, body := fs.postMessages(t, messagesBody("first", 5, "")); status != http.StatusOK {
		t.Fatalf("first request: %d %s", status, body)
	}
	fs.nextRecord(t)
	status, hdr, body := fs.postMessages(t, messagesBody("second", 5, ""))
	if status != http.StatusTooManyRequests || anthropicError(t, body) != "rate_limit_error" || hdr.Get("Retry-After") != "1" {
		t.Errorf("second request: %d, Retry-After %q: %s; want 429 rate_limit_error with Retry-After", status, hdr.Get("Retry-After"), body)
	}
	fs.nextRecord(t)

	fs.fake.Close()
	status, _, body = fs.postMessages(t, messagesBody("after close", 5, ""))
	if status != http.StatusServiceUnavailable || anthropicError(t, body) != "api_error" {
		t.Errorf("after Close: %d %s, want 503 api_error", status, body)
	}
}

// sdkClient is the official Anthropic SDK pointed at fs, without retries
// and without reading the environment.
func sdkClient(fs *fakeServer) anthropic.Client {
	return anthropic.NewClient(option.WithoutEnvironmentDefaults(), option.WithBaseURL(fs.http.URL),
		option.WithAPIKey("test-key"), option.WithHTTPClient(fs.http.Client()), option.WithMaxRetries(0))
}

func TestOfficialSDKReadsTheFakesMessages(t *testing.T) {
	fs := startServer(t, fakellm.Options{Model: steadyModel(t, 12), Seed: 1, TimeScale: fastScale})
	client := sdkClient(fs)
	params := anthropic.MessageNewParams{
		Model: "claude-fake", MaxTokens: 100,
		System:   []anthropic.TextBlockParam{{Text: "be brief"}},
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello"))},
	}

	msg, err := client.Messages.New(context.Background(), params)
	if err != nil {
		t.Fatalf("Messages.New: %v", err)
	}
	if msg.StopReason != anthropic.StopReasonEndTurn || len(msg.Content) != 1 || len(strings.Fields(msg.Content[0].Text)) != 12 || msg.Usage.OutputTokens != 12 {
		t.Errorf("message = %+v", msg)
	}
	fs.nextRecord(t)

	stream := client.Messages.NewStreaming(context.Background(), params)
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatalf("Accumulate: %v", err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if err := stream.Close(); err != nil {
		t.Fatal(err)
	}
	if acc.StopReason != anthropic.StopReasonEndTurn || len(acc.Content) != 1 || acc.Content[0].Text != msg.Content[0].Text ||
		acc.Usage.OutputTokens != 12 || acc.Usage.InputTokens != msg.Usage.InputTokens {
		t.Errorf("accumulated %+v, want the non-streaming answer %+v", acc, msg)
	}
	fs.nextRecord(t)
}

func TestOfficialSDKSeesTheFakesErrorsAsTypedErrors(t *testing.T) {
	m := steadyModel(t, 5)
	m.ErrorFraction = 1
	fs := startServer(t, fakellm.Options{Model: m, Seed: 1, TimeScale: fastScale})

	client := sdkClient(fs)
	_, err := client.Messages.New(context.Background(), anthropic.MessageNewParams{
		Model: "claude-fake", MaxTokens: 100,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("fail"))},
	})
	var aerr *anthropic.Error
	if !errors.As(err, &aerr) || aerr.StatusCode != http.StatusInternalServerError || aerr.Type() != "api_error" {
		t.Fatalf("error %v (%T), want a typed 500 api_error", err, err)
	}
	fs.nextRecord(t)
}
