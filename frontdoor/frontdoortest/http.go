package frontdoortest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Prompt is distinctive so a test can prove no answer echoes it.
const Prompt = "tell-me-the-secret-plan"

// ChatBody is a chat completions request for the pool "general" asking
// Prompt, with extra JSON members appended.
func ChatBody(stream bool, extra string) string {
	s := fmt.Sprintf(`{"model":"general","messages":[{"role":"user","content":%q}],"max_tokens":50,"stream":%t`, Prompt, stream)
	if extra != "" {
		s += "," + extra
	}
	return s + "}"
}

// MessagesBody is a Messages request for the pool "general" asking Prompt,
// with extra JSON members appended.
func MessagesBody(stream bool, extra string) string {
	s := fmt.Sprintf(`{"model":"general","max_tokens":50,"messages":[{"role":"user","content":%q}],"stream":%t`, Prompt, stream)
	if extra != "" {
		s += "," + extra
	}
	return s + "}"
}

// Post sends body to url+path as JSON with the headers given.
func Post(t testing.TB, ctx context.Context, url, body string, headers map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return resp
}

// OpenAIError checks body is an OpenAI error object — message, type, param
// and code all present — and returns it.
func OpenAIError(t testing.TB, body []byte) (typ, code, param string) {
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

// AnthropicErrorType checks body is an Anthropic error object — type
// "error", an error with a type and a message — and returns its type.
func AnthropicErrorType(t testing.TB, body []byte) string {
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

// SSEEvents reads a whole event stream of data lines: the data of each
// event.
func SSEEvents(t testing.TB, r io.Reader) []string {
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

// Usage is the usage object of OpenAI's answers.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

// ChatStream is what a streamed chat completion carried.
type ChatStream struct {
	ID           string
	Content      string
	FinishReason string
	Usage        *Usage // the usage chunk, when the caller asked for one
}

// ReadChatStream checks the events of a streamed chat completion of the
// pool "general" against the shape OpenAI's clients expect — chunks of one
// id, the assistant's role first, content, then the finish reason, then
// (when includeUsage) a usage chunk with no choices, usage null on every
// other chunk and absent when not asked for, and [DONE] last — and returns
// what they carried.
func ReadChatStream(t testing.TB, events []string, includeUsage bool) ChatStream {
	t.Helper()
	if len(events) < 4 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("events %q: want role, content, finish (, usage) and [DONE]", events)
	}
	type chunk struct {
		ID      string           `json:"id"`
		Object  string           `json:"object"`
		Model   string           `json:"model"`
		Choices []map[string]any `json:"choices"`
		Usage   *Usage           `json:"usage"`
	}
	var chunks []chunk
	for _, e := range events[:len(events)-1] {
		var raw map[string]json.RawMessage
		var ck chunk
		if json.Unmarshal([]byte(e), &raw) != nil || json.Unmarshal([]byte(e), &ck) != nil {
			t.Fatalf("event %q is not a JSON chunk", e)
		}
		if _, has := raw["usage"]; has != includeUsage {
			t.Fatalf("chunk %s: usage key present = %t, want %t", e, has, includeUsage)
		}
		if ck.Object != "chat.completion.chunk" || ck.Model != "general" || ck.ID == "" || len(chunks) > 0 && ck.ID != chunks[0].ID {
			t.Fatalf("chunk %s", e)
		}
		chunks = append(chunks, ck)
	}
	if d, _ := chunks[0].Choices[0]["delta"].(map[string]any); d["role"] != "assistant" {
		t.Fatalf("first chunk %+v, want the assistant role", chunks[0])
	}
	out := ChatStream{ID: chunks[0].ID}
	body := chunks[1:]
	if includeUsage {
		last := body[len(body)-1]
		if len(last.Choices) != 0 || last.Usage == nil {
			t.Fatalf("usage chunk %+v", last)
		}
		out.Usage, body = last.Usage, body[:len(body)-1]
	}
	out.FinishReason, _ = body[len(body)-1].Choices[0]["finish_reason"].(string)
	if out.FinishReason == "" {
		t.Fatalf("finish chunk %+v", body[len(body)-1])
	}
	var text strings.Builder
	for _, ck := range body[:len(body)-1] {
		if ck.Choices[0]["finish_reason"] != nil {
			t.Fatalf("content chunk %+v has a finish reason", ck)
		}
		content, _ := ck.Choices[0]["delta"].(map[string]any)["content"].(string)
		text.WriteString(content)
	}
	out.Content = text.String()
	return out
}

// Do sends a request with the headers given and returns the response with
// its whole body read.
func Do(t testing.TB, method, url, body string, headers map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, data
}

// ReadUntil reads a stream line by line until a line holds want, failing
// the test if the stream ends first.
func ReadUntil(t testing.TB, r io.Reader, want string) {
	t.Helper()
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before %q: %v", want, err)
		}
		if strings.Contains(line, want) {
			return
		}
	}
}
