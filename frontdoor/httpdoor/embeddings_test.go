package httpdoor

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/schemas"
)

// embeddingsDoor serves a door whose pool "emb" serves embeddings and
// whose pool "general" serves chat, in front of script.
func embeddingsDoor(t *testing.T, script frontdoortest.Script) (string, *frontdoortest.Submitter) {
	t.Helper()
	sub := frontdoortest.New(script)
	sub.PoolNames = []string{"general", "emb", "another-emb"}
	srv := frontDoor(t, sub, Options{Pools: map[string][]string{"general": {"a"}, "emb": {"a"}, "another-emb": {"a"}},
		EmbeddingPools: []string{"emb", "another-emb"}})
	return srv.URL, sub
}

// vectors answers every input with a two-float vector of its index.
func vectors(_ context.Context, sub dispatcher.Submission, _ dispatcher.Sink) (*dispatcher.Response, error) {
	var data []string
	for i := range sub.Request.Embedding.Input {
		data = append(data, fmt.Sprintf(`{"object":"embedding","index":%d,"embedding":[%d.5,-1]}`, i, i))
	}
	return &dispatcher.Response{GroupID: "g1", Attempts: 2, Hedged: true, Winner: 2, WinnerRoute: "b", Gate: "g1/2/1",
		Embeddings: []byte("[" + strings.Join(data, ",") + "]"), Usage: schemas.Usage{InputUnits: 7}}, nil
}

func TestEmbeddingsAnswerTheOpenAIListShapeWithTheWinnersVectors(t *testing.T) {
	url, sub := embeddingsDoor(t, vectors)
	resp, body := frontdoortest.Do(t, http.MethodPost, url+"/v1/embeddings",
		`{"model":"emb","input":["first","second"],"dimensions":2,"encoding_format":"float","user":"u-1","x_unknown":{"a":1}}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	want := `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5,-1]},{"object":"embedding","index":1,"embedding":[1.5,-1]}],` +
		`"model":"emb","usage":{"prompt_tokens":7,"total_tokens":7}}`
	if got := strings.TrimSpace(string(body)); got != want {
		t.Fatalf("answer %s\nwant   %s", got, want)
	}
	if resp.Header.Get(frontdoor.HeaderHedged) != "true" || resp.Header.Get(frontdoor.HeaderWinnerRoute) != "b" {
		t.Fatalf("hedge headers %v", resp.Header)
	}
	subs := sub.Submissions()
	if len(subs) != 1 {
		t.Fatalf("%d submissions", len(subs))
	}
	got := subs[0].Request
	wantReq := schemas.ChatRequest{Model: "emb", Dialect: schemas.DialectOpenAI,
		Embedding: &schemas.EmbeddingRequest{Input: []string{"first", "second"}, Dimensions: 2, EncodingFormat: "float"},
		Extra:     map[string]json.RawMessage{"user": json.RawMessage(`"u-1"`), "x_unknown": json.RawMessage(`{"a":1}`)}}
	if subs[0].Pool != "emb" || !reflect.DeepEqual(got, wantReq) {
		t.Fatalf("submitted %s %+v, want %+v", subs[0].Pool, got, wantReq)
	}
	// One string is one input.
	resp, body = frontdoortest.Do(t, http.MethodPost, url+"/v1/embeddings", `{"model":"emb","input":"just one"}`, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"index":0`) || strings.Contains(string(body), `"index":1`) {
		t.Fatalf("one string: %d %s", resp.StatusCode, body)
	}
}

func TestEmbeddingsRequestsAreRefusedNamingTheOffendingMember(t *testing.T) {
	url, sub := embeddingsDoor(t, vectors)
	many := `"x"` + strings.Repeat(`,"x"`, schemas.MaxEmbeddingInputs)
	for _, tt := range []struct {
		name, body string
		status     int
		code       string
		param      string
	}{
		{"token array", `{"model":"emb","input":[1,2,3]}`, 400, frontdoor.CodeInvalidValue, "input"},
		{"token arrays", `{"model":"emb","input":[[1,2],[3]]}`, 400, frontdoor.CodeInvalidValue, "input"},
		{"no input", `{"model":"emb"}`, 400, frontdoor.CodeInvalidValue, "input"},
		{"empty string", `{"model":"emb","input":""}`, 400, frontdoor.CodeInvalidValue, "input"},
		{"empty element", `{"model":"emb","input":["a",""]}`, 400, frontdoor.CodeInvalidValue, "input"},
		{"empty array", `{"model":"emb","input":[]}`, 400, frontdoor.CodeInvalidValue, "input"},
		{"too many inputs", `{"model":"emb","input":[` + many + `]}`, 400, frontdoor.CodeInvalidValue, "input"},
		{"input of the wrong type", `{"model":"emb","input":{"a":1}}`, 400, frontdoor.CodeInvalidValue, "input"},
		{"dimensions too large", `{"model":"emb","input":"a","dimensions":100000}`, 400, frontdoor.CodeInvalidValue, "dimensions"},
		{"dimensions zero", `{"model":"emb","input":"a","dimensions":0}`, 400, frontdoor.CodeInvalidValue, "dimensions"},
		{"dimensions not an integer", `{"model":"emb","input":"a","dimensions":"8"}`, 400, frontdoor.CodeInvalidValue, "dimensions"},
		{"encoding format", `{"model":"emb","input":"a","encoding_format":"int8"}`, 400, frontdoor.CodeInvalidValue, "encoding_format"},
		{"no model", `{"input":"a"}`, 400, frontdoor.CodeInvalidValue, "model"},
		{"a chat model", `{"model":"general","input":"a"}`, 400, frontdoor.CodeInvalidValue, "model"},
		{"an unknown model", `{"model":"nope","input":"a"}`, 404, "model_not_found", "model"},
		{"not JSON", `{"model":`, 400, frontdoor.CodeInvalidJSON, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := frontdoortest.Do(t, http.MethodPost, url+"/v1/embeddings", tt.body, nil)
			_, code, param := openAIErrorOf(t, body)
			if resp.StatusCode != tt.status || code != tt.code || param != tt.param {
				t.Fatalf("%d code %q param %q (%s), want %d %q %q", resp.StatusCode, code, param, body, tt.status, tt.code, tt.param)
			}
		})
	}
	if n := len(sub.Submissions()); n != 1 { // only the unknown model reached the submitter, which refused it
		t.Fatalf("%d submissions, want 1", n)
	}
	resp, body := frontdoortest.Do(t, http.MethodGet, url+"/v1/embeddings", "", nil)
	if _, code, _ := openAIErrorOf(t, body); resp.StatusCode != http.StatusMethodNotAllowed || code != frontdoor.CodeMethodNotAllowed {
		t.Fatalf("GET: %d %s", resp.StatusCode, body)
	}
}

func TestAChatRequestNamingAnEmbeddingsModelIsRefusedNamingTheModel(t *testing.T) {
	url, sub := embeddingsDoor(t, vectors)
	for path, body := range map[string]string{
		"/v1/chat/completions": `{"model":"emb","messages":[{"role":"user","content":"hi"}]}`,
		"/v1/messages":         `{"model":"emb","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`,
	} {
		resp, data := frontdoortest.Do(t, http.MethodPost, url+path, body, nil)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(data), "/v1/embeddings") {
			t.Errorf("%s: %d %s, want 400 pointing at /v1/embeddings", path, resp.StatusCode, data)
		}
	}
	if n := len(sub.Submissions()); n != 0 {
		t.Fatalf("%d submissions, want none", n)
	}
}

func TestEmbeddingsRuntimeFailuresAnswerTheirStatusWithAnOpenAIErrorObject(t *testing.T) {
	url, _ := embeddingsDoor(t, func(context.Context, dispatcher.Submission, dispatcher.Sink) (*dispatcher.Response, error) {
		return nil, &dispatcher.GroupError{Group: "g1", Code: schemas.ErrDeadlineExceeded}
	})
	resp, body := frontdoortest.Do(t, http.MethodPost, url+"/v1/embeddings", `{"model":"emb","input":"a"}`, nil)
	if typ, _, _ := openAIErrorOf(t, body); resp.StatusCode != http.StatusGatewayTimeout || typ != "timeout_error" {
		t.Fatalf("%d %s, want 504 timeout_error", resp.StatusCode, body)
	}
}

func TestModelsListEmbeddingModelsAfterChatModels(t *testing.T) {
	url, _ := embeddingsDoor(t, vectors)
	_, body := get(t, url+"/v1/models")
	var list modelList
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	if want := []string{"general", "another-emb", "emb"}; !reflect.DeepEqual(ids, want) {
		t.Fatalf("models %v, want %v", ids, want)
	}
}
