package httpdoor

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
)

// hostileCase is one hostile request and the refusal it must get: a 400 in
// the dialect of its path, naming param.
type hostileCase struct {
	name, path, body, param string
}

// refusedInDialect checks a refusal is a JSON error of the path's dialect
// naming param: the OpenAI object's param, or the Anthropic message.
func refusedInDialect(t *testing.T, tc hostileCase, resp *http.Response, body []byte, status int) {
	t.Helper()
	if resp.StatusCode != status || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d (%s), want %d JSON: %s", resp.StatusCode, resp.Header.Get("Content-Type"), status, body)
	}
	if tc.path == "/v1/messages" {
		if typ := anthropicErrorType(t, body); typ != "invalid_request_error" && typ != "request_too_large" {
			t.Fatalf("Anthropic error type %q: %s", typ, body)
		}
		if tc.param != "" && !strings.Contains(string(body), tc.param) {
			t.Fatalf("the error does not name %s: %s", tc.param, body)
		}
		return
	}
	typ, _, param := openAIErrorOf(t, body)
	if typ != "invalid_request_error" || param != tc.param {
		t.Fatalf("error type %q param %q, want invalid_request_error naming %q: %s", typ, param, tc.param, body)
	}
}

func TestMaxTokensOverTheModelsLimitIsRefusedNamingItsParameter(t *testing.T) {
	const huge = "9223372036854775807" // 2^63-1
	tests := []hostileCase{
		{"chat max_tokens of 2^63-1", "/v1/chat/completions",
			strings.Replace(chatBody(false, ""), `"max_tokens":50`, `"max_tokens":`+huge, 1), "max_tokens"},
		{"chat max_completion_tokens one over the limit", "/v1/chat/completions",
			chatBody(false, `"max_completion_tokens":1001`), "max_completion_tokens"},
		{"messages max_tokens of 2^63-1", "/v1/messages",
			strings.Replace(messagesRequest(false, ""), `"max_tokens":50`, `"max_tokens":`+huge, 1), "max_tokens"},
		{"responses max_output_tokens of 2^63-1", "/v1/responses",
			`{"model":"general","input":"hi","max_output_tokens":` + huge + `}`, "max_output_tokens"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sub := frontdoortest.New(frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false))
			sub.MaxOutputTokens = 1000
			srv := frontDoor(t, sub, Options{})
			resp, body := frontdoortest.Do(t, http.MethodPost, srv.URL+tc.path, tc.body, nil)
			refusedInDialect(t, tc, resp, body, http.StatusBadRequest)
			if n := len(sub.Submissions()); n != 0 {
				t.Fatalf("%d submissions, want none", n)
			}
		})
	}
}

// countingReader yields n bytes of 'a' and counts how many were read (the
// client's transport reads it on a goroutine of its own).
type countingReader struct {
	n    int64
	read atomic.Int64
}

func (r *countingReader) Read(p []byte) (int, error) {
	done := r.read.Load()
	if done >= r.n {
		return 0, io.EOF
	}
	k := min(int64(len(p)), r.n-done)
	for i := range k {
		p[i] = 'a'
	}
	r.read.Add(k)
	return int(k), nil
}

func TestOversizedRequestsAreRefusedInTheDoorsDialectBeforeTheBodyIsRead(t *testing.T) {
	const bodySize = 50 << 20
	bigHeader := strings.Repeat("h", 200<<10)
	tests := []struct {
		hostileCase
		header string
		status int
	}{
		{hostileCase{"a 50 MiB chat body", "/v1/chat/completions", "", ""}, "", http.StatusRequestEntityTooLarge},
		{hostileCase{"a 50 MiB messages body", "/v1/messages", "", ""}, "", http.StatusRequestEntityTooLarge},
		{hostileCase{"a 200 KiB header on chat", "/v1/chat/completions", "", ""}, bigHeader, http.StatusRequestHeaderFieldsTooLarge},
		{hostileCase{"a 200 KiB header on messages", "/v1/messages", "", ""}, bigHeader, http.StatusRequestHeaderFieldsTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv, sub := scripted(t, frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false), Options{})
			body := &countingReader{n: bodySize}
			if tc.header != "" {
				body.n = int64(len(chatBody(false, "")))
			}
			req, err := http.NewRequest(http.MethodPost, srv.URL+tc.path, body)
			if err != nil {
				t.Fatal(err)
			}
			req.ContentLength = body.n
			if tc.header != "" {
				req.Header.Set("X-Padding", tc.header)
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			defer resp.Body.Close()
			raw, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			refusedInDialect(t, tc.hostileCase, resp, raw, tc.status)
			if tc.header == "" && body.read.Load() > bodySize/2 {
				t.Errorf("the client sent %d of %d bytes before the refusal: the body was read", body.read.Load(), bodySize)
			}
			if n := len(sub.Submissions()); n != 0 {
				t.Fatalf("%d submissions, want none", n)
			}
		})
	}
}
