package schemas

import (
	"encoding/json"
	"fmt"
	"slices"
	"unicode/utf8"
)

// RequestKind is the operation a canonical request asks of a provider. It
// is part of the hedge cohort, so the latencies of one kind never set the
// hedge delay of another (docs/architecture.md §5).
type RequestKind string

// The request kinds.
const (
	// KindChat is a chat completion (ChatRequest.Messages).
	KindChat RequestKind = "chat"
	// KindEmbeddings is an embeddings request (ChatRequest.Embedding): one
	// short, idempotent, non-streaming call whose answer arrives whole.
	KindEmbeddings RequestKind = "embeddings"
)

// Bounds of an embeddings request. The vectors travel back in one NATS
// message (AttemptResult.Embeddings) of at most nats.max_payload (8 MiB by
// default): MaxEmbeddingInputs vectors of MaxEmbeddingDimensions floats,
// about 20 bytes each as JSON text, stay within about 4 MiB.
const (
	MaxEmbeddingInputs     = 64
	MaxEmbeddingDimensions = 3072
)

// Encoding formats of embedding vectors: arrays of floats, or the
// little-endian float32 bytes in base64, which OpenAI also serves.
const (
	EncodingFloat  = "float"
	EncodingBase64 = "base64"
)

// EmbeddingRequest is the canonical form of an embeddings request: the
// texts to embed and how the vectors should come back. The caller's other
// members (user, members hedgerow does not know) ride in the enclosing
// ChatRequest's Extra, as sent. Its input holds caller text: never logged or
// recorded.
type EmbeddingRequest struct {
	// Input holds the texts, one vector each, in order.
	Input []string `json:"input"`
	// EncodingFormat is EncodingFloat, EncodingBase64 or empty (float).
	EncodingFormat string `json:"encoding_format,omitempty"`
	// Dimensions asks for vectors of this length; 0 means the model's own.
	Dimensions int `json:"dimensions,omitempty"`
}

// RequestKind is the operation the request asks for: KindEmbeddings when it
// carries an Embedding, else KindChat.
func (r *ChatRequest) RequestKind() RequestKind {
	if r.Embedding != nil {
		return KindEmbeddings
	}
	return KindChat
}

// embeddingTyped are the members of an OpenAI embeddings body the typed
// fields stand for; Extra never holds them.
var embeddingTyped = []string{"model", "input", "encoding_format", "dimensions"}

// validateEmbedding checks an embeddings request: inputs present, non-empty
// and within the bounds, a known encoding, dimensions in range, no chat
// member set, and Extra free of the typed members.
func (r *ChatRequest) validateEmbedding() error {
	e := r.Embedding
	switch {
	case len(r.Messages) > 0 || r.Stream || r.MaxTokens != 0 || len(r.Tools) > 0 || len(r.ResponseFormat) > 0:
		return fmt.Errorf("%w: an embeddings request carries no chat members", ErrMalformedRequest)
	case r.SourceDialect() != DialectOpenAI:
		return fmt.Errorf("%w: an embeddings request is in the openai dialect", ErrMalformedRequest)
	case len(e.Input) == 0:
		return fmt.Errorf("%w: input: no text to embed", ErrMalformedRequest)
	case len(e.Input) > MaxEmbeddingInputs:
		return fmt.Errorf("%w: input: %d texts, at most %d", ErrMalformedRequest, len(e.Input), MaxEmbeddingInputs)
	case e.Dimensions < 0 || e.Dimensions > MaxEmbeddingDimensions:
		return fmt.Errorf("%w: dimensions %d outside [1, %d]", ErrMalformedRequest, e.Dimensions, MaxEmbeddingDimensions)
	}
	switch e.EncodingFormat {
	case "", EncodingFloat, EncodingBase64:
	default:
		return fmt.Errorf("%w: encoding_format %q is neither float nor base64", ErrMalformedRequest, e.EncodingFormat)
	}
	for i, s := range e.Input {
		if s == "" || !utf8.ValidString(s) {
			return fmt.Errorf("%w: input[%d] is empty or not UTF-8", ErrMalformedRequest, i)
		}
	}
	for name, raw := range r.Extra {
		switch {
		case name == "" || !json.Valid(raw):
			return fmt.Errorf("%w: extra member %q is unnamed or not JSON", ErrMalformedRequest, name)
		case slices.Contains(embeddingTyped, name):
			return fmt.Errorf("%w: %s cannot be an extra member: it is a typed field", ErrMalformedRequest, name)
		}
	}
	return nil
}

// embeddingForDialect is ForDialect of an embeddings request: an
// OpenAI-compatible route receives Extra as sent; the Messages API has no
// embeddings, so an Anthropic route cannot serve the model at all.
func (r *ChatRequest) embeddingForDialect(to Dialect) (map[string]json.RawMessage, error) {
	if err := r.validateEmbedding(); err != nil {
		return nil, err
	}
	if to == DialectAnthropic {
		return nil, &UntranslatableError{Param: "model", To: to, Detail: "the Messages API serves no embeddings"}
	}
	return r.Extra, nil
}
