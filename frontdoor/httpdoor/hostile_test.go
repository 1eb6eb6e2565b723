package httpdoor

import (
	"net/http"
	"strings"
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
