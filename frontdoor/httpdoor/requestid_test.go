package httpdoor

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/schemas"
)

// Every answer of the API — each dialect's answer and stream, and a
// refusal — carries request-id (which the Anthropic SDKs read) and
// x-request-id (the OpenAI SDKs'), both the id of the group the request ran
// as.
func TestEveryAnswerCarriesRequestIDAndXRequestIDOfItsGroup(t *testing.T) {
	resp := &dispatcher.Response{GroupID: "g-1", Content: "a0 a1", FinishReason: "stop", Usage: schemas.Usage{InputUnits: 3, OutputUnits: 2},
		Attempts: 1, Winner: 1, WinnerRoute: "a", Gate: "g-1/1/1"}
	srv, sub := scripted(t, frontdoortest.Answer(resp, true, dispatcher.Delta{Content: "a0 "}, dispatcher.Delta{Content: "a1"}), Options{})
	anthropic := map[string]string{"Anthropic-Version": "2023-06-01"}
	for _, tc := range []struct {
		name, path, body string
		headers          map[string]string
		status           int
		submitted        bool
	}{
		{"chat completion", "/v1/chat/completions", chatBody(false, ""), nil, 200, true},
		{"chat stream", "/v1/chat/completions", chatBody(true, ""), nil, 200, true},
		{"message", "/v1/messages", `{"model":"general","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, anthropic, 200, true},
		{"message stream", "/v1/messages", `{"model":"general","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, anthropic, 200, true},
		{"response", "/v1/responses", `{"model":"general","input":"hi"}`, nil, 200, true},
		{"refusal of a body", "/v1/chat/completions", `{"model":`, nil, 400, false},
		{"refusal of a method", "/v1/messages", "", anthropic, 405, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(sub.Submissions())
			var r *http.Response
			if tc.status == 405 {
				req, err := http.NewRequest(http.MethodGet, srv.URL+tc.path, nil)
				if err != nil {
					t.Fatal(err)
				}
				if r, err = http.DefaultClient.Do(req); err != nil {
					t.Fatal(err)
				}
			} else {
				r = frontdoortest.Post(t, context.Background(), srv.URL+tc.path, tc.body, tc.headers)
			}
			_, _ = io.Copy(io.Discard, r.Body)
			r.Body.Close()
			id, xid := r.Header.Get("request-id"), r.Header.Get("x-request-id")
			if r.StatusCode != tc.status || id == "" || id != xid {
				t.Fatalf("status %d (want %d), request-id %q, x-request-id %q: want one id in both", r.StatusCode, tc.status, id, xid)
			}
			subs := sub.Submissions()
			if !tc.submitted {
				if len(subs) != before {
					t.Fatalf("a refused request was submitted")
				}
				return
			}
			if len(subs) != before+1 || subs[before].GroupID != id {
				t.Fatalf("request-id %q, want the id its group was submitted under (%d submissions)", id, len(subs)-before)
			}
		})
	}
	if frontdoor.HeaderRequestID != "Request-Id" || frontdoor.HeaderXRequestID != "X-Request-Id" {
		t.Errorf("header names %q, %q", frontdoor.HeaderRequestID, frontdoor.HeaderXRequestID)
	}
}
