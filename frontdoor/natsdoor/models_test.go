package natsdoor

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/schemas"
)

// TestNATSSubmitAcceptsAnyModelNameOfAPool: model_class may be one of the
// names a pool answers to, in the shapes providers use, not only a pool's
// NATS-safe name; an unknown one is answered unknown_model naming it.
func TestNATSSubmitAcceptsAnyModelNameOfAPool(t *testing.T) {
	d := startDoor(t, frontdoortest.Answer(&dispatcher.Response{Content: "ok", FinishReason: "stop", Attempts: 1, Winner: 1}, false), Options{},
		func(s *frontdoortest.Submitter) {
			s.Aliases = map[string]string{"gpt-4o": "general", "meta-llama/Llama-3-70b": "general"}
		})
	body := func(model string) []byte {
		data, err := json.Marshal(schemas.SubmitRequest{OperationClass: "default", ModelClass: model, Request: chat(false)})
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	for _, model := range []string{"gpt-4o", "meta-llama/Llama-3-70b"} {
		if m := request(t, d.nc, body(model), nil); m.Header.Get(schemas.HeaderStatus) != schemas.StatusDone {
			t.Fatalf("model %s: %s", model, m.Data)
		}
	}
	subs := d.sub.Submissions()
	if len(subs) != 2 || subs[0].Pool != "gpt-4o" || subs[1].Pool != "meta-llama/Llama-3-70b" {
		t.Fatalf("submissions %+v, want the model names sent", subs)
	}
	msg := errorAnswer(t, request(t, d.nc, body("gpt-5"), nil), schemas.ErrUnknownModel, 404)
	if !strings.Contains(msg, `"gpt-5"`) {
		t.Fatalf("message %q does not name the model sent", msg)
	}
}
