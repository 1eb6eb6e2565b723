package httpdoor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/schemas"
)

// This file holds the OpenAI dialect of the HTTP front door: the request
// body, the completion and chunk objects, and the error object.

// openAIDialect speaks OpenAI's chat completions.
type openAIDialect struct{}

var _ dialect = openAIDialect{}

func (openAIDialect) parse(body []byte) (string, schemas.ChatRequest, bool, *frontdoor.Failure) {
	return parseChatRequest(body)
}

func (openAIDialect) answer(resp *dispatcher.Response, pool string, now time.Time) any {
	return newChatCompletion(resp, pool, now)
}

func (openAIDialect) stream(w http.ResponseWriter, pool string, now time.Time, includeUsage bool) stream {
	return &completionStream{sseWriter: newSSEWriter(w), model: pool, created: now.Unix(), includeUsage: includeUsage}
}

func (openAIDialect) writeFailure(w http.ResponseWriter, f *frontdoor.Failure) {
	setFailureHeaders(w.Header(), f)
	writeJSON(w, f.Status(frontdoor.OpenAI), openAIError(f))
}

// errorObject is an OpenAI error object.
type errorObject struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func openAIError(f *frontdoor.Failure) errorObject {
	var o errorObject
	o.Error.Message, o.Error.Type = f.Message, f.OpenAIType()
	if f.Param != "" {
		o.Error.Param = &f.Param
	}
	if f.Code != "" {
		o.Error.Code = &f.Code
	}
	return o
}

// parseChatRequest reads an OpenAI chat completions body: the model (the
// pool), the canonical request and whether a streamed answer ends with a
// usage chunk. The members hedgerow reads or translates are typed (a known
// member of the wrong type is an error naming it); every other member the
// caller sent is carried as sent in the request's Extra, for the route
// (docs/architecture.md §8). stream_options is the door's: the worker asks
// its provider for usage whatever the caller asked.
func parseChatRequest(body []byte) (pool string, req schemas.ChatRequest, includeUsage bool, f *frontdoor.Failure) {
	var maxTokens, maxCompletionTokens, n *int
	var stop json.RawMessage
	var streamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	}
	members := []member{
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
		{"parallel_tool_calls", "a boolean", &req.ParallelToolCalls},
		{"stream", "a boolean", &req.Stream},
		{"stream_options", "an object", &streamOptions},
	}
	fields, f := readMembers(body, members, openAIWrongType)
	switch {
	case f != nil:
		return "", req, false, f
	case pool == "":
		return "", req, false, frontdoor.InvalidParam("model", "You must name a model: one of the pools in GET /v1/models.")
	case len(req.Messages) == 0:
		return "", req, false, frontdoor.InvalidParam("messages", "'messages' must be a non-empty array.")
	case n != nil && *n != 1:
		return "", req, false, frontdoor.InvalidParam("n", "Only one choice (n = 1) is supported.")
	}
	if req.MaxTokens, f = chatMaxTokens(maxTokens, maxCompletionTokens); f != nil {
		return "", req, false, f
	}
	var err error
	if req.Stop, err = parseStop(stop); err != nil {
		return "", req, false, frontdoor.InvalidParam("stop", "Invalid type for 'stop': expected a string or an array of strings.")
	}
	req.Model, req.Dialect = pool, schemas.DialectOpenAI
	req.Extra = unread(fields, members)
	// The route gets the cap under the name the caller used; a max_tokens
	// that max_completion_tokens supersedes, and n = 1, go as sent.
	if maxCompletionTokens != nil {
		req.MaxTokensField = schemas.ParamMaxCompletionTokens
		if maxTokens != nil {
			req.Extra = withMember(req.Extra, schemas.ParamMaxTokens, fields[schemas.ParamMaxTokens])
		}
	}
	if n != nil {
		req.Extra = withMember(req.Extra, "n", fields["n"])
	}
	if err := req.Validate(); err != nil {
		return "", req, false, invalidRequest(err)
	}
	// stream_options without stream is ignored rather than refused: clients
	// that always send it still work.
	return pool, req, req.Stream && streamOptions.IncludeUsage, nil
}

// withMember adds one member to extra, making the map if need be.
func withMember(extra map[string]json.RawMessage, name string, raw json.RawMessage) map[string]json.RawMessage {
	if extra == nil {
		extra = make(map[string]json.RawMessage, 1)
	}
	extra[name] = raw
	return extra
}

// chatMaxTokens is the output limit a chat request asks for: its
// max_completion_tokens, which supersedes the deprecated max_tokens; zero
// when it asks for none.
func chatMaxTokens(maxTokens, maxCompletionTokens *int) (int, *frontdoor.Failure) {
	limit := 0
	for _, mt := range []struct {
		name string
		v    *int
	}{{"max_tokens", maxTokens}, {"max_completion_tokens", maxCompletionTokens}} {
		if mt.v == nil {
			continue
		}
		if *mt.v < 1 {
			return 0, frontdoor.InvalidParam(mt.name, fmt.Sprintf("'%s' must be at least 1.", mt.name))
		}
		limit = *mt.v
	}
	return limit, nil
}

// paramResponseSchema is where a request's JSON schema sits.
const paramResponseSchema = frontdoor.ParamResponseSchema

// responseFormatFailure answers a response_format the pool's contract
// cannot honour (Submitter.CheckResponseFormat). Its texts are fixed: the
// compiler's messages can quote the schema.
func responseFormatFailure(pool string, err error) *frontdoor.Failure {
	switch {
	case errors.Is(err, dispatcher.ErrUnknownPool):
		return frontdoor.ModelNotFound(pool)
	case frontdoor.SchemaRefused(err) != nil:
		return frontdoor.SchemaRefused(err)
	case errors.Is(err, arbiter.ErrInvalidContract):
		return frontdoor.InvalidParam(paramResponseSchema,
			"The JSON schema in 'response_format.json_schema.schema' is not a valid, self-contained JSON Schema (external $ref is not allowed).")
	}
	return frontdoor.InvalidParam("response_format",
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
	// Refusal is the model's refusal, which won as an answer (a refusal is
	// not an empty answer to the arbiter, docs/architecture.md §6).
	Refusal string `json:"refusal,omitempty"`
}

type openAIUsage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

func newUsage(u schemas.Usage) *openAIUsage {
	return &openAIUsage{PromptTokens: u.InputUnits, CompletionTokens: u.OutputUnits, TotalTokens: u.InputUnits + u.OutputUnits}
}

func newChatCompletion(resp *dispatcher.Response, pool string, now time.Time) chatCompletion {
	msg := completionMessage{Role: string(schemas.MessageAssistant), Refusal: resp.Refusal}
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
func finishReason(resp *dispatcher.Response) string {
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

// completionID names a completion after its hedge group, so a caller's
// report can be matched to the records; a stream that starts before its
// group is known gets a random one.
func completionID(groupID string) string {
	if groupID == "" {
		groupID = randomID()
	}
	return "chatcmpl-" + groupID
}
