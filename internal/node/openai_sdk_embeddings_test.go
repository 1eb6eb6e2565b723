package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

// startEmbeddingsServe runs serve with a chat pool "general" and an
// embeddings pool "text-embedding-3-small", both over two simulated routes,
// and returns the gateway's base URL.
func startEmbeddingsServe(t *testing.T) string {
	t.Helper()
	calm := calmModel(t)
	a, b := simulatedRoute(t, 0, calm, 0), simulatedRoute(t, 1, calm, 0)
	y := fmt.Sprintf(`http:
  listen: 127.0.0.1:0
routes:
  - {name: fake-a, provider: openai, base_url: %q, model: m, labels: {region: a}}
  - {name: fake-b, provider: openai, base_url: %q, model: m, labels: {region: b}}
pools:
  general: {routes: [fake-a, fake-b]}
  text-embedding-3-small: {kind: embeddings, routes: [fake-a, fake-b]}
policies:
  default: {control_fraction: 0, deadline: 5s, heartbeat_interval: 50ms}
`, a, b)
	cfg, err := config.Parse("sdk.yaml", []byte(y), config.RoleServe, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("config: %v\n%s", err, y)
	}
	s, err := StartServe(cfg, Options{})
	if err != nil {
		t.Fatalf("StartServe: %v", err)
	}
	t.Cleanup(func() { stop(t, s) })
	return "http://" + s.HTTPAddr().String()
}

// TestOpenAISDKEmbeddingsThroughServe: the official client's Embeddings
// service gets the simulated route's vectors through a whole hedgerow, in
// input order and with the dimensions asked for, and sees refusals as
// OpenAI errors naming the member.
func TestOpenAISDKEmbeddingsThroughServe(t *testing.T) {
	base := startEmbeddingsServe(t)
	client := sdkClient(t, base, "")
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	texts := []string{"a hedgerow", "keeps a quiet watch"}
	resp, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model:      "text-embedding-3-small",
		Input:      openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: texts},
		Dimensions: openai.Int(16),
		User:       openai.String("caller-1"),
	})
	if err != nil {
		t.Fatalf("Embeddings.New: %v", err)
	}
	if resp.Model != "text-embedding-3-small" || len(resp.Data) != len(texts) || resp.Usage.PromptTokens <= 0 || resp.Usage.TotalTokens != resp.Usage.PromptTokens {
		t.Fatalf("response %+v", resp)
	}
	for i, text := range texts {
		want := fakellm.EmbeddingVector(text, 16)
		got := resp.Data[i].Embedding
		if resp.Data[i].Index != int64(i) || len(got) != len(want) {
			t.Fatalf("data[%d]: index %d, %d dimensions", i, resp.Data[i].Index, len(got))
		}
		for j := range want {
			if float32(got[j]) != want[j] {
				t.Fatalf("data[%d][%d] = %v, want the fake's %v for %q", i, j, got[j], want[j], text)
			}
		}
	}

	one, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model: "text-embedding-3-small",
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("a hedgerow")},
	})
	if err != nil || len(one.Data) != 1 || len(one.Data[0].Embedding) != fakellm.DefaultEmbeddingDimensions {
		t.Fatalf("one string: %+v, %v", one, err)
	}

	for name, params := range map[string]openai.EmbeddingNewParams{
		"token arrays": {Model: "text-embedding-3-small", Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfTokens: []int64{1, 2}}},
		"a chat model": {Model: "general", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")}},
	} {
		_, err := client.Embeddings.New(ctx, params)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s: %v, want a 400", name, err)
		}
		if want := map[string]string{"token arrays": "input", "a chat model": "model"}[name]; apiErr.Param != want {
			t.Fatalf("%s: param %q, want %q", name, apiErr.Param, want)
		}
	}

	models, err := client.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range models.Data {
		ids = append(ids, m.ID)
	}
	if fmt.Sprint(ids) != "[general text-embedding-3-small]" {
		t.Fatalf("models %v, want the chat model, then the embedding model", ids)
	}
}
