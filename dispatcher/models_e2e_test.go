package dispatcher_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor/httpdoor"
	"github.com/hedgerow/hedgerow/schemas"
)

// TestBothDoorsServeAPoolByTheModelNamesItAnswersTo: through the real
// runtime, a pool answers to the provider names configured in its models;
// answers echo the name sent, /v1/models lists every name, and the records
// keep the pool's own name.
func TestBothDoorsServeAPoolByTheModelNamesItAnswersTo(t *testing.T) {
	sc := dispatcher.NewTestScript(dispatcher.Words(3))
	ps := map[string]*dispatcher.TestProvider{"a": dispatcher.NewTestProvider(t, "a", sc), "b": dispatcher.NewTestProvider(t, "b", sc)}
	c := dispatcher.NewTestClusterWithPool(t, []string{"a", "b"}, ps, "    models: [gpt-4o, claude-3.5-sonnet]\n", "")
	srv := httpDoor(t, c, c.Dispatcher(), httpdoor.Options{})

	resp := post(t, context.Background(), srv.URL, strings.Replace(chatBody(false, ""), `"model":"general"`, `"model":"gpt-4o"`, 1), nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var answer struct {
		ID    string `json:"id"`
		Model string `json:"model"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &answer) != nil || answer.Model != "gpt-4o" {
		t.Fatalf("status %d, body %s: want 200 echoing gpt-4o", resp.StatusCode, body)
	}
	if g := c.GroupRecord(strings.TrimPrefix(answer.ID, "chatcmpl-")); g.ModelClass != "general" {
		t.Fatalf("group record model_class %q, want the pool's own name", g.ModelClass)
	}

	lr, err := http.Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	err = json.NewDecoder(lr.Body).Decode(&list)
	lr.Body.Close()
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	if want := []string{"general", "gpt-4o", "claude-3.5-sonnet"}; err != nil || !slices.Equal(ids, want) {
		t.Fatalf("GET /v1/models = %q (%v), want %q", ids, err, want)
	}

	natsDoor(t, c)
	data, err := json.Marshal(schemas.SubmitRequest{OperationClass: "default", ModelClass: "claude-3.5-sonnet", Request: dispatcher.TestChat(false)})
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.Conn().RequestMsg(&nats.Msg{Subject: schemas.SubmitSubject, Data: data}, natsWait)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get(schemas.HeaderStatus) != schemas.StatusDone {
		t.Fatalf("NATS submit by alias: %s", m.Data)
	}
}
