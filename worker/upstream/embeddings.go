package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/hedgerow/hedgerow/schemas"
)

// MaxEmbeddingsBody bounds how much of an embeddings answer is read: the
// vectors must fit one NATS message back to the dispatcher anyway
// (schemas.MaxEmbeddingInputs × schemas.MaxEmbeddingDimensions as JSON
// text is about 4 MiB).
const MaxEmbeddingsBody = 8 << 20

// embeddingsRequest is the body of POST {base_url}/embeddings: the typed
// members of the canonical request; the caller's others (user, ...) are
// added as sent by withMembers.
type embeddingsRequest struct {
	Model          string   `json:"model"`
	Input          []string `json:"input"`
	EncodingFormat string   `json:"encoding_format,omitempty"`
	Dimensions     int      `json:"dimensions,omitempty"`
}

// embeddingsAnswer is what hedgerow reads of an embeddings answer.
type embeddingsAnswer struct {
	Data []struct {
		Index     *int            `json:"index"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Usage *struct {
		PromptTokens int64 `json:"prompt_tokens"`
	} `json:"usage"`
}

// embeddingObject is one vector as the attempt result carries it.
type embeddingObject struct {
	Object    string          `json:"object"`
	Index     int             `json:"index"`
	Embedding json.RawMessage `json:"embedding"`
}

// embed runs an embeddings request (schemas.KindEmbeddings) as one
// non-streaming POST to {base_url}/embeddings, sent once. The first byte is
// the 2xx answer's headers; the Outcome carries the vectors in input order
// (Outcome.Embeddings) and the provider's prompt tokens as input usage.
func (o *OpenAI) embed(ctx context.Context, req *schemas.ChatRequest, sink Sink) (Outcome, error) {
	extra, model, err := o.translate(req, schemas.DialectOpenAI)
	if err != nil {
		return Outcome{}, unencodable(err)
	}
	body, err := json.Marshal(embeddingsRequest{Model: model, Input: req.Embedding.Input,
		EncodingFormat: req.Embedding.EncodingFormat, Dimensions: req.Embedding.Dimensions})
	if err == nil {
		body, err = withMembers(body, extra)
	}
	if err != nil {
		return Outcome{}, unencodable(err)
	}
	endpoint := strings.TrimSuffix(o.endpoint, "/chat/completions") + "/embeddings"
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return Outcome{}, &Error{Status: schemas.StatusNotFound, Scope: schemas.ScopeRoute,
			Message: "provider request cannot be built", cause: err}
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	o.authorize(hreq.Header)
	resp, err := o.client.Do(hreq)
	if err != nil {
		return unsent(ctx, err, body)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return Outcome{}, statusError(resp, o.now())
	}
	sink.FirstByte()
	billed := Outcome{Usage: schemas.Usage{InputUnits: inputEstimate(body), Estimated: true}}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxEmbeddingsBody+1))
	if err != nil {
		return billed, transportError(ctx, err)
	}
	if len(raw) > MaxEmbeddingsBody {
		return billed, &Error{Status: schemas.StatusServerError, Scope: schemas.ScopeTransient,
			Message: fmt.Sprintf("embeddings answer larger than %d bytes", MaxEmbeddingsBody)}
	}
	if ae, ok := parseAPIError(raw); ok {
		status, scope, _ := classifyStatus(0, ae, resp.Header, o.now())
		return billed, &Error{Status: status, Scope: scope, HTTPStatus: resp.StatusCode, Message: errorMessage(0, status, ae)}
	}
	vectors, usage, err := readEmbeddings(raw, len(req.Embedding.Input))
	if err != nil {
		return billed, &Error{Status: schemas.StatusServerError, Scope: schemas.ScopeTransient,
			Message: "malformed embeddings answer", cause: err}
	}
	if usage.InputUnits == 0 {
		usage = billed.Usage
	}
	return Outcome{Usage: usage, Embeddings: vectors, WellFormed: true}, nil
}

// readEmbeddings checks an embeddings answer — exactly one vector for each
// of n inputs, each index once — and returns the vectors in input order as
// an array of embedding objects, with the provider's usage.
func readEmbeddings(raw []byte, n int) (json.RawMessage, schemas.Usage, error) {
	var ans embeddingsAnswer
	if err := json.Unmarshal(raw, &ans); err != nil {
		return nil, schemas.Usage{}, err
	}
	if len(ans.Data) != n {
		return nil, schemas.Usage{}, fmt.Errorf("%d vectors for %d inputs", len(ans.Data), n)
	}
	ordered := make([]embeddingObject, n)
	seen := make([]bool, n)
	for _, d := range ans.Data {
		switch {
		case d.Index == nil || *d.Index < 0 || *d.Index >= n || seen[*d.Index]:
			return nil, schemas.Usage{}, errors.New("vector index missing, out of range or repeated")
		case len(d.Embedding) == 0 || (d.Embedding[0] != '[' && d.Embedding[0] != '"'):
			return nil, schemas.Usage{}, errors.New("vector is neither an array nor a base64 string")
		}
		seen[*d.Index] = true
		ordered[*d.Index] = embeddingObject{Object: "embedding", Index: *d.Index, Embedding: d.Embedding}
	}
	vectors, err := json.Marshal(ordered)
	if err != nil {
		return nil, schemas.Usage{}, err
	}
	var usage schemas.Usage
	if ans.Usage != nil {
		usage.InputUnits = ans.Usage.PromptTokens
	}
	return vectors, usage, nil
}
