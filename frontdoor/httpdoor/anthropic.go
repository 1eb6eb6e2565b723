package httpdoor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/schemas"
)

// This file is the Anthropic Messages dialect of the HTTP front door:
// POST /v1/messages takes a Messages request, runs it as the same
// Submission a chat completion becomes (the model names the pool; hedging,
// budgets and the contract are the pool's), and answers as a Message or as
// Messages streaming events. Errors are Anthropic's error objects. Which
// providers the pool's routes speak does not matter: an Anthropic caller can
// be served by OpenAI-compatible routes and the other way round.

// Anthropic error types (the "type" of an error object).
const (
	anthropicInvalidRequest = "invalid_request_error"
	anthropicAuthentication = "authentication_error"
	anthropicPermission     = "permission_error"
	anthropicNotFound       = "not_found_error"
	anthropicTooLarge       = "request_too_large"
	anthropicRateLimit      = "rate_limit_error"
	anthropicAPI            = "api_error"
	anthropicTimeout        = "timeout_error"
	anthropicOverloaded     = "overloaded_error"
)

// anthropicDialect speaks Anthropic's Messages API.
type anthropicDialect struct{}

var _ dialect = anthropicDialect{}

func (anthropicDialect) parse(body []byte) (string, schemas.ChatRequest, bool, *frontdoor.Failure) {
	pool, req, f := parseMessagesRequest(body)
	return pool, req, false, f
}

func (anthropicDialect) answer(resp *dispatcher.Response, pool string, _ time.Time) any {
	return newMessage(resp, pool)
}

func (anthropicDialect) stream(w http.ResponseWriter, pool string, _ time.Time, _ bool) stream {
	return &messagesStream{sseWriter: newSSEWriter(w), model: pool, block: -1}
}

// writeFailure answers with an Anthropic error object, with the headers the
// OpenAI door sends for the same failure.
func (anthropicDialect) writeFailure(w http.ResponseWriter, f *frontdoor.Failure) {
	setFailureHeaders(w.Header(), f)
	writeJSON(w, f.Status(frontdoor.Anthropic), anthropicError(f))
}

// errorEvent is an Anthropic error object: the body of an error answer and
// of a stream's error event.
type errorEvent struct {
	Type  string `json:"type"` // "error"
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// anthropicError restates a failure in Anthropic's terms: the type follows
// from the status as in Anthropic's API.
func anthropicError(f *frontdoor.Failure) errorEvent {
	e := errorEvent{Type: "error"}
	e.Error.Message = f.Message
	switch status := f.Status(frontdoor.Anthropic); status {
	case http.StatusUnauthorized:
		e.Error.Type = anthropicAuthentication
		e.Error.Message = "A valid API key is required in the x-api-key header (or Authorization: Bearer)."
	case http.StatusForbidden:
		e.Error.Type = anthropicPermission
	case http.StatusNotFound:
		e.Error.Type = anthropicNotFound
	case http.StatusRequestEntityTooLarge:
		e.Error.Type = anthropicTooLarge
	case http.StatusTooManyRequests:
		e.Error.Type = anthropicRateLimit
	case http.StatusGatewayTimeout:
		e.Error.Type = anthropicTimeout
	case frontdoor.StatusOverloaded:
		e.Error.Type = anthropicOverloaded
	default:
		e.Error.Type = anthropicInvalidRequest
		if status >= 500 {
			e.Error.Type = anthropicAPI
		}
	}
	return e
}

// invalidMessages is a 400 invalid_request_error about one field, worded
// as Anthropic's API words its own: "<field>: <problem>".
func invalidMessages(field, format string, args ...any) *frontdoor.Failure {
	return frontdoor.InvalidParam(field, field+": "+fmt.Sprintf(format, args...))
}

// mustJSON encodes values built here from strings and from JSON already
// parsed, which always encode; were one not to, it would read as null.
func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		return json.RawMessage("null")
	}
	return b
}

// message is the Message object of a non-streaming answer, and of
// message_start with no content yet.
type message struct {
	ID           string            `json:"id"`
	Type         string            `json:"type"` // "message"
	Role         string            `json:"role"`
	Model        string            `json:"model"`
	Content      []json.RawMessage `json:"content"`
	StopReason   *string           `json:"stop_reason"`
	StopSequence *string           `json:"stop_sequence"`
	Usage        messageUsage      `json:"usage"`
}

type messageUsage struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
}

// messageID names a message after its hedge group, as completionID does a
// completion; a stream that starts before its group is known gets a random
// one.
func messageID(groupID string) string {
	if groupID == "" {
		groupID = randomID()
	}
	return "msg_" + groupID
}

// stopReason is the Messages stop_reason of the winner's finish reason.
// Which stop sequence ended an answer is not carried through the hedge
// group, so a stop sequence reads as end_turn with a null stop_sequence.
func stopReason(resp *dispatcher.Response) string {
	switch r := finishReason(resp); r {
	case "length":
		return "max_tokens"
	case "tool_calls":
		return "tool_use"
	case "content_filter":
		return "refusal"
	case "end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal":
		return r
	}
	return "end_turn"
}

func newMessage(resp *dispatcher.Response, pool string) message {
	var content []json.RawMessage
	if resp.Content != "" {
		content = append(content, mustJSON(textPart{Type: "text", Text: resp.Content}))
	}
	content = append(content, toolUseBlocks(resp.ToolCalls)...)
	if content == nil {
		content = []json.RawMessage{}
	}
	reason := stopReason(resp)
	return message{
		ID: messageID(resp.GroupID), Type: "message", Role: "assistant", Model: pool,
		Content: content, StopReason: &reason,
		Usage: messageUsage{InputTokens: resp.Usage.InputUnits, OutputTokens: resp.Usage.OutputUnits},
	}
}

// toolUseBlock is a tool_use content block.
type toolUseBlock struct {
	Type  string          `json:"type"` // "tool_use"
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

// toolUseBlocks turns the winner's accumulated tool calls into tool_use
// blocks. Arguments that are not a JSON object (a call cut short) become an
// empty input: a tool_use block's input must be an object.
func toolUseBlocks(raw []byte) []json.RawMessage {
	if validRaw(raw) == nil {
		return nil
	}
	var calls []toolCall
	if json.Unmarshal(raw, &calls) != nil {
		return nil
	}
	out := make([]json.RawMessage, 0, len(calls))
	for _, c := range calls {
		out = append(out, mustJSON(toolUseBlock{Type: "tool_use", ID: c.ID, Name: c.Function.Name, Input: objectOrEmpty(c.Function.Arguments)}))
	}
	return out
}

func objectOrEmpty(s string) json.RawMessage {
	t := bytes.TrimSpace([]byte(s))
	if len(t) > 0 && t[0] == '{' && json.Valid(t) {
		return t
	}
	return json.RawMessage("{}")
}

// messagesStream writes a streaming answer as Messages events. It is the
// Sink of its submission, on the handler's goroutine. As the OpenAI stream
// does, it writes nothing before the commit, and sends the X-Hedgerow-*
// values as headers when the commit is known first, else as trailers.
//
// message_start reports the input tokens the commit carries: the
// winner's count when its result was in, else the dispatcher's estimate of
// the prompt (a provider reports its count only at the end), and zero
// output; message_delta carries the winner's input and output tokens,
// which clients take as the message's cumulative usage (the official SDKs
// replace message_start's input count with it).
type messagesStream struct {
	sseWriter
	model string
	id    string

	blocks int         // content blocks started
	block  int         // the open block's index; -1 when none is open
	text   bool        // the open block is text
	tools  map[int]int // OpenAI tool-call index → its tool_use block
}

var _ dispatcher.CommitSink = (*messagesStream)(nil)

// Delta writes text as text_delta events of a text block and tool-call
// fragments as a tool_use block and its input_json_delta events.
func (s *messagesStream) Delta(d dispatcher.Delta) error {
	if err := s.start(); err != nil {
		return err
	}
	if d.Content != "" {
		if s.block < 0 || !s.text {
			if err := s.open(true, mustJSON(textPart{Type: "text", Text: ""})); err != nil {
				return err
			}
		}
		if err := s.event("content_block_delta", blockDelta{Type: "content_block_delta", Index: s.block,
			Delta: mustJSON(textDelta{Type: "text_delta", Text: d.Content})}); err != nil {
			return err
		}
	}
	if validRaw(d.ToolCalls) == nil {
		return nil
	}
	var frags []struct {
		Index    int    `json:"index"`
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	if json.Unmarshal(d.ToolCalls, &frags) != nil {
		return nil // the arbiter checked the stream; nothing here to show
	}
	for _, f := range frags {
		block, ok := s.tools[f.Index]
		if !ok {
			start := toolUseBlock{Type: "tool_use", ID: f.ID, Name: f.Function.Name, Input: json.RawMessage("{}")}
			if err := s.open(false, mustJSON(start)); err != nil {
				return err
			}
			if s.tools == nil {
				s.tools = map[int]int{}
			}
			block = s.block
			s.tools[f.Index] = block
		}
		if f.Function.Arguments == "" {
			continue
		}
		if err := s.event("content_block_delta", blockDelta{Type: "content_block_delta", Index: block,
			Delta: mustJSON(jsonDelta{Type: "input_json_delta", PartialJSON: f.Function.Arguments})}); err != nil {
			return err
		}
	}
	return nil
}

type blockDelta struct {
	Type  string          `json:"type"`
	Index int             `json:"index"`
	Delta json.RawMessage `json:"delta"`
}

type textDelta struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type jsonDelta struct {
	Type        string `json:"type"`
	PartialJSON string `json:"partial_json"`
}

type blockEvent struct {
	Type         string          `json:"type"`
	Index        int             `json:"index"`
	ContentBlock json.RawMessage `json:"content_block,omitempty"`
}

// open closes the open block and starts the next one.
func (s *messagesStream) open(text bool, block json.RawMessage) error {
	if err := s.close(); err != nil {
		return err
	}
	s.block, s.text = s.blocks, text
	s.blocks++
	return s.event("content_block_start", blockEvent{Type: "content_block_start", Index: s.block, ContentBlock: block})
}

func (s *messagesStream) close() error {
	if s.block < 0 {
		return nil
	}
	i := s.block
	s.block = -1
	return s.event("content_block_stop", blockEvent{Type: "content_block_stop", Index: i})
}

// start sends the status line, the headers and message_start, once.
func (s *messagesStream) start() error {
	first, group, err := s.begin()
	if !first || err != nil {
		return err
	}
	s.id = messageID(group)
	start := message{ID: s.id, Type: "message", Role: "assistant", Model: s.model, Content: []json.RawMessage{}}
	if s.commit != nil {
		start.Usage.InputTokens = s.commit.Usage.InputUnits
	}
	return s.event("message_start", struct {
		Type    string  `json:"type"`
		Message message `json:"message"`
	}{"message_start", start})
}

// finish ends a successful stream: the open block's stop, message_delta
// with the stop reason and the usage, message_stop, and the trailers.
func (s *messagesStream) finish(resp *dispatcher.Response) error {
	s.Committed(resp) // an empty answer: nothing was sent yet
	if err := s.start(); err != nil {
		return err
	}
	if err := s.close(); err != nil {
		return err
	}
	reason := stopReason(resp)
	if err := s.event("message_delta", struct {
		Type  string `json:"type"`
		Delta struct {
			StopReason   *string `json:"stop_reason"`
			StopSequence *string `json:"stop_sequence"`
		} `json:"delta"`
		Usage messageUsage `json:"usage"`
	}{Type: "message_delta", Delta: struct {
		StopReason   *string `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	}{StopReason: &reason}, Usage: messageUsage{InputTokens: resp.Usage.InputUnits, OutputTokens: resp.Usage.OutputUnits}}); err != nil {
		return err
	}
	if err := s.event("message_stop", struct {
		Type string `json:"type"`
	}{"message_stop"}); err != nil {
		return err
	}
	s.end(resp)
	return nil
}

// fail ends a started stream with an error event and without message_stop,
// so no client takes it for a whole answer.
func (s *messagesStream) fail(f *frontdoor.Failure) error {
	return s.event("error", anthropicError(f))
}
