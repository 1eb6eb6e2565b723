package upstream

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// Recorded stream shapes, as the providers send them. The OpenAI-compatible
// ones follow api.openai.com (a role chunk with empty content first),
// DeepSeek and vLLM (reasoning_content), OpenRouter and Ollama (reasoning);
// the Messages ones follow api.anthropic.com (message_start, an empty
// text block's start and a ping before the first token).

func openAIChunk(delta string) string {
	return `data: {"id":"chatcmpl-B9xQ2","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o-2024-08-06",` +
		`"system_fingerprint":"fp_0ba0d124f1","choices":[{"index":0,"delta":` + delta + `,"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n"
}

const (
	openAIRoleChunk = `{"role":"assistant","content":"","refusal":null}`
	openAIEnd       = `data: {"id":"chatcmpl-B9xQ2","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}` + "\n\n" +
		`data: {"id":"chatcmpl-B9xQ2","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o-2024-08-06","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}` + "\n\n" +
		"data: [DONE]\n\n"
	openAIToolEnd = `data: {"id":"chatcmpl-B9xQ2","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}],"usage":null}` + "\n\n" +
		"data: [DONE]\n\n"
)

func sseEvent(typ, data string) string {
	return "event: " + typ + "\ndata: " + data + "\n\n"
}

var (
	messagesOpening = sseEvent("message_start", `{"type":"message_start","message":{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5-20250929","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1}}}`) +
		sseEvent("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`) +
		sseEvent("ping", `{"type": "ping"}`)
	messagesText = func(index int, text string) string {
		return sseEvent("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":%d,"delta":{"type":"text_delta","text":%q}}`, index, text))
	}
	messagesEnd = func(index int, stop string) string {
		return sseEvent("content_block_stop", fmt.Sprintf(`{"type":"content_block_stop","index":%d}`, index)) +
			sseEvent("message_delta", `{"type":"message_delta","delta":{"stop_reason":"`+stop+`","stop_sequence":null},"usage":{"output_tokens":15}}`) +
			sseEvent("message_stop", `{"type":"message_stop"}`)
	}
)

// segmentedStream is a provider stream delivered in parts: each part is
// written and flushed, and the next waits until the test has seen the
// adapter read everything before it and ask for more.
type segmentedStream struct {
	api   string // "openai", "responses" (OpenAI's /responses) or "anthropic"
	parts []string
	// wantFirstBytes is how many times FirstByte has been called once the
	// adapter has read each part (the last: once Stream returned).
	wantFirstBytes []int
	// wantErr: the stream ends without a finish, which is an error.
	wantErr bool
}

func TestFirstByteIsTheFirstGeneratedTokenNotTheStreamOpening(t *testing.T) {
	tests := []struct {
		name string
		segmentedStream
	}{
		{"headers and the role chunk at once are no first byte: it comes with the first content token", segmentedStream{api: "openai",
			parts:          []string{"", openAIChunk(openAIRoleChunk), openAIChunk(`{"content":"Hel"}`) + openAIChunk(`{"content":"lo"}`) + openAIEnd},
			wantFirstBytes: []int{0, 0, 1}}},
		{"comments, keep-alives and empty deltas are no first byte", segmentedStream{api: "openai",
			parts: []string{
				": OPENROUTER PROCESSING\n\n" + openAIChunk(openAIRoleChunk) + ": keep-alive\n\n" + openAIChunk(`{}`) +
					openAIChunk(`{"content":null}`) + openAIChunk(`{"reasoning_content":"","reasoning":null}`) + ": ping\n\n",
				": ping\n\n",
				openAIChunk(`{"content":"Hi"}`) + openAIEnd},
			wantFirstBytes: []int{0, 0, 1}}},
		{"a tool call's name is a first token before any argument", segmentedStream{api: "openai",
			parts: []string{openAIChunk(`{"role":"assistant","content":null}`),
				openAIChunk(`{"tool_calls":[{"index":0,"id":"call_abc123","type":"function","function":{"name":"get_weather","arguments":""}}]}`),
				openAIChunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"location\":\"Paris\"}"}}]}`) + openAIToolEnd},
			wantFirstBytes: []int{0, 1, 1}}},
		{"reasoning_content is a first token before any content", segmentedStream{api: "openai",
			parts: []string{openAIChunk(`{"role":"assistant","content":null,"reasoning_content":""}`),
				openAIChunk(`{"content":null,"reasoning_content":"Okay, the user"}`),
				openAIChunk(`{"content":"Hello","reasoning_content":null}`) + openAIEnd},
			wantFirstBytes: []int{0, 1, 1}}},
		{"reasoning is a first token before any content", segmentedStream{api: "openai",
			parts: []string{openAIChunk(openAIRoleChunk),
				openAIChunk(`{"content":"","reasoning":"Let me think"}`),
				openAIChunk(`{"content":"Hello"}`) + openAIEnd},
			wantFirstBytes: []int{0, 1, 1}}},
		{"a refusal is a first token", segmentedStream{api: "openai",
			parts:          []string{openAIChunk(openAIRoleChunk), openAIChunk(`{"refusal":"I can't"}`) + openAIEnd},
			wantFirstBytes: []int{0, 1}}},
		{"a stream that ends without a token never reports a first byte", segmentedStream{api: "openai",
			parts:          []string{openAIChunk(openAIRoleChunk), openAIEnd},
			wantFirstBytes: []int{0, 0}}},
		{"a stream cut before its first token never reports a first byte", segmentedStream{api: "openai",
			parts:          []string{openAIChunk(openAIRoleChunk), ""},
			wantFirstBytes: []int{0, 0}, wantErr: true}},

		{"message_start, an empty text block and ping at once are no first byte: it comes with the first text", segmentedStream{api: "anthropic",
			parts:          []string{"", messagesOpening, messagesText(0, "Hello") + messagesEnd(0, "end_turn")},
			wantFirstBytes: []int{0, 0, 1}}},
		{"pings and comments during a stall are no first byte", segmentedStream{api: "anthropic",
			parts: []string{messagesOpening, sseEvent("ping", `{"type":"ping"}`) + ": keep-alive\n\n",
				messagesText(0, "Hi") + messagesEnd(0, "end_turn")},
			wantFirstBytes: []int{0, 0, 1}}},
		{"a tool_use block's start is a first token before its arguments", segmentedStream{api: "anthropic",
			parts: []string{sseEvent("message_start", `{"type":"message_start","message":{"id":"msg_014p","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5-20250929","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":472,"output_tokens":2}}}`) +
				sseEvent("ping", `{"type":"ping"}`),
				sseEvent("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","input":{}}}`) +
					sseEvent("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}`),
				sseEvent("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"location\": \"Paris\"}"}}`) +
					messagesEnd(0, "tool_use")},
			wantFirstBytes: []int{0, 1, 1}}},
		{"a thinking_delta is a first token, an empty thinking block's start is not", segmentedStream{api: "anthropic",
			parts: []string{sseEvent("message_start", `{"type":"message_start","message":{"id":"msg_01Hn","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5-20250929","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":30,"output_tokens":1}}}`) +
				sseEvent("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}`),
				sseEvent("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"The user wants"}}`),
				sseEvent("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCgIYAhIM"}}`) +
					sseEvent("content_block_stop", `{"type":"content_block_stop","index":0}`) +
					sseEvent("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`) +
					messagesText(1, "42") + messagesEnd(1, "end_turn")},
			wantFirstBytes: []int{0, 1, 1}}},
		{"a redacted thinking block is a first token", segmentedStream{api: "anthropic",
			parts: []string{messagesOpening + sseEvent("content_block_stop", `{"type":"content_block_stop","index":0}`),
				sseEvent("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"redacted_thinking","data":"EmwKAhgBEgy3va3pzix"}}`),
				sseEvent("content_block_stop", `{"type":"content_block_stop","index":1}`) + sseEvent("content_block_start", `{"type":"content_block_start","index":2,"content_block":{"type":"text","text":""}}`) +
					messagesText(2, "Hi") + messagesEnd(2, "end_turn")},
			wantFirstBytes: []int{0, 1, 1}}},
		{"a Messages stream cut before its first token never reports a first byte", segmentedStream{api: "anthropic",
			parts:          []string{messagesOpening, ""},
			wantFirstBytes: []int{0, 0}, wantErr: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.check(t) })
	}
}

func TestResponsesFirstByteIsTheFirstOutputNotResponseCreated(t *testing.T) {
	recorded, err := os.ReadFile("testdata/responses_stream_text.sse")
	if err != nil {
		t.Fatal(err)
	}
	text := string(recorded)
	firstDelta := strings.Index(text, "event: response.output_text.delta")
	refusalEvent := func(typ, fields string) string {
		return sseEvent(typ, `{"type":"`+typ+`","sequence_number":9,"item_id":"msg_1","output_index":0,"content_index":0,`+fields+`}`)
	}
	end := text[strings.Index(text, "event: response.output_text.done"):]
	tests := []struct {
		name string
		segmentedStream
	}{
		{"response.created, in_progress and the item and part added are no first byte: the first output text is", segmentedStream{api: "responses",
			parts: []string{text[:firstDelta], text[firstDelta:]}, wantFirstBytes: []int{0, 1}}},
		{"a refusal is a first token", segmentedStream{api: "responses",
			parts:          []string{text[:firstDelta], refusalEvent("response.refusal.delta", `"delta":"I can't help with that."`) + end},
			wantFirstBytes: []int{0, 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.check(t) })
	}
}

// check serves the stream part by part and checks, after each, how often
// the adapter has reported a first byte, and that the first byte came
// before the first delta.
func (s segmentedStream) check(t *testing.T) {
	t.Helper()
	release := make(chan struct{}, len(s.parts))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		for i, p := range s.parts {
			if i > 0 {
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
			}
			_, _ = io.WriteString(w, p)
			_ = rc.Flush()
		}
	}))
	defer srv.Close()

	// The body reader tells the test when the adapter asks for more after
	// having been handed every byte of a part: it has handled every event
	// of that part, since it reads the next only after handling the last.
	var ends []int
	n := 0
	for _, p := range s.parts[:len(s.parts)-1] {
		n += len(p)
		ends = append(ends, n)
	}
	read := make(chan int, len(ends))
	transport := http.DefaultTransport.(*http.Transport).Clone()
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := transport.RoundTrip(req)
		if err == nil {
			resp.Body = &partReader{ReadCloser: resp.Body, ends: ends, read: read}
		}
		return resp, err
	})}
	cfg := Options{BaseURL: srv.URL + "/v1", Model: "m", Client: client, Now: func() time.Time { return fixedNow }}
	var up Upstream
	req := hello()
	switch s.api {
	case "openai", "responses":
		if s.api == "responses" {
			req.Dialect = schemas.DialectResponses
		}
		o, err := NewOpenAI(cfg)
		if err != nil {
			t.Fatal(err)
		}
		up = o
	default:
		a, err := NewAnthropic(AnthropicOptions{Options: cfg})
		if err != nil {
			t.Fatal(err)
		}
		up = a
	}

	var sink traceSink
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := up.Stream(ctx, req, &sink)
		done <- err
	}()
	for i := range ends {
		select {
		case <-read:
		case err := <-done:
			t.Fatalf("Stream returned (%v) before reading part %d", err, i+1)
		case <-ctx.Done():
			t.Fatalf("the adapter never finished reading part %d", i)
		}
		if got := sink.firstBytes(); got != s.wantFirstBytes[i] {
			t.Fatalf("after part %d (%q): %d first bytes, want %d", i, s.parts[i], got, s.wantFirstBytes[i])
		}
		release <- struct{}{}
	}
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		t.Fatal("Stream did not return")
	}
	if (err != nil) != s.wantErr {
		t.Fatalf("Stream error %v, want error %v", err, s.wantErr)
	}
	last := len(s.parts) - 1
	if got := sink.firstBytes(); got != s.wantFirstBytes[last] {
		t.Fatalf("after the whole stream: %d first bytes, want %d", got, s.wantFirstBytes[last])
	}
	if tr := sink.trace(); len(tr) > 0 && tr[0] != "first_byte" {
		t.Fatalf("sink saw %v: a delta before the first byte", tr)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// partReader counts the body bytes handed to the adapter and sends on read
// the index of each part end once a Read starts after it.
type partReader struct {
	io.ReadCloser
	ends []int
	read chan<- int
	n    int
	next int
}

func (r *partReader) Read(p []byte) (int, error) {
	for r.next < len(r.ends) && r.n >= r.ends[r.next] {
		r.read <- r.next
		r.next++
	}
	k, err := r.ReadCloser.Read(p)
	r.n += k
	return k, err
}

// traceSink is a Sink that records the order of its calls for a test
// reading it from another goroutine.
type traceSink struct {
	mu     sync.Mutex
	events []string
}

func (s *traceSink) FirstByte() { s.add("first_byte") }

func (s *traceSink) Delta(d Delta) {
	s.add(fmt.Sprintf("delta %q %s", d.Content, d.ToolCalls))
}

func (s *traceSink) add(e string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, e)
}

func (s *traceSink) trace() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.events...)
}

func (s *traceSink) firstBytes() int {
	n := 0
	for _, e := range s.trace() {
		if strings.HasPrefix(e, "first_byte") {
			n++
		}
	}
	return n
}
