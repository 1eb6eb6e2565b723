package httpdoor

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/schemas"
)

func postResponses(t *testing.T, url, body string) *http.Response {
	t.Helper()
	return frontdoortest.Post(t, context.Background(), url+"/v1/responses", body, nil)
}

// responsesEvents reads a Responses event stream: each event's name, which
// must be its data's type, and its data.
func responsesEvents(t *testing.T, r io.Reader) (names []string, data []map[string]any) {
	t.Helper()
	sc := bufio.NewScanner(r)
	name := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var ev map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev); err != nil {
				t.Fatalf("event data %q: %v", line, err)
			}
			if ev["type"] != name {
				t.Fatalf("event %q carries type %v", name, ev["type"])
			}
			if seq, _ := ev["sequence_number"].(float64); int(seq) != len(names) {
				t.Fatalf("event %d has sequence_number %v", len(names), ev["sequence_number"])
			}
			names, data = append(names, name), append(data, ev)
		default:
			t.Fatalf("stream line %q", line)
		}
	}
	return names, data
}

func TestResponsesRequestBecomesTheCanonicalRequest(t *testing.T) {
	srv, sub := scripted(t, frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false), Options{})
	body := `{"model":"general","instructions":"Be brief.","max_output_tokens":40,"temperature":0.5,
		"input":[{"role":"user","content":"` + prompt + `"},
			{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
			{"type":"function_call","call_id":"c2","name":"g","arguments":"{}"},
			{"type":"function_call_output","call_id":"c1","output":"1"},
			{"type":"message","role":"user","content":[{"type":"input_text","text":"and?"}]}],
		"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],
		"tool_choice":{"type":"function","name":"f"},
		"text":{"format":{"type":"json_schema","name":"s","schema":{"type":"object"}}},
		"user":"u1","store":false}`
	resp := postResponses(t, srv.URL, body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	req := sub.Submissions()[0].Request
	if req.Dialect != schemas.DialectResponses || req.Model != "general" || req.MaxTokens != 40 ||
		req.MaxTokensField != schemas.ParamMaxCompletionTokens || *req.Temperature != 0.5 {
		t.Fatalf("request %+v", req)
	}
	roles := []schemas.MessageRole{}
	for _, m := range req.Messages {
		roles = append(roles, m.Role)
	}
	want := []schemas.MessageRole{"system", "user", "assistant", "tool", "user"}
	if strings.Join(toStrings(roles), " ") != strings.Join(toStrings(want), " ") {
		t.Fatalf("roles %v, want %v", roles, want)
	}
	if got := string(req.Messages[2].ToolCalls); got != `[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"c2","type":"function","function":{"name":"g","arguments":"{}"}}]` {
		t.Fatalf("tool calls %s", got)
	}
	if got := string(req.Tools); got != `[{"function":{"name":"f","parameters":{"type":"object"}},"type":"function"}]` {
		t.Fatalf("tools %s", got)
	}
	if got := string(req.ToolChoice); got != `{"function":{"name":"f"},"type":"function"}` {
		t.Fatalf("tool_choice %s", got)
	}
	if got := string(req.ResponseFormat); got != `{"json_schema":{"name":"s","schema":{"type":"object"}},"type":"json_schema"}` {
		t.Fatalf("response_format %s", got)
	}
	if len(req.Extra) != 2 || string(req.Extra["user"]) != `"u1"` || string(req.Extra["store"]) != "false" {
		t.Fatalf("extra %v", req.ExtraNames())
	}
}

func toStrings(rs []schemas.MessageRole) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = string(r)
	}
	return out
}

func TestResponsesAnswer(t *testing.T) {
	srv, _ := scripted(t, frontdoortest.Answer(&dispatcher.Response{GroupID: "g1", Content: "Hello", Attempts: 2, Hedged: true,
		ToolCalls: []byte(`[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]`),
		Usage:     schemas.Usage{InputUnits: 7, OutputUnits: 3}, WinnerRoute: "b", Gate: "g"}, false), Options{})
	resp := postResponses(t, srv.URL, `{"model":"general","input":"hi"}`)
	defer resp.Body.Close()
	var got struct {
		ID, Object, Status, Model string
		CreatedAt                 int64 `json:"created_at"`
		Output                    []struct {
			Type, ID, Status, Role, Name, Arguments string
			CallID                                  string `json:"call_id"`
			Content                                 []struct{ Type, Text string }
		}
		Usage struct {
			InputTokens  int64 `json:"input_tokens"`
			OutputTokens int64 `json:"output_tokens"`
			TotalTokens  int64 `json:"total_tokens"`
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || got.ID != "resp_g1" || got.Object != "response" || got.Status != "completed" || got.Model != "general" || got.CreatedAt == 0 {
		t.Fatalf("status %d, response %+v", resp.StatusCode, got)
	}
	if len(got.Output) != 2 || got.Output[0].Type != "message" || got.Output[0].Role != "assistant" ||
		len(got.Output[0].Content) != 1 || got.Output[0].Content[0].Type != "output_text" || got.Output[0].Content[0].Text != "Hello" ||
		got.Output[1].Type != "function_call" || got.Output[1].CallID != "call_1" || got.Output[1].Name != "f" || got.Output[1].Arguments != `{"a":1}` {
		t.Fatalf("output %+v", got.Output)
	}
	if got.Usage.InputTokens != 7 || got.Usage.OutputTokens != 3 || got.Usage.TotalTokens != 10 {
		t.Fatalf("usage %+v", got.Usage)
	}
	if resp.Header.Get("X-Hedgerow-Attempts") != "2" || resp.Header.Get("X-Hedgerow-Winner-Route") != "b" {
		t.Fatalf("headers %v", resp.Header)
	}
}

func TestResponsesAnswerCutShortIsIncomplete(t *testing.T) {
	srv, _ := scripted(t, frontdoortest.Answer(&dispatcher.Response{Content: "Hel", FinishReason: "length"}, false), Options{})
	resp := postResponses(t, srv.URL, `{"model":"general","input":"hi","max_output_tokens":1}`)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), `"status":"incomplete","error":null,"incomplete_details":{"reason":"max_output_tokens"}`) {
		t.Fatalf("body %s", b)
	}
}

func TestResponsesStreamEvents(t *testing.T) {
	final := &dispatcher.Response{GroupID: "g2", Content: "Hello", Usage: schemas.Usage{InputUnits: 5, OutputUnits: 2}, WinnerRoute: "a", Attempts: 1}
	srv, _ := scripted(t, frontdoortest.Answer(final, true,
		dispatcher.Delta{Content: "Hel"}, dispatcher.Delta{Content: "lo"},
		dispatcher.Delta{ToolCalls: []byte(`[{"index":0,"id":"call_9","type":"function","function":{"name":"f","arguments":""}}]`)},
		dispatcher.Delta{ToolCalls: []byte(`[{"index":0,"function":{"arguments":"{}"}}]`)},
	), Options{})
	resp := postResponses(t, srv.URL, `{"model":"general","input":"hi","stream":true}`)
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("X-Hedgerow-Winner-Route") != "a" {
		t.Fatalf("status %d headers %v", resp.StatusCode, resp.Header)
	}
	names, data := responsesEvents(t, resp.Body)
	want := []string{"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
		"response.output_item.added", "response.function_call_arguments.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.function_call_arguments.done", "response.output_item.done", "response.completed"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Fatalf("events\n%v\nwant\n%v", names, want)
	}
	if data[0]["response"].(map[string]any)["id"] != "resp_g2" || data[0]["response"].(map[string]any)["status"] != "in_progress" {
		t.Fatalf("created %v", data[0])
	}
	if data[4]["delta"] != "Hel" || data[4]["item_id"] != "msg_g2" || data[8]["text"] != "Hello" {
		t.Fatalf("text events %v %v", data[4], data[8])
	}
	if data[11]["arguments"] != "{}" || data[11]["name"] != "f" || data[11]["output_index"] != float64(1) {
		t.Fatalf("arguments done %v", data[11])
	}
	done := data[len(data)-1]["response"].(map[string]any)
	out := done["output"].([]any)
	usage := done["usage"].(map[string]any)
	if done["status"] != "completed" || len(out) != 2 || usage["total_tokens"] != float64(7) {
		t.Fatalf("completed %v", done)
	}
}

func TestResponsesStreamFailures(t *testing.T) {
	t.Run("before the first byte: a JSON error", func(t *testing.T) {
		srv, _ := scripted(t, frontdoortest.Fail(&dispatcher.GroupError{Code: schemas.ErrDeadlineExceeded}), Options{})
		resp := postResponses(t, srv.URL, `{"model":"general","input":"hi","stream":true}`)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		openAIErrorOf(t, b)
	})
	t.Run("after it: an error event", func(t *testing.T) {
		srv, _ := scripted(t, frontdoortest.Fail(&dispatcher.GroupError{Code: schemas.ErrAllRoutesFailed, Streamed: true},
			dispatcher.Delta{Content: "Hel"}), Options{})
		resp := postResponses(t, srv.URL, `{"model":"general","input":"hi","stream":true}`)
		defer resp.Body.Close()
		names, data := responsesEvents(t, resp.Body)
		last := data[len(data)-1]
		if names[len(names)-1] != "error" || last["message"] == "" || last["code"] == nil {
			t.Fatalf("events %v, last %v", names, last)
		}
		for _, n := range names {
			if n == "response.completed" {
				t.Fatal("a failed stream completed")
			}
		}
	})
}

func TestResponsesBadRequests(t *testing.T) {
	srv, sub := scripted(t, frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false), Options{})
	for _, tc := range []struct{ name, body, param string }{
		{"not an object", `[1]`, ""},
		{"no model", `{"input":"hi"}`, "model"},
		{"no input", `{"model":"general"}`, "input"},
		{"input of the wrong type", `{"model":"general","input":3}`, "input"},
		{"an item we cannot serve", `{"model":"general","input":[{"type":"reasoning","id":"r"}]}`, "input[0].type"},
		{"a bad role", `{"model":"general","input":[{"role":"robot","content":"x"}]}`, "input[0].role"},
		{"a bad part", `{"model":"general","input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]}`, "input[0].content[0]"},
		{"a hosted tool", `{"model":"general","input":"hi","tools":[{"type":"web_search"}]}`, "tools[0].type"},
		{"a zero cap", `{"model":"general","input":"hi","max_output_tokens":0}`, "max_output_tokens"},
		{"a cap of the wrong type", `{"model":"general","input":"hi","max_output_tokens":"x"}`, "max_output_tokens"},
		{"temperature out of range", `{"model":"general","input":"hi","temperature":3}`, "temperature"},
		{"verbosity", `{"model":"general","input":"hi","text":{"verbosity":"low"}}`, "text.verbosity"},
		{"a bad format", `{"model":"general","input":"hi","text":{"format":{"type":"xml"}}}`, "text.format.type"},
		{"a schema that does not compile", `{"model":"general","input":"hi","text":{"format":{"type":"json_schema","name":"s","schema":{"$ref":"https://x/s.json"}}}}`, "text.format.schema"},
		{"a schema bomb 1600 levels deep", `{"model":"general","input":"hi","text":{"format":{"type":"json_schema","name":"s","schema":` + schemaBomb(1600) + `}}}`, "text.format.schema"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := postResponses(t, srv.URL, tc.body)
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			typ, _, param := openAIErrorOf(t, b)
			if typ != "invalid_request_error" || param != tc.param {
				t.Fatalf("type %q param %q, want %q: %s", typ, param, tc.param, b)
			}
		})
	}
	if n := len(sub.Submissions()); n != 0 {
		t.Fatalf("%d bad requests were submitted", n)
	}
	resp, _ := frontdoortest.Do(t, http.MethodGet, srv.URL+"/v1/responses", "", nil)
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET: status %d", resp.StatusCode)
	}
}
