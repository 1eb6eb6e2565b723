package fakellm_test

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"reflect"
	"testing"

	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

type embeddingsAnswer struct {
	Object string `json:"object"`
	Data   []struct {
		Object    string          `json:"object"`
		Index     int             `json:"index"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Model string `json:"model"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

func (fs *fakeServer) embed(t *testing.T, body string) (int, []byte) {
	t.Helper()
	resp := fs.do(t, context.Background(), http.MethodPost, "/v1/embeddings", body)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, data
}

func floats(t *testing.T, raw json.RawMessage) []float32 {
	t.Helper()
	var v []float32
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("vector %s: %v", raw, err)
	}
	return v
}

func TestEmbeddingsAreDeterministicByTextAcrossRoutesAndSeeds(t *testing.T) {
	a := startServer(t, fakellm.Options{Model: steadyModel(t, 5), Seed: 1, Route: 0, TimeScale: fastScale})
	b := startServer(t, fakellm.Options{Model: steadyModel(t, 5), Seed: 9, Route: 1, TimeScale: fastScale})
	var answers [2]embeddingsAnswer
	for i, fs := range []*fakeServer{a, b} {
		status, body := fs.embed(t, `{"model":"text-embedding-3-small","input":["hedge","row","hedge"]}`)
		if status != http.StatusOK {
			t.Fatalf("status %d: %s", status, body)
		}
		if err := json.Unmarshal(body, &answers[i]); err != nil {
			t.Fatal(err)
		}
	}
	ans := answers[0]
	if ans.Object != "list" || ans.Model != "text-embedding-3-small" || len(ans.Data) != 3 || ans.Usage.PromptTokens != 5 || ans.Usage.TotalTokens != 5 {
		t.Fatalf("answer %+v", ans)
	}
	first, second, third := floats(t, ans.Data[0].Embedding), floats(t, ans.Data[1].Embedding), floats(t, ans.Data[2].Embedding)
	if len(first) != fakellm.DefaultEmbeddingDimensions || ans.Data[1].Index != 1 || ans.Data[0].Object != "embedding" {
		t.Fatalf("vector of %d dimensions, data %+v", len(first), ans.Data[1])
	}
	if !reflect.DeepEqual(first, third) || reflect.DeepEqual(first, second) {
		t.Fatal("the same text must get the same vector and another text another one")
	}
	if !reflect.DeepEqual(first, floats(t, answers[1].Data[0].Embedding)) {
		t.Fatal("another route and seed gave the same text another vector")
	}
	var norm float64
	for _, x := range first {
		norm += float64(x) * float64(x)
	}
	if math.Abs(norm-1) > 1e-4 {
		t.Fatalf("vector norm² %v, want 1", norm)
	}
}

func TestEmbeddingsHonourDimensionsAndBase64(t *testing.T) {
	fs := startServer(t, fakellm.Options{Model: steadyModel(t, 5), Seed: 1, TimeScale: fastScale})
	status, body := fs.embed(t, `{"model":"m","input":"hedge","dimensions":8}`)
	var ans embeddingsAnswer
	if status != http.StatusOK || json.Unmarshal(body, &ans) != nil {
		t.Fatalf("status %d: %s", status, body)
	}
	short := floats(t, ans.Data[0].Embedding)
	if !reflect.DeepEqual(short, fakellm.EmbeddingVector("hedge", 8)) {
		t.Fatalf("vector %v is not the text's 8-dimension vector", short)
	}
	status, body = fs.embed(t, `{"model":"m","input":"hedge","dimensions":8,"encoding_format":"base64"}`)
	if status != http.StatusOK || json.Unmarshal(body, &ans) != nil {
		t.Fatalf("status %d: %s", status, body)
	}
	var encoded string
	if err := json.Unmarshal(ans.Data[0].Embedding, &encoded); err != nil {
		t.Fatalf("base64 vector %s: %v", ans.Data[0].Embedding, err)
	}
	raw, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil || len(raw) != 32 {
		t.Fatalf("base64 vector of %d bytes: %v", len(raw), err)
	}
	for i, want := range short {
		if got := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])); got != want {
			t.Fatalf("base64 element %d = %v, want %v", i, got, want)
		}
	}
}

func TestEmbeddingsRefuseWhatTheyDoNotServe(t *testing.T) {
	fs := startServer(t, fakellm.Options{Model: steadyModel(t, 5), Seed: 1, TimeScale: fastScale})
	for body, param := range map[string]string{
		`{"model":"m","input":[1,2,3]}`:                    "input",
		`{"model":"m","input":[]}`:                         "input",
		`{"model":"m","input":"a","dimensions":0}`:         "dimensions",
		`{"model":"m","input":"a","encoding_format":"x"}`:  "encoding_format",
		`{"model":"m","input":"a","dimensions":100000000}`: "dimensions",
	} {
		status, data := fs.embed(t, body)
		var e struct {
			Error struct {
				Param string `json:"param"`
			} `json:"error"`
		}
		if status != http.StatusBadRequest || json.Unmarshal(data, &e) != nil || e.Error.Param != param {
			t.Errorf("%s: %d %s, want 400 naming %s", body, status, data, param)
		}
	}
}
