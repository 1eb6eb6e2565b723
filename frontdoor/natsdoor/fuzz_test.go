package natsdoor

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/schemas"
)

// checkSubmission fails t unless the door either refuses data as a bad
// request (a 4xx wire code: the caller's to fix, never an internal error),
// or accepts it as a submit request that is schema-valid and whose
// submission, sent again re-encoded, is accepted as the same submission.
func checkSubmission(t *testing.T, data []byte) {
	t.Helper()
	s := &Service{d: frontdoortest.New(nil)}
	sub, f := s.submission(data, "tenant")
	if f != nil {
		if f.Code == "" || f.Message == "" || f.Status(frontdoor.NATS)/100 != 4 {
			t.Fatalf("submission(%q) refused with code %q (status %d), message %q: want a 4xx with a message",
				data, f.Code, f.Status(frontdoor.NATS), f.Message)
		}
		return
	}
	if err := schemas.Validate(schemas.KindSubmitRequest, data); err != nil {
		t.Fatalf("submission(%q) accepted a message its schema refuses: %v", data, err)
	}
	again, err := json.Marshal(schemas.SubmitRequest{
		OperationClass: sub.Operation, ModelClass: sub.Pool, IdempotencyKey: sub.IdempotencyKey,
		DeadlineMs: deadlineMs(t, data), Request: sub.Request,
	})
	if err != nil {
		t.Fatalf("an accepted submission does not encode: %v", err)
	}
	sub2, f := s.submission(again, "tenant")
	if f != nil {
		t.Fatalf("submission(%q) accepted, its re-encoding %s refused: %s", data, again, f.Message)
	}
	first, _ := json.Marshal(sub.Request)
	second, _ := json.Marshal(sub2.Request)
	if string(first) != string(second) || !reflect.DeepEqual(sub.Deadline, sub2.Deadline) ||
		sub.Operation != sub2.Operation || sub.Pool != sub2.Pool || sub.IdempotencyKey != sub2.IdempotencyKey {
		t.Fatalf("submission changed on re-encoding:\n%s\n%s", data, again)
	}
}

// deadlineMs is the deadline_ms data carried (Submission keeps only the
// deadline derived from it).
func deadlineMs(t *testing.T, data []byte) int64 {
	var req schemas.SubmitRequest
	if err := schemas.Decode(data, &req); err != nil {
		t.Fatalf("accepted %q, which Decode refuses: %v", data, err)
	}
	return req.DeadlineMs
}

func FuzzSubmitRequest(f *testing.F) {
	for _, req := range []schemas.SubmitRequest{
		{OperationClass: "default", ModelClass: "general", Request: chat(false)},
		{OperationClass: "default", ModelClass: "general", IdempotencyKey: "k-1", DeadlineMs: 2500, Request: chat(true)},
		{OperationClass: "default", ModelClass: "general", Request: schemas.ChatRequest{
			Messages:       []schemas.Message{{Role: schemas.MessageUser, Content: schemas.TextContent(frontdoortest.Prompt)}},
			Stop:           []string{"END"},
			ResponseFormat: json.RawMessage(`{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object"}}}`),
			Tools:          json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`),
		}},
		{OperationClass: "nope", ModelClass: "general", Request: chat(false)},
		{OperationClass: "default", ModelClass: "general", Request: schemas.ChatRequest{MaxTokens: 1 << 30, Messages: chat(false).Messages}},
	} {
		b, err := json.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"v":2,"operation_class":"default","model_class":"general","request":{"messages":[]}}`))
	f.Add([]byte(`{"v":1,"operation_class":"default","model_class":"general","request":{"embedding":{"input":["a"]}}}`))
	f.Add([]byte(`{"v":1,`))
	f.Fuzz(checkSubmission)
}
