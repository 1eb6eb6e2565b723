package httpdoor

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/schemas"
)

// maxFailureMessage bounds the message of a refused body: fixed texts and
// the names of what the caller got wrong, clipped (clip), never the body.
// A bad request costs the door a bounded answer, however large it is.
const maxFailureMessage = 512

// doorParse is one dialect's body parser as the fuzz targets drive it.
type doorParse struct {
	name    schemas.Dialect   // the dialect the canonical request says it came in
	errors  frontdoor.Dialect // the dialect its failures are written in
	dl      dialect
	parse   func(body []byte) (pool string, req schemas.ChatRequest, f *frontdoor.Failure)
	seeds   []string
	onlyFor schemas.RequestKind
}

// checkDoorParse fails t unless the dialect's parser either refuses body
// with a 4xx failure written as the dialect's error object, bounded and
// without the prompt, or accepts it as a canonical request that validates,
// names its dialect, translates to every dialect or says why it cannot, and
// reaches a worker inside an attempt as the door read it.
func checkDoorParse(t *testing.T, d doorParse, body []byte) {
	t.Helper()
	pool, req, f := d.parse(body)
	if f != nil {
		checkRefusal(t, d, body, f)
		return
	}
	if pool == "" || req.Model != pool {
		t.Fatalf("%s accepted %q with pool %q, model %q", d.name, body, pool, req.Model)
	}
	if err := req.Validate(); err != nil {
		t.Fatalf("%s accepted %q as a request Validate refuses: %v", d.name, body, err)
	}
	if got := req.SourceDialect(); got != d.name {
		t.Fatalf("%s accepted %q as a request of dialect %q", d.name, body, got)
	}
	if d.onlyFor != "" && req.RequestKind() != d.onlyFor {
		t.Fatalf("%s accepted %q as a %s request", d.name, body, req.RequestKind())
	}
	for _, to := range []schemas.Dialect{schemas.DialectOpenAI, schemas.DialectAnthropic, schemas.DialectResponses} {
		if _, err := req.ForDialect(to); err != nil && !errors.Is(err, schemas.ErrUntranslatable) {
			t.Fatalf("%s accepted %q but its translation to %s fails untyped: %v", d.name, body, to, err)
		}
	}
	checkReachesWorker(t, req)
}

// checkRefusal is checkDoorParse for a refused body.
func checkRefusal(t *testing.T, d doorParse, body []byte, f *frontdoor.Failure) {
	t.Helper()
	if status := f.Status(d.errors); f.Code == "" || status/100 != 4 {
		t.Fatalf("%s refused %q with code %q, status %d: a bad body is a 4xx", d.name, body, f.Code, status)
	}
	if len(f.Message) > maxFailureMessage {
		t.Fatalf("%s refused a %d-byte body with a %d-byte message: %.200q", d.name, len(body), len(f.Message), f.Message)
	}
	if promptOnlyInContent(body) && strings.Contains(f.Message, frontdoortest.Prompt) {
		t.Fatalf("%s refused %q with a message that quotes the prompt: %q", d.name, body, f.Message)
	}
	rec := httptest.NewRecorder()
	d.dl.writeFailure(rec, f)
	if rec.Code != f.Status(d.errors) {
		t.Fatalf("%s wrote status %d for a failure of status %d", d.name, rec.Code, f.Status(d.errors))
	}
	if d.errors == frontdoor.Anthropic {
		frontdoortest.AnthropicErrorType(t, rec.Body.Bytes())
	} else {
		frontdoortest.OpenAIError(t, rec.Body.Bytes())
	}
}

// checkReachesWorker fails t unless req, sent to a worker in an attempt,
// decodes there to a request that encodes as req does and validates.
func checkReachesWorker(t *testing.T, req schemas.ChatRequest) {
	t.Helper()
	att := schemas.Attempt{GroupID: "g", Attempt: 1, CommitPoint: schemas.Complete, ReplyInbox: "_INBOX.x", Request: req}
	data, err := json.Marshal(att)
	if err != nil {
		t.Fatalf("an accepted request does not encode in an attempt: %v", err)
	}
	var got schemas.Attempt
	if err := schemas.Decode(data, &got); err != nil {
		t.Fatalf("the attempt %s of an accepted request does not decode: %v", data, err)
	}
	sent, _ := json.Marshal(req)
	arrived, _ := json.Marshal(got.Request)
	if !bytes.Equal(sent, arrived) {
		t.Fatalf("the request changed on the wire:\nsent    %s\narrived %s", sent, arrived)
	}
	if err := got.Request.Validate(); err != nil {
		t.Fatalf("the request %s arrives invalid: %v", arrived, err)
	}
}

// promptOnlyInContent reports that body is JSON in which the test prompt
// appears, and only inside strings a dialect carries as message content
// (not in a member name, a model or a type, which errors may name).
func promptOnlyInContent(body []byte) bool {
	var v any
	if !bytes.Contains(body, []byte(frontdoortest.Prompt)) || json.Unmarshal(body, &v) != nil {
		return false
	}
	found, elsewhere := false, false
	var walk func(key string, v any)
	walk = func(key string, v any) {
		switch v := v.(type) {
		case string:
			if strings.Contains(v, frontdoortest.Prompt) {
				switch key {
				case "content", "text", "input", "instructions", "system":
					found = true
				default:
					elsewhere = true
				}
			}
		case []any:
			for _, e := range v {
				walk(key, e)
			}
		case map[string]any:
			for k, e := range v {
				if strings.Contains(k, frontdoortest.Prompt) {
					elsewhere = true
				}
				walk(k, e)
			}
		}
	}
	walk("", v)
	return found && !elsewhere
}

func fuzzDoor(f *testing.F, d doorParse) {
	for _, s := range d.seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) { checkDoorParse(t, d, body) })
}

func FuzzChatCompletionsRequest(f *testing.F) {
	fuzzDoor(f, doorParse{
		name: schemas.DialectOpenAI, errors: frontdoor.OpenAI, dl: openAIDialect{},
		parse: func(body []byte) (string, schemas.ChatRequest, *frontdoor.Failure) {
			pool, req, includeUsage, f := parseChatRequest(body)
			if includeUsage && !req.Stream {
				return "", req, &frontdoor.Failure{Message: "include_usage without stream"} // fails the 4xx check
			}
			return pool, req, f
		},
		seeds: []string{
			chatBody(false, ""),
			chatBody(true, `"stream_options":{"include_usage":true},"stop":["\n","END"],"temperature":0.2,"seed":7,"n":1`),
			chatBody(false, `"max_completion_tokens":9,"max_tokens":4,"user":"u","logit_bias":{"50256":-100}`),
			chatBody(false, `"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"auto","parallel_tool_calls":false`),
			chatBody(false, `"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object"}}}`),
			`{"model":"general","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"tell-me-the-secret-plan"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]},` +
				`{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}]}`,
			`{"model":"general","messages":[{"role":"user","content":"tell-me-the-secret-plan"}],"temperature":3}`,
			`{"model":"general","messages":[`,
			`[]`,
		},
	})
}

func FuzzMessagesRequest(f *testing.F) {
	fuzzDoor(f, doorParse{
		name: schemas.DialectAnthropic, errors: frontdoor.Anthropic, dl: anthropicDialect{},
		parse: parseMessagesRequest,
		seeds: []string{
			messagesRequest(false, ""),
			messagesRequest(true, `"system":"be brief","temperature":0.3,"top_p":0.8,"top_k":5,"stop_sequences":["END"],"metadata":{"user_id":"u"}`),
			messagesRequest(false, `"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],"thinking":{"type":"enabled","budget_tokens":1024}`),
			`{"model":"general","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"tell-me-the-secret-plan"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]},` +
				`{"role":"assistant","content":[{"type":"text","text":"t"},{"type":"tool_use","id":"tu","name":"f","input":{"a":1}}]},` +
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu","content":"r"}]}],` +
				`"tools":[{"name":"f","description":"d","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f","disable_parallel_tool_use":true}}`,
			`{"model":"general","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"tell-me-the-secret-plan"}}]}]}`,
			`{"model":"general","messages":[{"role":"user","content":"x"}]}`,
			`{"model":"general","max_tokens":5,"messages":[{"role":"system","content":"x"}]}`,
		},
	})
}

func FuzzResponsesRequest(f *testing.F) {
	fuzzDoor(f, doorParse{
		name: schemas.DialectResponses, errors: frontdoor.OpenAI, dl: responsesDialect{},
		parse: parseResponsesRequest,
		seeds: []string{
			`{"model":"general","input":"tell-me-the-secret-plan"}`,
			`{"model":"general","instructions":"be brief","input":"hi","max_output_tokens":20,"stream":true,"temperature":0.5,"store":false}`,
			`{"model":"general","input":[{"role":"user","content":[{"type":"input_text","text":"tell-me-the-secret-plan"},{"type":"input_image","image_url":"data:image/png;base64,AAAA"}]},` +
				`{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"r"},` +
				`{"role":"assistant","content":[{"type":"output_text","text":"t"}]}],` +
				`"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":{"type":"function","name":"f"}}`,
			`{"model":"general","input":"x","text":{"format":{"type":"json_schema","name":"a","schema":{"type":"object"}}}}`,
			`{"model":"general","input":[{"type":"reasoning","summary":[]}]}`,
			`{"model":"general","input":"x","text":{"verbosity":"low"}}`,
		},
	})
}

func FuzzEmbeddingsRequest(f *testing.F) {
	fuzzDoor(f, doorParse{
		name: schemas.DialectOpenAI, errors: frontdoor.OpenAI, dl: openAIDialect{},
		parse: parseEmbeddingsRequest, onlyFor: schemas.KindEmbeddings,
		seeds: []string{
			`{"model":"embed","input":"tell-me-the-secret-plan"}`,
			`{"model":"embed","input":["a","b"],"encoding_format":"float","dimensions":8,"user":"u"}`,
			`{"model":"embed","input":[1,2,3]}`,
			`{"model":"embed","input":[]}`,
			`{"model":"embed","input":"x","encoding_format":"base64"}`,
		},
	})
}

// TestATypeNameQuotedBackInAMessagesErrorIsClipped: the Messages door
// quotes an unsupported block or tool type back, clipped as the Responses
// door clips its names, so a long type cannot make a long answer (found by
// FuzzMessagesRequest's bound on failure messages).
func TestATypeNameQuotedBackInAMessagesErrorIsClipped(t *testing.T) {
	long := strings.Repeat("x", 4096)
	for _, tc := range []struct{ name, body string }{
		{"a user block", `{"model":"general","max_tokens":5,"messages":[{"role":"user","content":[{"type":"` + long + `"}]}]}`},
		{"an assistant block", `{"model":"general","max_tokens":5,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"` + long + `"}]}]}`},
		{"a tool", `{"model":"general","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"` + long + `"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, f := parseMessagesRequest([]byte(tc.body))
			if f == nil {
				t.Fatal("accepted")
			}
			if len(f.Message) > maxFailureMessage || !strings.Contains(f.Message, strings.Repeat("x", 64)) {
				t.Errorf("message of %d bytes: %.120q…", len(f.Message), f.Message)
			}
		})
	}
}
