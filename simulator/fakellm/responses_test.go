package fakellm_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

// postResponses sends a Responses request and returns the status, headers
// and body.
func (fs *fakeServer) postResponses(t *testing.T, body string) (int, http.Header, []byte) {
	t.Helper()
	resp := fs.do(t, context.Background(), http.MethodPost, "/v1/responses", body)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	return resp.StatusCode, resp.Header, data
}

// responsesBody asks prompt with the system prompt chatBody sends, as
// instructions.
func responsesBody(prompt, extra string) string {
	if extra != "" {
		extra = "," + extra
	}
	return `{"model":"gpt-fake","instructions":"be brief","input":` + quote(prompt) + extra + `}`
}

type responseObject struct {
	ID, Object, Status, Model string
	Output                    []struct {
		Type, Role, Status string
		Content            []struct{ Type, Text string }
	}
	IncompleteDetails *struct{ Reason string } `json:"incomplete_details"`
	Usage             struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
		TotalTokens  int64 `json:"total_tokens"`
	}
}

func TestResponsesAnswerIsTheChatDraw(t *testing.T) {
	fs := startServer(t, fakellm.Options{Model: steadyModel(t, 40), Seed: 1, TimeScale: fastScale})
	_, _, chat := fs.post(t, chatBody("hello", ""))
	chatRec := fs.nextRecord(t)
	var cc struct {
		Choices []struct{ Message struct{ Content string } }
	}
	if err := json.Unmarshal(chat, &cc); err != nil {
		t.Fatal(err)
	}
	status, hdr, body := fs.postResponses(t, responsesBody("hello", ""))
	if status != http.StatusOK || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
		t.Fatalf("status %d: %s", status, body)
	}
	var r responseObject
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	rec := fs.nextRecord(t)
	if r.Object != "response" || !strings.HasPrefix(r.ID, "resp_") || r.Status != "completed" || r.Model != "gpt-fake" ||
		len(r.Output) != 1 || r.Output[0].Type != "message" || r.Output[0].Role != "assistant" || len(r.Output[0].Content) != 1 {
		t.Fatalf("response %s", body)
	}
	if text := r.Output[0].Content[0].Text; text != cc.Choices[0].Message.Content || rec.BilledInputTokens != chatRec.BilledInputTokens {
		t.Fatalf("responses answer %q (input %d), chat answer %q (input %d): the same conversation draws the same answer",
			text, rec.BilledInputTokens, cc.Choices[0].Message.Content, chatRec.BilledInputTokens)
	}
	if r.Usage.OutputTokens != 40 || r.Usage.InputTokens != rec.BilledInputTokens || r.Usage.TotalTokens != 40+r.Usage.InputTokens {
		t.Fatalf("usage %+v, record %+v", r.Usage, rec)
	}
}

func TestResponsesStreamEvents(t *testing.T) {
	fs := startServer(t, fakellm.Options{Model: steadyModel(t, 40), Seed: 1, TimeScale: fastScale})
	status, hdr, body := fs.postResponses(t, responsesBody("hello", `"stream":true,"max_output_tokens":5`))
	if status != http.StatusOK || hdr.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d: %s", status, body)
	}
	var names []string
	var text, done string
	var final map[string]any
	for i, e := range parseNamedSSE(t, body) {
		if e.data["sequence_number"] != float64(i) {
			t.Fatalf("event %d: sequence_number %v", i, e.data["sequence_number"])
		}
		if len(names) == 0 || names[len(names)-1] != e.name {
			names = append(names, e.name)
		}
		switch e.name {
		case "response.output_text.delta":
			text += e.data["delta"].(string)
		case "response.output_text.done":
			done = e.data["text"].(string)
		case "response.incomplete":
			final = e.data["response"].(map[string]any)
		}
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added " +
		"response.output_text.delta response.output_text.done response.content_part.done response.output_item.done response.incomplete"
	if strings.Join(names, " ") != want {
		t.Fatalf("events %v", names)
	}
	if len(strings.Fields(text)) != 5 || done != text || final["incomplete_details"].(map[string]any)["reason"] != "max_output_tokens" ||
		final["usage"].(map[string]any)["output_tokens"] != float64(5) {
		t.Fatalf("text %q, done %q, final %v", text, done, final)
	}
	if rec := fs.nextRecord(t); rec.FinishReason != "length" || rec.BilledOutputTokens != 5 {
		t.Fatalf("record %+v", rec)
	}
}

func TestResponsesBadRequests(t *testing.T) {
	fs := startServer(t, fakellm.Options{Model: steadyModel(t, 40), Seed: 1, TimeScale: fastScale})
	for _, tc := range []struct{ body, param string }{
		{`{"model":"m"}`, "input"},
		{`{"model":"m","input":[{"type":"reasoning"}]}`, "input[0].type"},
		{`{"model":"m","input":"hi","max_output_tokens":0}`, "max_output_tokens"},
	} {
		status, _, body := fs.postResponses(t, tc.body)
		var e struct{ Error struct{ Param string } }
		if status != http.StatusBadRequest || json.Unmarshal(body, &e) != nil || e.Error.Param != tc.param {
			t.Errorf("%s: status %d, %s; want 400 naming %s", tc.body, status, body, tc.param)
		}
	}
}
