package fakellm

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"net/http"

	"github.com/hedgerow/hedgerow/simulator/workload"
)

// Embeddings of the fake. A vector is a function of its input text alone:
// a generator seeded by the text's hash draws it, so every route, seed and
// run gives the same text the same vector, and a hedge's vectors are the
// primary's. Asking for fewer dimensions draws the same leading values and
// normalises them again, as OpenAI's shortened embeddings do.
const (
	// DefaultEmbeddingDimensions is the vectors' length when a request
	// names none (text-embedding-3-small's).
	DefaultEmbeddingDimensions = 1536
	// MaxEmbeddingDimensions is the longest vector the fake draws.
	MaxEmbeddingDimensions = 3072
	// MaxEmbeddingInputs is the most texts one request may embed.
	MaxEmbeddingInputs = 2048
)

// handleEmbeddings answers POST /v1/embeddings: an embedding is a short
// call, the workload's draw for an answer of one output token (its time to
// first byte, stalls, errors and hangs included), with deterministic
// vectors.
func (s *Server) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	s.serveChat(w, r, embeddingsAPI{})
}

// embeddingParams is what an embeddings request asks for beyond its timing.
type embeddingParams struct {
	input      []string
	dimensions int
	base64     bool
}

// embeddingsAPI is OpenAI's embeddings API; its errors are OpenAI's, and
// it never streams.
type embeddingsAPI struct{ chatCompletions }

func (embeddingsAPI) parse(body []byte, _ int, _ Continuation) (chatParams, error) {
	var req struct {
		Model          string          `json:"model"`
		Input          json.RawMessage `json:"input"`
		EncodingFormat string          `json:"encoding_format"`
		Dimensions     *int            `json:"dimensions"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return chatParams{}, &requestError{code: errCodeInvalidBody,
			message: fmt.Sprintf("We could not parse the JSON body of your request: %v", err)}
	}
	var e embeddingParams
	var one string
	if json.Unmarshal(req.Input, &one) == nil {
		e.input = []string{one}
	} else if json.Unmarshal(req.Input, &e.input) != nil {
		return chatParams{}, &requestError{param: "input", code: errCodeInvalidParams,
			message: "input must be a string or an array of strings; token arrays are not supported."}
	}
	if len(e.input) == 0 || len(e.input) > MaxEmbeddingInputs {
		return chatParams{}, &requestError{param: "input", code: errCodeInvalidParams,
			message: fmt.Sprintf("input must hold 1 to %d texts.", MaxEmbeddingInputs)}
	}
	for i, text := range e.input {
		if text == "" {
			return chatParams{}, &requestError{param: "input", code: errCodeInvalidParams,
				message: fmt.Sprintf("input[%d] is an empty string.", i)}
		}
	}
	switch req.EncodingFormat {
	case "", "float":
	case "base64":
		e.base64 = true
	default:
		return chatParams{}, &requestError{param: "encoding_format", code: errCodeInvalidParams,
			message: "encoding_format must be float or base64."}
	}
	e.dimensions = DefaultEmbeddingDimensions
	if d := req.Dimensions; d != nil {
		if *d < 1 || *d > MaxEmbeddingDimensions {
			return chatParams{}, &requestError{param: "dimensions", code: errCodeInvalidParams,
				message: fmt.Sprintf("dimensions must be between 1 and %d.", MaxEmbeddingDimensions)}
		}
		e.dimensions = *d
	}
	key, err := json.Marshal(struct {
		Input      []string `json:"input"`
		Dimensions int      `json:"dimensions"`
	}{e.input, e.dimensions})
	if err != nil {
		return chatParams{}, &requestError{param: "input", code: errCodeInvalidParams, message: "input could not be encoded."}
	}
	// One output token: the draw's time to first byte is the call's latency.
	id := workload.RequestIDFromKey(key)
	return chatParams{model: req.Model, requestID: id, textID: id, maxTokens: 1, embedding: &e}, nil
}

func (embeddingsAPI) id(requestID uint64, route, number int) string {
	return fmt.Sprintf("emb-%016x-r%d-a%d", requestID, route, number)
}

// completion is the embeddings list: one vector per input, in order.
func (embeddingsAPI) completion(ex *exchange, _ string) any {
	e := ex.p.embedding
	list := embeddingList{Object: "list", Model: ex.model, Data: make([]embeddingObject, len(e.input))}
	for i, text := range e.input {
		vec := EmbeddingVector(text, e.dimensions)
		list.Data[i] = embeddingObject{Object: "embedding", Index: i}
		if e.base64 {
			list.Data[i].Embedding = encodeBase64(vec)
		} else {
			list.Data[i].Embedding = vec
		}
		list.Usage.PromptTokens += embeddingTokens(text)
	}
	list.Usage.TotalTokens = list.Usage.PromptTokens
	return list
}

type embeddingList struct {
	Object string            `json:"object"`
	Data   []embeddingObject `json:"data"`
	Model  string            `json:"model"`
	Usage  struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

type embeddingObject struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string
}

// EmbeddingVector is the fake's embedding of text with the given number of
// dimensions: unit length, drawn by a generator seeded by the text's hash.
func EmbeddingVector(text string, dimensions int) []float32 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(text)) // a hash never fails to write
	seed := h.Sum64()
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	raw := make([]float64, dimensions)
	var norm float64
	for i := range raw {
		raw[i] = r.NormFloat64()
		norm += raw[i] * raw[i]
	}
	norm = math.Sqrt(norm)
	vec := make([]float32, dimensions)
	for i, x := range raw {
		vec[i] = float32(x / norm)
	}
	return vec
}

// encodeBase64 is OpenAI's base64 encoding of a vector: its little-endian
// float32 bytes.
func encodeBase64(vec []float32) string {
	b := make([]byte, 4*len(vec))
	for i, x := range vec {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return base64.StdEncoding.EncodeToString(b)
}

// embeddingTokens counts a text's tokens as the fake bills them: one per
// four bytes, at least one.
func embeddingTokens(text string) int { return max(1, (len(text)+3)/4) }
