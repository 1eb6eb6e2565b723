package fakellm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/hedgerow/hedgerow/schemas"
)

// messagesAPI is Anthropic's Messages API (POST /v1/messages). Its answers
// come from the same draw as a chat completion: a request whose
// conversation is the same text — the system prompt as one leading system
// message, string content as string content, text blocks as text parts —
// and whose cap is the same (or beyond the model's longest answer) draws
// the same answer and latency on the same route, whichever API asked.
type messagesAPI struct{}

// messagesRequest is the body of POST /v1/messages: what the fake reads.
// Sampling parameters and tools are accepted and, as in the chat API,
// ignored; the draw decides the answer.
type messagesRequest struct {
	Model         string            `json:"model"`
	MaxTokens     *int              `json:"max_tokens"`
	System        json.RawMessage   `json:"system"`
	Messages      []messagesMessage `json:"messages"`
	StopSequences []string          `json:"stop_sequences"`
	Temperature   *float64          `json:"temperature"`
	TopP          *float64          `json:"top_p"`
	Stream        bool              `json:"stream"`
}

type messagesMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

func (messagesAPI) parse(body []byte, maxOutput int, style Continuation) (chatParams, error) {
	var req messagesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return chatParams{}, &requestError{code: errCodeInvalidBody, message: fmt.Sprintf("Invalid JSON body: %v", err)}
	}
	invalid := func(param, format string, args ...any) (chatParams, error) {
		return chatParams{}, &requestError{param: param, code: errCodeInvalidParams, message: param + ": " + fmt.Sprintf(format, args...)}
	}
	switch {
	case req.Model == "":
		return invalid("model", "Field required")
	case req.MaxTokens == nil:
		return invalid("max_tokens", "Field required")
	case *req.MaxTokens < 1:
		return invalid("max_tokens", "Input should be greater than or equal to 1")
	case len(req.Messages) == 0:
		return invalid("messages", "at least one message is required")
	case req.Temperature != nil && (*req.Temperature < 0 || *req.Temperature > 1):
		return invalid("temperature", "Input should be between 0 and 1")
	case req.TopP != nil && (*req.TopP < 0 || *req.TopP > 1):
		return invalid("top_p", "Input should be between 0 and 1")
	}
	for i, s := range req.StopSequences {
		if s == "" {
			return invalid(fmt.Sprintf("stop_sequences.%d", i), "stop sequences must not be empty")
		}
	}
	msgs := make([]schemas.Message, 0, len(req.Messages)+1)
	system, err := systemMessages(req.System)
	if err != nil {
		return invalid("system", "%v", err)
	}
	msgs = append(msgs, system...)
	for i, m := range req.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			return invalid(fmt.Sprintf("messages.%d.role", i), "Input should be 'user' or 'assistant'")
		}
		content, err := canonicalContent(m.Content)
		if err != nil {
			return invalid(fmt.Sprintf("messages.%d.content", i), "%v", err)
		}
		msgs = append(msgs, schemas.Message{Role: schemas.MessageRole(m.Role), Content: content})
	}
	cont, err := messagesContinuation(msgs, style)
	if err != nil {
		return chatParams{}, err
	}
	return newChatParams(req.Model, msgs, *req.MaxTokens, maxOutput, req.Stream, false, cont)
}

// systemMessages is the system prompt as the chat API's system message,
// its content converted as canonicalContent converts a message's.
func systemMessages(raw json.RawMessage) ([]schemas.Message, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	content, err := canonicalContent(raw)
	if err != nil {
		return nil, err
	}
	return []schemas.Message{{Role: schemas.MessageSystem, Content: content}}, nil
}

// canonicalContent is a message's content as the chat API carries it:
// string content as is, text blocks as text parts; other blocks (images,
// tool use and results) are kept as given, typed, for the key alone.
func canonicalContent(raw json.RawMessage) (json.RawMessage, error) {
	return chatContent(raw, "block", "want a string or a non-empty array of content blocks",
		func(typ string) bool { return typ == "text" })
}

func (messagesAPI) id(requestID uint64, route, number int) string {
	return fmt.Sprintf("msg_%016x-r%d-a%d", requestID, route, number)
}

// writeError answers with Anthropic's error envelope; the error type
// follows from the status as the API's does.
func (messagesAPI) writeError(w http.ResponseWriter, status int, _, _, _, message string) {
	writeJSON(w, status, messagesErrorBody{Type: "error", Error: messagesErrorObject{Type: messagesErrorType(status), Message: message}})
}

// messagesErrorType is the Anthropic error type of an HTTP status.
func messagesErrorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusMethodNotAllowed:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	case 529:
		return "overloaded_error"
	}
	return "api_error"
}

// stopReason is the Messages stop_reason of the exchange's finish reason.
func stopReason(finish string) string {
	if finish == "length" {
		return "max_tokens"
	}
	return "end_turn"
}

func (messagesAPI) completion(ex *exchange, text string) any {
	reason := stopReason(ex.finish)
	return messagesResponse{
		ID: ex.id, Type: "message", Role: "assistant", Model: ex.model,
		Content:    []textContent{{Type: "text", Text: text}},
		StopReason: &reason,
		Usage:      messagesUsage{InputTokens: ex.att.Request.InputTokens, OutputTokens: ex.att.Request.OutputTokens},
	}
}

// streamStart sends message_start, the text block's start and a ping, as
// the API does before its first token.
func (messagesAPI) streamStart(buf *bytes.Buffer, ex *exchange) {
	appendEvent(buf, "message_start", struct {
		Type    string           `json:"type"`
		Message messagesResponse `json:"message"`
	}{"message_start", messagesResponse{
		ID: ex.id, Type: "message", Role: "assistant", Model: ex.model, Content: []textContent{},
		Usage: messagesUsage{InputTokens: ex.att.Request.InputTokens},
	}})
	appendEvent(buf, "content_block_start", struct {
		Type         string      `json:"type"`
		Index        int         `json:"index"`
		ContentBlock textContent `json:"content_block"`
	}{"content_block_start", 0, textContent{Type: "text"}})
	appendEvent(buf, "ping", struct {
		Type string `json:"type"`
	}{"ping"})
}

func (messagesAPI) streamToken(buf *bytes.Buffer, _ *exchange, word string) {
	appendEvent(buf, "content_block_delta", struct {
		Type  string      `json:"type"`
		Index int         `json:"index"`
		Delta textContent `json:"delta"`
	}{"content_block_delta", 0, textContent{Type: "text_delta", Text: word}})
}

// streamEnd closes the text block, reports the stop reason and the
// cumulative output tokens in message_delta, and stops.
func (messagesAPI) streamEnd(buf *bytes.Buffer, ex *exchange) {
	appendEvent(buf, "content_block_stop", struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
	}{"content_block_stop", 0})
	reason := stopReason(ex.finish)
	appendEvent(buf, "message_delta", messageDelta{
		Type:  "message_delta",
		Delta: stopDelta{StopReason: &reason},
		Usage: outputUsage{OutputTokens: ex.att.Request.OutputTokens},
	})
	appendEvent(buf, "message_stop", struct {
		Type string `json:"type"`
	}{"message_stop"})
}

// streamError sends an error event, Anthropic's way of failing a stream
// after its 200; the error type is the one the API gives a timeout, or
// for any other failure a server error.
func (messagesAPI) streamError(buf *bytes.Buffer, typ, _, message string) {
	status := http.StatusInternalServerError
	if typ == errTypeTimeout {
		status = http.StatusGatewayTimeout
	}
	appendEvent(buf, "error", messagesErrorBody{Type: "error",
		Error: messagesErrorObject{Type: messagesErrorType(status), Message: message}})
}

// appendEvent appends one server-sent event holding v, named unless name
// is empty (OpenAI's chat chunks are unnamed).
func appendEvent(buf *bytes.Buffer, name string, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		return // only plain fields; cannot fail
	}
	if name != "" {
		buf.WriteString("event: ")
		buf.WriteString(name)
		buf.WriteString("\n")
	}
	buf.WriteString("data: ")
	buf.Write(data)
	buf.WriteString("\n\n")
}

// messagesResponse is a Message object: the non-streaming answer, and
// message_start's message with no content yet.
type messagesResponse struct {
	ID           string        `json:"id"`
	Type         string        `json:"type"` // "message"
	Role         string        `json:"role"`
	Model        string        `json:"model"`
	Content      []textContent `json:"content"`
	StopReason   *string       `json:"stop_reason"`   // null in message_start
	StopSequence *string       `json:"stop_sequence"` // always null: the fake does not stop on sequences
	Usage        messagesUsage `json:"usage"`
}

// messageDelta is the message_delta event: the stop reason and the
// cumulative usage of the whole message.
type messageDelta struct {
	Type  string      `json:"type"`
	Delta stopDelta   `json:"delta"`
	Usage outputUsage `json:"usage"`
}

type stopDelta struct {
	StopReason   *string `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
}

type outputUsage struct {
	OutputTokens int `json:"output_tokens"`
}

type textContent struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type messagesUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// messagesErrorBody is Anthropic's error envelope.
type messagesErrorBody struct {
	Type  string              `json:"type"` // "error"
	Error messagesErrorObject `json:"error"`
}

type messagesErrorObject struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}
