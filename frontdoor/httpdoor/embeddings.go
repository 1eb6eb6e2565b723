package httpdoor

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/schemas"
)

// This file holds OpenAI's embeddings on the HTTP front door: POST
// /v1/embeddings reads into a canonical request of kind embeddings
// (schemas.EmbeddingRequest) and runs the one submit path of the chat
// dialects, never streaming; the dispatcher hedges it on total time in
// cohorts of its own (docs/architecture.md §2, §5).

// embeddingsDialect speaks OpenAI's embeddings. Its errors are OpenAI's;
// it never streams (parse leaves Stream false), so the submit path answers
// it whole and the embedded chat stream is never started.
type embeddingsDialect struct {
	openAIDialect
	h *handler
}

var _ dialect = embeddingsDialect{}

func (d embeddingsDialect) parse(body []byte) (string, schemas.ChatRequest, bool, *frontdoor.Failure) {
	pool, req, f := parseEmbeddingsRequest(body)
	if f != nil {
		return "", req, false, f
	}
	if embeddings, known := d.h.embeddingModel[pool]; known && !embeddings {
		return "", req, false, frontdoor.InvalidParam("model",
			fmt.Sprintf("The model '%s' does not serve embeddings: see GET /v1/models for the embedding models.", pool))
	}
	return pool, req, false, nil
}

func (embeddingsDialect) answer(resp *dispatcher.Response, pool string, _ time.Time) any {
	data := validRaw(resp.Embeddings)
	if data == nil {
		data = json.RawMessage("[]")
	}
	return embeddingList{Object: "list", Data: data, Model: pool,
		Usage: embeddingsUsage{PromptTokens: resp.Usage.InputUnits, TotalTokens: resp.Usage.InputUnits}}
}

// embeddingList is OpenAI's embeddings answer. Data holds the winner's
// embedding objects, in input order, as its provider sent the vectors.
type embeddingList struct {
	Object string          `json:"object"`
	Data   json.RawMessage `json:"data"`
	Model  string          `json:"model"`
	Usage  embeddingsUsage `json:"usage"`
}

type embeddingsUsage struct {
	PromptTokens int64 `json:"prompt_tokens"`
	TotalTokens  int64 `json:"total_tokens"`
}

// parseEmbeddingsRequest reads an OpenAI embeddings body: the model (the
// pool) and the canonical request. input is a string or an array of
// strings; token arrays are refused, naming input. Every other member the
// caller sent (user, members hedgerow does not know) is carried as sent in
// Extra. The bounds keep the vectors within one NATS message
// (schemas.MaxEmbeddingInputs, schemas.MaxEmbeddingDimensions).
func parseEmbeddingsRequest(body []byte) (pool string, req schemas.ChatRequest, f *frontdoor.Failure) {
	var input json.RawMessage
	var format string
	var dimensions *int
	members := []member{
		{"model", "a string", &pool},
		{"input", "a string or an array of strings", &input},
		{"encoding_format", "a string", &format},
		{"dimensions", "an integer", &dimensions},
	}
	fields, f := readMembers(body, members, openAIWrongType)
	switch {
	case f != nil:
		return "", req, f
	case pool == "":
		return "", req, frontdoor.InvalidParam("model", "You must name a model: one of the embedding models in GET /v1/models.")
	}
	texts, f := embeddingInputs(input)
	if f != nil {
		return "", req, f
	}
	e := &schemas.EmbeddingRequest{Input: texts, EncodingFormat: format}
	switch format {
	case "", schemas.EncodingFloat, schemas.EncodingBase64:
	default:
		return "", req, frontdoor.InvalidParam("encoding_format", "'encoding_format' must be 'float' or 'base64'.")
	}
	if dimensions != nil {
		if *dimensions < 1 || *dimensions > schemas.MaxEmbeddingDimensions {
			return "", req, frontdoor.InvalidParam("dimensions",
				fmt.Sprintf("'dimensions' must be between 1 and %d.", schemas.MaxEmbeddingDimensions))
		}
		e.Dimensions = *dimensions
	}
	req = schemas.ChatRequest{Model: pool, Dialect: schemas.DialectOpenAI, Embedding: e, Extra: unread(fields, members)}
	if err := req.Validate(); err != nil {
		return "", req, frontdoor.InvalidParam(embeddingsParam(err), validationMessage(err))
	}
	return pool, req, nil
}

// embeddingInputs reads input: one string, or an array of 1 to
// schemas.MaxEmbeddingInputs non-empty strings.
func embeddingInputs(raw json.RawMessage) ([]string, *frontdoor.Failure) {
	var one string
	if len(raw) == 0 || isJSONNull(raw) {
		return nil, frontdoor.InvalidParam("input", "'input' is required: a string or an array of strings.")
	}
	if json.Unmarshal(raw, &one) == nil {
		if one == "" {
			return nil, frontdoor.InvalidParam("input", "'input' must not be an empty string.")
		}
		return []string{one}, nil
	}
	var elems []json.RawMessage
	if json.Unmarshal(raw, &elems) != nil {
		return nil, frontdoor.InvalidParam("input", "Invalid type for 'input': expected a string or an array of strings.")
	}
	switch {
	case len(elems) == 0:
		return nil, frontdoor.InvalidParam("input", "'input' must not be an empty array.")
	case len(elems) > schemas.MaxEmbeddingInputs:
		return nil, frontdoor.InvalidParam("input",
			fmt.Sprintf("'input' holds %d texts; at most %d are accepted in one request.", len(elems), schemas.MaxEmbeddingInputs))
	}
	texts := make([]string, len(elems))
	for i, e := range elems {
		if json.Unmarshal(e, &texts[i]) != nil {
			return nil, frontdoor.InvalidParam("input",
				"Token arrays are not supported: 'input' must be a string or an array of strings.")
		}
		if texts[i] == "" {
			return nil, frontdoor.InvalidParam("input", fmt.Sprintf("'input[%d]' must not be an empty string.", i))
		}
	}
	return texts, nil
}

// embeddingsParam names the member a Validate error of an embeddings
// request is about; its messages start with it ("input: ...").
func embeddingsParam(err error) string {
	msg := validationMessage(err)
	for _, p := range []string{"input", "dimensions", "encoding_format"} {
		if strings.HasPrefix(msg, p) {
			return p
		}
	}
	return ""
}

// checkPoolKind refuses a chat request naming an embeddings pool, naming
// model: its routes may serve no chat at all.
func (h *handler) checkPoolKind(pool string, req schemas.ChatRequest) *frontdoor.Failure {
	if req.Embedding == nil && h.embeddingModel[pool] {
		return frontdoor.InvalidParam("model",
			fmt.Sprintf("The model '%s' serves embeddings: send it to POST /v1/embeddings.", pool))
	}
	return nil
}

// embeddingsLast orders /v1/models: the chat models, then the embedding
// models, each in the order the Submitter lists them.
func embeddingsLast(models []dispatcher.Model, embeddingModel map[string]bool) {
	slices.SortStableFunc(models, func(a, b dispatcher.Model) int {
		return cmp.Compare(kindRank(embeddingModel[a.Name]), kindRank(embeddingModel[b.Name]))
	})
}

func kindRank(embeddings bool) int {
	if embeddings {
		return 1
	}
	return 0
}

// embeddingModels indexes every model name — a pool's own or one of its
// aliases — by whether its pool is one of the embeddings pools.
func embeddingModels(models []dispatcher.Model, embeddingPools []string) map[string]bool {
	out := make(map[string]bool, len(models))
	for _, m := range models {
		out[m.Name] = slices.Contains(embeddingPools, m.Pool)
	}
	return out
}
