package upstream

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/hedgerow/hedgerow/schemas"
)

// embeddingsProvider serves POST /v1/embeddings with h and keeps the last
// request body.
func embeddingsProvider(t *testing.T, h http.HandlerFunc) (*OpenAI, *[]byte) {
	t.Helper()
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/embeddings" {
			http.NotFound(w, r)
			return
		}
		body, _ = io.ReadAll(r.Body)
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	o, err := NewOpenAI(Options{BaseURL: srv.URL + "/v1", Model: "route-embedder", APIKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.CloseIdleConnections)
	return o, &body
}

func embedTwo() *schemas.ChatRequest {
	return &schemas.ChatRequest{Model: "text-embedding-3-small", Dialect: schemas.DialectOpenAI,
		Embedding: &schemas.EmbeddingRequest{Input: []string{"first text", "second text"}, Dimensions: 4},
		Extra:     map[string]json.RawMessage{"user": json.RawMessage(`"caller-7"`)}}
}

func TestEmbeddingsRequestGetsTheRecordedVectorsInInputOrder(t *testing.T) {
	rec := fixture(t, "embeddings.json")
	o, sent := embeddingsProvider(t, replay(answer{contentType: "application/json", body: rec}))
	sink := &recorder{}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	out, err := o.Stream(ctx, embedTwo(), sink)
	if err != nil {
		t.Fatal(err)
	}
	if !sameJSON(t, *sent, []byte(`{"model":"route-embedder","input":["first text","second text"],"dimensions":4,"user":"caller-7"}`)) {
		t.Errorf("provider received %s", *sent)
	}
	if sink.firstBytes != 1 || len(sink.deltas) != 0 {
		t.Errorf("sink saw %d first bytes and %d deltas, want 1 and 0", sink.firstBytes, len(sink.deltas))
	}
	if out.Usage != (schemas.Usage{InputUnits: 9}) {
		t.Errorf("usage %+v, want 9 input units as reported", out.Usage)
	}
	want := `[{"object":"embedding","index":0,"embedding":[0.0023064255,-0.009327292,-0.0028842222,0.015797347]},` +
		`{"object":"embedding","index":1,"embedding":[-0.0069292835,-0.005336422,0.024047505,-0.01407986]}]`
	if !sameJSON(t, out.Embeddings, []byte(want)) {
		t.Errorf("embeddings %s, want %s", out.Embeddings, want)
	}
}

func TestEmbeddingsAnswerWithTheWrongVectorsOrAnErrorStatusFailsClassified(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	short, _ := embeddingsProvider(t, replay(answer{contentType: "application/json",
		body: []byte(`{"object":"list","data":[{"object":"embedding","index":0,"embedding":[1]}]}`)}))
	_, err := short.Stream(ctx, embedTwo(), nil)
	if ue := asError(t, err); ue.Status != schemas.StatusServerError || ue.Scope != schemas.ScopeTransient {
		t.Errorf("one vector for two inputs: %v, want a transient server error", ue)
	}
	limited, _ := embeddingsProvider(t, replay(answer{status: 429, header: map[string]string{"Retry-After": "2"},
		body: fixture(t, "error_429_rate_limit.json")}))
	_, err = limited.Stream(ctx, embedTwo(), nil)
	if ue := asError(t, err); ue.Scope != schemas.ScopePushback || ue.HTTPStatus != 429 {
		t.Errorf("429: %v, want pushback", ue)
	}
}

func TestAnAnthropicRouteRefusesAnEmbeddingsRequestUnsent(t *testing.T) {
	var hits int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits++ }))
	defer srv.Close()
	a, err := NewAnthropic(AnthropicOptions{Options: Options{BaseURL: srv.URL + "/v1"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Stream(context.Background(), embedTwo(), nil)
	if ue := asError(t, err); ue.Scope != schemas.ScopeGroup || hits != 0 {
		t.Errorf("anthropic route: %v after %d requests, want a group error unsent", ue, hits)
	}
}
