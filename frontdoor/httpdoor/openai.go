package dispatcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/schemas"
)

// This file holds the OpenAI shapes of the HTTP front door: the request body,
// the completion and chunk objects, and the error object with its mapping
// from the dispatcher's errors.

// Error types of the OpenAI error object; clients branch on the status, and
// on code for the details.
const (
	typeInvalidRequest = "invalid_request_error"
	typeRateLimit      = "rate_limit_error"
	typeQuota          = "insufficient_quota"
	typeTimeout        = "timeout_error"
	typeServer         = "server_error"
	codeInternal       = "internal_error"
)

// headerShouldRetry is the retry hint of the official OpenAI SDKs: "false"
// stops their automatic retries of an answer no retry can change.
const headerShouldRetry = "X-Should-Retry"

// statusClientClosedRequest is nginx's 499: the client went away before the
// answer. Nothing reaches the client; it is for access logs.
const statusClientClosedRequest = 499

// apiError is an OpenAI error object and the HTTP status it travels with.
// Messages are fixed texts: they never echo prompts, keys or headers.
type apiError struct {
	status     int
	retryAfter string // Retry-After header, when the caller should wait
	gate       string // X-Hedgerow-Gate of the committed winner (409)
	// noRetry tells clients that retrying the same request cannot succeed
	// (x-should-retry: false, which the official OpenAI SDKs obey): they
	// retry 409 and 429 on their own otherwise.
	noRetry bool
	// challenge asks for credentials (WWW-Authenticate, with a 401).
	challenge bool
	Message   string
	Type      string
	Param     string
	Code      string
}

func (e *apiError) MarshalJSON() ([]byte, error) {
	type object struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	o := object{Message: e.Message, Type: e.Type}
	if e.Param != "" {
		o.Param = &e.Param
	}
	if e.Code != "" {
		o.Code = &e.Code
	}
	return json.Marshal(struct {
		Error object `json:"error"`
	}{o})
}

func writeAPIError(w http.ResponseWriter, e *apiError) {
	if e.retryAfter != "" {
		w.Header().Set("Retry-After", e.retryAfter)
	}
	if e.gate != "" {
		w.Header().Set(HeaderGate, e.gate)
	}
	if e.noRetry {
		w.Header().Set(headerShouldRetry, "false")
	}
	if e.challenge {
		w.Header().Set("WWW-Authenticate", `Bearer realm="hedgerow"`)
	}
	writeJSON(w, e.status, e)
}

func invalidParam(param, message string) *apiError {
	return &apiError{status: http.StatusBadRequest, Type: typeInvalidRequest, Param: param, Code: "invalid_value", Message: message}
}

func modelNotFound() *apiError {
	return &apiError{status: http.StatusNotFound, Type: typeInvalidRequest, Param: "model", Code: "model_not_found",
		Message: "The model does not exist: it names no pool of this gateway (see GET /v1/models)."}
}

// errorFor maps an error of Submit to its answer; nil means the caller went
// away and nothing is to be written.
//
// Status choices: every route failing transiently, or none being healthy, is
// 503 — the gateway works and already retried across the pool, so the
// condition is "no capacity now", which is what 503 tells clients and load
// balancers. Every route failing permanently (its credentials, its model) is
// 502: the upstreams answered, unusably, and a retry will not change that.
// Budget exhaustion is 429 insufficient_quota with x-should-retry: false:
// an automatic retry of the same request cannot refill a ceiling.
func errorFor(err error) *apiError {
	var ge *GroupError
	switch {
	case errors.Is(err, context.Canceled):
		return nil
	case errors.Is(err, ErrUnknownPool):
		return modelNotFound()
	case errors.Is(err, ErrBadRequest):
		return &apiError{status: http.StatusBadRequest, Type: typeInvalidRequest, Code: string(schemas.ErrInvalidRequest),
			Message: "The request is invalid."}
	case errors.Is(err, ErrShuttingDown):
		return &apiError{status: http.StatusServiceUnavailable, Type: typeServer, Code: "shutting_down", retryAfter: "1",
			Message: "This gateway is shutting down; retry on another replica."}
	case errors.As(err, &ge):
		return groupErrorFor(ge)
	}
	return &apiError{status: http.StatusInternalServerError, Type: typeServer, Code: codeInternal,
		Message: "The gateway failed to serve the request."}
}

// retryAfterSeconds is a Retry-After header value: whole seconds, rounded up.
func retryAfterSeconds(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}

func groupErrorFor(ge *GroupError) *apiError {
	code := string(ge.Code)
	switch ge.Code {
	case schemas.ErrCanceled:
		return nil
	case schemas.ErrDeadlineExceeded:
		return &apiError{status: http.StatusGatewayTimeout, Type: typeTimeout, Code: code,
			Message: "No valid answer arrived before the deadline."}
	case schemas.ErrAlreadyCommitted:
		return &apiError{status: http.StatusConflict, Type: typeInvalidRequest, Code: code, gate: ge.Holder, noRetry: true,
			Message: "Another request of this user action (Idempotency-Key) already committed an answer: " + ge.Holder + "."}
	case schemas.ErrRateLimited:
		// The longest pause the routes asked for, at least a second.
		return &apiError{status: http.StatusTooManyRequests, Type: typeRateLimit, Code: code, retryAfter: retryAfterSeconds(max(ge.RetryAfter, time.Second)),
			Message: "Every route of the model is asking for less load; retry later."}
	case schemas.ErrBudgetExhausted:
		if ge.RetryAfter > 0 {
			// The tenant's spend window refused: a new window will not.
			return &apiError{status: http.StatusTooManyRequests, Type: typeQuota, Code: code, retryAfter: retryAfterSeconds(ge.RetryAfter),
				Message: "The tenant's spend budget for this window is exhausted; retry in the next window."}
		}
		return &apiError{status: http.StatusTooManyRequests, Type: typeQuota, Code: code, noRetry: true,
			Message: "The attempt or spend budget of this user action is exhausted."}
	case schemas.ErrRouteFailed:
		return &apiError{status: http.StatusBadGateway, Type: typeServer, Code: code,
			Message: "Every route of the model failed permanently (credentials or model at the provider)."}
	case schemas.ErrAllRoutesFailed, schemas.ErrNoRoute:
		return &apiError{status: http.StatusServiceUnavailable, Type: typeServer, Code: code,
			Message: "No route of the model could produce a valid answer."}
	case schemas.ErrInvalidRequest:
		return &apiError{status: http.StatusBadRequest, Type: typeInvalidRequest, Code: code,
			Message: "The provider rejected the request as invalid."}
	}
	return &apiError{status: http.StatusInternalServerError, Type: typeServer, Code: codeInternal,
		Message: "The request failed."}
}

// parseChatRequest reads an OpenAI chat completions body: the model (the
// pool), the canonical request and whether a streamed answer ends with a
// usage chunk. Unknown fields are ignored, as OpenAI-compatible servers do;
// a known field of the wrong type is an error naming it.
func parseChatRequest(body []byte) (pool string, req schemas.ChatRequest, includeUsage bool, aerr *apiError) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return "", req, false, &apiError{status: http.StatusBadRequest, Type: typeInvalidRequest, Code: "invalid_json",
			Message: "The request body is not a JSON object."}
	}
	var maxTokens, maxCompletionTokens, n *int
	var stop json.RawMessage
	var streamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	}
	for _, f := range []struct {
		name, want string
		dst        any
	}{
		{"model", "a string", &pool},
		{"messages", "an array of message objects", &req.Messages},
		{"max_tokens", "an integer", &maxTokens},
		{"max_completion_tokens", "an integer", &maxCompletionTokens},
		{"n", "an integer", &n},
		{"temperature", "a number", &req.Temperature},
		{"top_p", "a number", &req.TopP},
		{"presence_penalty", "a number", &req.PresencePenalty},
		{"frequency_penalty", "a number", &req.FrequencyPenalty},
		{"seed", "an integer", &req.Seed},
		{"stop", "a string or an array of strings", &stop},
		{"tools", "an array", &req.Tools},
		{"tool_choice", "a string or an object", &req.ToolChoice},
		{"response_format", "an object", &req.ResponseFormat},
		{"stream", "a boolean", &req.Stream},
		{"stream_options", "an object", &streamOptions},
	} {
		raw, ok := fields[f.name]
		if !ok || isJSONNull(raw) {
			continue
		}
		if err := json.Unmarshal(raw, f.dst); err != nil {
			return "", req, false, invalidParam(f.name, fmt.Sprintf("Invalid type for '%s': expected %s.", f.name, f.want))
		}
	}
	switch {
	case pool == "":
		return "", req, false, invalidParam("model", "You must name a model: one of the pools in GET /v1/models.")
	case len(req.Messages) == 0:
		return "", req, false, invalidParam("messages", "'messages' must be a non-empty array.")
	case n != nil && *n != 1:
		return "", req, false, invalidParam("n", "Only one choice (n = 1) is supported.")
	}
	for _, mt := range []struct {
		name string
		v    *int
	}{{"max_tokens", maxTokens}, {"max_completion_tokens", maxCompletionTokens}} {
		if mt.v == nil {
			continue
		}
		if *mt.v < 1 {
			return "", req, false, invalidParam(mt.name, fmt.Sprintf("'%s' must be at least 1.", mt.name))
		}
		// max_completion_tokens supersedes the deprecated max_tokens.
		req.MaxTokens = *mt.v
	}
	var err error
	if req.Stop, err = parseStop(stop); err != nil {
		return "", req, false, invalidParam("stop", "Invalid type for 'stop': expected a string or an array of strings.")
	}
	req.Model = pool
	if err := req.Validate(); err != nil {
		return "", req, false, invalidParam(validationParam(err), validationMessage(err))
	}
	// stream_options without stream is ignored rather than refused: clients
	// that always send it still work.
	return pool, req, req.Stream && streamOptions.IncludeUsage, nil
}

// paramResponseSchema is where a request's JSON schema sits.
const paramResponseSchema = "response_format.json_schema.schema"

// responseFormatError answers a response_format the dispatcher's contract
// cannot honour (Dispatcher.contractFor). Its texts are fixed: the
// compiler's messages can quote the schema.
func responseFormatError(err error) *apiError {
	switch {
	case errors.Is(err, ErrUnknownPool):
		return modelNotFound()
	case errors.Is(err, arbiter.ErrInvalidContract):
		return invalidParam(paramResponseSchema,
			"The JSON schema in 'response_format.json_schema.schema' is not a valid, self-contained JSON Schema (external $ref is not allowed).")
	}
	return invalidParam("response_format",
		`'response_format' must be {"type":"text"}, {"type":"json_object"} or {"type":"json_schema","json_schema":{"name":...,"schema":{...}}}.`)
}

func parseStop(raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return []string{s}, nil
	}
	var ss []string
	if err := json.Unmarshal(raw, &ss); err != nil {
		return nil, err
	}
	return ss, nil
}

func isJSONNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// validationParam names the field a schemas.ChatRequest.Validate error is
// about: its messages come as "messages[i]: ..." or "<field> ...".
func validationParam(err error) string {
	msg := validationMessage(err)
	if strings.HasPrefix(msg, "messages[") {
		if i := strings.Index(msg, "]"); i > 0 {
			return msg[:i+1]
		}
	}
	field, _, _ := strings.Cut(msg, " ")
	field, _, _ = strings.Cut(field, "[")
	switch field {
	case "max_tokens", "temperature", "top_p", "presence_penalty", "frequency_penalty", "stop", "tools", "tool_choice", "response_format":
		return field
	}
	return ""
}

// validationMessage is a Validate error without its sentinel's text.
func validationMessage(err error) string {
	return strings.ReplaceAll(err.Error(), schemas.ErrMalformedRequest.Error()+": ", "")
}

// chatCompletion is the OpenAI chat.completion object.
type chatCompletion struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   *openAIUsage       `json:"usage"`
}

type completionChoice struct {
	Index        int               `json:"index"`
	Message      completionMessage `json:"message"`
	FinishReason string            `json:"finish_reason"`
}

type completionMessage struct {
	Role      string          `json:"role"`
	Content   *string         `json:"content"`
	ToolCalls json.RawMessage `json:"tool_calls,omitempty"`
}

type openAIUsage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

func newUsage(u schemas.Usage) *openAIUsage {
	return &openAIUsage{PromptTokens: u.InputUnits, CompletionTokens: u.OutputUnits, TotalTokens: u.InputUnits + u.OutputUnits}
}

func newChatCompletion(resp *Response, pool string, now time.Time) chatCompletion {
	msg := completionMessage{Role: string(schemas.MessageAssistant)}
	if calls := validRaw(resp.ToolCalls); calls != nil {
		msg.ToolCalls = calls
	}
	if resp.Content != "" || msg.ToolCalls == nil {
		msg.Content = &resp.Content
	}
	return chatCompletion{
		ID: completionID(resp.GroupID), Object: "chat.completion", Created: now.Unix(), Model: pool,
		Choices: []completionChoice{{Message: msg, FinishReason: finishReason(resp)}},
		Usage:   newUsage(resp.Usage),
	}
}

// finishReason is the winner's, or what its answer implies when the
// provider reported none.
func finishReason(resp *Response) string {
	switch {
	case resp.FinishReason != "":
		return resp.FinishReason
	case validRaw(resp.ToolCalls) != nil:
		return "tool_calls"
	}
	return "stop"
}

// validRaw returns raw as JSON when it holds a value, else nil.
func validRaw(raw []byte) json.RawMessage {
	if len(raw) == 0 || isJSONNull(raw) || !json.Valid(raw) {
		return nil
	}
	return raw
}

// completionChunk is the OpenAI chat.completion.chunk object.
type completionChunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []chunkChoice `json:"choices"`
	// Usage is null on every chunk but the last when the caller asked for
	// usage, and absent otherwise.
	Usage json.RawMessage `json:"usage,omitempty"`
}

type chunkChoice struct {
	Index        int        `json:"index"`
	Delta        chunkDelta `json:"delta"`
	FinishReason *string    `json:"finish_reason"`
}

type chunkDelta struct {
	Role      string          `json:"role,omitempty"`
	Content   *string         `json:"content,omitempty"`
	ToolCalls json.RawMessage `json:"tool_calls,omitempty"`
}

type modelList struct {
	Object string  `json:"object"`
	Data   []model `json:"data"`
}

type model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func newModel(pool string) model { return model{ID: pool, Object: "model", OwnedBy: "hedgerow"} }
