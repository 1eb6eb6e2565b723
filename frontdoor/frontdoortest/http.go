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
