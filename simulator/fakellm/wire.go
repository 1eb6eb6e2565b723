package fakellm

import (
	"encoding/json"

	"github.com/hedgerow/hedgerow/schemas"
)

// The OpenAI wire shapes the server speaks: only what a chat completions
// client reads, with the same field names and nullability as the real API so
// strict client decoders accept them.

// chatCompletionRequest is the body of POST /v1/chat/completions: the
// canonical request plus the OpenAI-only fields the fake honours.
type chatCompletionRequest struct {
	schemas.ChatRequest
	// MaxCompletionTokens is the newer name of max_tokens; when both are set
	// the smaller cap applies.
	MaxCompletionTokens *int           `json:"max_completion_tokens,omitempty"`
	StreamOptions       *streamOptions `json:"stream_options,omitempty"`
	// N is the number of choices; the fake produces one.
	N *int `json:"n,omitempty"`
	// ContinueFinalMessage and AddGenerationPrompt are vLLM's and SGLang's
	// flags for continuing the final assistant message
	// (ContinuationFinalMessage).
	ContinueFinalMessage *bool `json:"continue_final_message,omitempty"`
	AddGenerationPrompt  *bool `json:"add_generation_prompt,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// usage is the OpenAI usage object.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func newUsage(prompt, completion int) *usage {
	return &usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
}

// chatCompletion is the non-streaming response object.
type chatCompletion struct {
	ID                string   `json:"id"`
	Object            string   `json:"object"` // "chat.completion"
	Created           int64    `json:"created"`
	Model             string   `json:"model"`
	SystemFingerprint string   `json:"system_fingerprint"`
	Choices           []choice `json:"choices"`
	Usage             *usage   `json:"usage"`
}

type choice struct {
	Index        int             `json:"index"`
	Message      responseMessage `json:"message"`
	Logprobs     *struct{}       `json:"logprobs"` // always null
	FinishReason string          `json:"finish_reason"`
}

type responseMessage struct {
	Role    string  `json:"role"`
	Content string  `json:"content"`
	Refusal *string `json:"refusal"` // always null
}

// chatCompletionChunk is one server-sent event of a streaming response.
// Usage is raw so it can be absent (the caller did not ask for usage), null
// (every chunk but the last when it did) or the usage object, as the API
// sends it.
type chatCompletionChunk struct {
	ID                string          `json:"id"`
	Object            string          `json:"object"` // "chat.completion.chunk"
	Created           int64           `json:"created"`
	Model             string          `json:"model"`
	SystemFingerprint string          `json:"system_fingerprint"`
	Choices           []chunkChoice   `json:"choices"`
	Usage             json.RawMessage `json:"usage,omitempty"`
}

type chunkChoice struct {
	Index        int       `json:"index"`
	Delta        delta     `json:"delta"`
	Logprobs     *struct{} `json:"logprobs"`      // always null
	FinishReason *string   `json:"finish_reason"` // null until the last choice chunk
}

type delta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// modelList is the body of GET /v1/models.
type modelList struct {
	Object string        `json:"object"` // "list"
	Data   []modelObject `json:"data"`
}

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // "model"
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// errorBody is the OpenAI error envelope every non-2xx answer carries.
type errorBody struct {
	Error errorObject `json:"error"`
}

type errorObject struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// The error types and codes the fake answers with, as the API names them.
const (
	errTypeInvalidRequest = "invalid_request_error"
	errTypeServer         = "server_error"
	errTypeRateLimit      = "requests"
	errTypeTimeout        = "timeout"

	errCodeRateLimit     = "rate_limit_exceeded"
	errCodeUnknownURL    = "unknown_url"
	errCodeMethod        = "method_not_allowed"
	errCodeHangCapped    = "upstream_timeout"
	errCodeShuttingDown  = "server_shutting_down"
	errCodeBodyTooLarge  = "request_too_large"
	errCodeInvalidBody   = "invalid_json"
	errCodeInvalidParams = "invalid_value"
	errCodeStreamBroken  = "server_error"
)
