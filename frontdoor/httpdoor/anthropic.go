package httpdoor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
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

// parseMessagesRequest reads a Messages request into the canonical request.
// The system prompt becomes a leading system message; tool_result blocks
// become tool messages ahead of the rest of their user turn; tool_use blocks
// become the assistant's tool calls; images become image_url parts; tools
// and tool_choice take the OpenAI shapes the canonical request keeps.
// Thinking blocks of earlier turns are dropped (no route could read them
// back), as are top_k, metadata and the other fields the canonical request
// has no place for; content it cannot carry (documents, server tools) is
// refused rather than dropped.
func parseMessagesRequest(body []byte) (string, schemas.ChatRequest, *frontdoor.Failure) {
	var req schemas.ChatRequest
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return "", req, &frontdoor.Failure{Code: frontdoor.CodeInvalidJSON, Message: "The request body is not a JSON object."}
	}
	var (
		pool      string
		maxTokens *int
		messages  []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		system, tools json.RawMessage
		toolChoice    json.RawMessage
		stop          []string
	)
	for _, f := range []struct {
		name, want string
		dst        any
	}{
		{"model", "a string", &pool},
		{"max_tokens", "an integer", &maxTokens},
		{"messages", "a list of messages", &messages},
		{"system", "a string or a list of text blocks", &system},
		{"stop_sequences", "a list of strings", &stop},
		{"temperature", "a number", &req.Temperature},
		{"top_p", "a number", &req.TopP},
		{"tools", "a list of tools", &tools},
		{"tool_choice", "an object", &toolChoice},
		{"stream", "a boolean", &req.Stream},
	} {
		raw, ok := fields[f.name]
		if !ok || isJSONNull(raw) {
			continue
		}
		if err := json.Unmarshal(raw, f.dst); err != nil {
			return "", req, invalidMessages(f.name, "Input should be %s", f.want)
		}
	}
	switch {
	case pool == "":
		return "", req, invalidMessages("model", "Field required")
	case maxTokens == nil:
		return "", req, invalidMessages("max_tokens", "Field required")
	case *maxTokens < 1:
		return "", req, invalidMessages("max_tokens", "Input should be greater than or equal to 1")
	case len(messages) == 0:
		return "", req, invalidMessages("messages", "at least one message is required")
	case req.Temperature != nil && !(*req.Temperature >= 0 && *req.Temperature <= 1):
		return "", req, invalidMessages("temperature", "Input should be less than or equal to 1 and greater than or equal to 0")
	case req.TopP != nil && !(*req.TopP >= 0 && *req.TopP <= 1):
		return "", req, invalidMessages("top_p", "Input should be less than or equal to 1 and greater than or equal to 0")
	}
	req.Model, req.MaxTokens, req.Stop = pool, *maxTokens, stop
	if sys, aerr := systemMessage(system); aerr != nil {
		return "", req, aerr
	} else if sys != nil {
		req.Messages = append(req.Messages, *sys)
	}
	for i, m := range messages {
		var (
			msgs []schemas.Message
			aerr *frontdoor.Failure
		)
		field := fmt.Sprintf("messages.%d", i)
		switch m.Role {
		case "user":
			msgs, aerr = userTurn(field, m.Content)
		case "assistant":
			msgs, aerr = assistantTurn(field, m.Content)
		default:
			aerr = invalidMessages(field+".role", "Input should be 'user' or 'assistant'")
		}
		if aerr != nil {
			return "", req, aerr
		}
		req.Messages = append(req.Messages, msgs...)
	}
	var aerr *frontdoor.Failure
	if req.Tools, aerr = openAITools(tools); aerr != nil {
		return "", req, aerr
	}
	if req.ToolChoice, aerr = openAIToolChoice(toolChoice); aerr != nil {
		return "", req, aerr
	}
	if err := req.Validate(); err != nil {
		// Its messages already name their field ("messages[1]: no content").
		return "", req, frontdoor.InvalidParam(validationParam(err), validationMessage(err))
	}
	return pool, req, nil
}

// contentBlock is the part of a Messages content block the door reads.
type contentBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text"`
	Source    *imageSource    `json:"source"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
}

type imageSource struct {
	Type      string `json:"type"`
	MediaType string `json:"media_type"`
	Data      string `json:"data"`
	URL       string `json:"url"`
}

// blocksOf reads content as blocks: a string is one text block.
func blocksOf(field string, raw json.RawMessage) ([]contentBlock, *frontdoor.Failure) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, invalidMessages(field, "Input should be a valid string")
		}
		return []contentBlock{{Type: "text", Text: &s}}, nil
	}
	var blocks []contentBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return nil, invalidMessages(field, "Input should be a string or a list of content blocks")
	}
	for j, b := range blocks {
		if b.Type == "text" && b.Text == nil {
			return nil, invalidMessages(fmt.Sprintf("%s.%d.text", field, j), "Field required")
		}
	}
	return blocks, nil
}

// systemMessage is the system prompt as one system message: string
// content stays a string, text blocks become text parts.
func systemMessage(raw json.RawMessage) (*schemas.Message, *frontdoor.Failure) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil, nil
	}
	if raw[0] == '"' {
		return &schemas.Message{Role: schemas.MessageSystem, Content: raw}, nil
	}
	blocks, aerr := blocksOf("system", raw)
	if aerr != nil {
		return nil, aerr
	}
	parts := make([]textPart, 0, len(blocks))
	for j, b := range blocks {
		if b.Type != "text" {
			return nil, invalidMessages(fmt.Sprintf("system.%d.type", j), "the system prompt takes only text blocks")
		}
		parts = append(parts, textPart{Type: "text", Text: *b.Text})
	}
	return &schemas.Message{Role: schemas.MessageSystem, Content: mustJSON(parts)}, nil
}

// textPart and imagePart are OpenAI content parts.
type textPart struct {
	Type string `json:"type"` // "text"
	Text string `json:"text"`
}

type imagePart struct {
	Type     string `json:"type"` // "image_url"
	ImageURL struct {
		URL string `json:"url"`
	} `json:"image_url"`
}

// userTurn is one user turn: its tool results as tool messages, then its
// text and images as one user message (if it has any).
func userTurn(field string, raw json.RawMessage) ([]schemas.Message, *frontdoor.Failure) {
	if t := bytes.TrimSpace(raw); len(t) > 0 && t[0] == '"' {
		return []schemas.Message{{Role: schemas.MessageUser, Content: t}}, nil
	}
	blocks, aerr := blocksOf(field+".content", raw)
	if aerr != nil {
		return nil, aerr
	}
	var out []schemas.Message
	var parts []any
	for j, b := range blocks {
		at := fmt.Sprintf("%s.content.%d", field, j)
		switch b.Type {
		case "text":
			parts = append(parts, textPart{Type: "text", Text: *b.Text})
		case "image":
			p, aerr := imagePartOf(at, b.Source)
			if aerr != nil {
				return nil, aerr
			}
			parts = append(parts, p)
		case "tool_result":
			msg, aerr := toolMessage(at, b)
			if aerr != nil {
				return nil, aerr
			}
			out = append(out, msg)
		default:
			return nil, invalidMessages(at+".type", "content blocks of type %q are not supported by this gateway", b.Type)
		}
	}
	if len(parts) > 0 {
		out = append(out, schemas.Message{Role: schemas.MessageUser, Content: mustJSON(parts)})
	}
	if len(out) == 0 {
		return nil, invalidMessages(field+".content", "a user turn needs at least one content block")
	}
	return out, nil
}

// imagePartOf turns an image source into an image_url part: base64 data
// as a data URL, a URL as itself.
func imagePartOf(field string, src *imageSource) (imagePart, *frontdoor.Failure) {
	var p imagePart
	p.Type = "image_url"
	switch {
	case src == nil:
		return p, invalidMessages(field+".source", "Field required")
	case src.Type == "base64" && src.MediaType != "" && src.Data != "":
		p.ImageURL.URL = "data:" + src.MediaType + ";base64," + src.Data
	case src.Type == "url" && (strings.HasPrefix(src.URL, "https://") || strings.HasPrefix(src.URL, "http://")):
		p.ImageURL.URL = src.URL
	default:
		return p, invalidMessages(field+".source", "an image source is base64 data with its media_type, or an http(s) url")
	}
	return p, nil
}

// toolMessage turns a tool_result block into a tool message. is_error has
// no canonical place and is dropped; the result's text says what failed.
func toolMessage(field string, b contentBlock) (schemas.Message, *frontdoor.Failure) {
	if b.ToolUseID == "" {
		return schemas.Message{}, invalidMessages(field+".tool_use_id", "Field required")
	}
	msg := schemas.Message{Role: schemas.MessageTool, ToolCallID: b.ToolUseID}
	content := bytes.TrimSpace(b.Content)
	switch {
	case len(content) == 0 || isJSONNull(content):
		msg.Content = schemas.TextContent("")
	case content[0] == '"':
		msg.Content = content
	default:
		blocks, aerr := blocksOf(field+".content", content)
		if aerr != nil {
			return msg, aerr
		}
		parts := make([]textPart, 0, len(blocks))
		for k, rb := range blocks {
			if rb.Type != "text" {
				return msg, invalidMessages(fmt.Sprintf("%s.content.%d.type", field, k), "tool results carry only text here")
			}
			parts = append(parts, textPart{Type: "text", Text: *rb.Text})
		}
		msg.Content = mustJSON(parts)
	}
	return msg, nil
}

// assistantTurn is one assistant turn: text as content, tool_use blocks as
// tool calls; thinking of earlier turns is dropped.
func assistantTurn(field string, raw json.RawMessage) ([]schemas.Message, *frontdoor.Failure) {
	if t := bytes.TrimSpace(raw); len(t) > 0 && t[0] == '"' {
		return []schemas.Message{{Role: schemas.MessageAssistant, Content: t}}, nil
	}
	blocks, aerr := blocksOf(field+".content", raw)
	if aerr != nil {
		return nil, aerr
	}
	var parts []textPart
	var calls []toolCall
	for j, b := range blocks {
		at := fmt.Sprintf("%s.content.%d", field, j)
		switch b.Type {
		case "text":
			parts = append(parts, textPart{Type: "text", Text: *b.Text})
		case "tool_use":
			input := bytes.TrimSpace(b.Input)
			if b.ID == "" || b.Name == "" || len(input) == 0 || input[0] != '{' || !json.Valid(input) {
				return nil, invalidMessages(at, "a tool_use block needs an id, a name and an object input")
			}
			var args bytes.Buffer
			_ = json.Compact(&args, input) // valid, checked above
			calls = append(calls, toolCall{ID: b.ID, Type: "function", Function: toolFunction{Name: b.Name, Arguments: args.String()}})
		case "thinking", "redacted_thinking":
		default:
			return nil, invalidMessages(at+".type", "content blocks of type %q are not supported by this gateway", b.Type)
		}
	}
	msg := schemas.Message{Role: schemas.MessageAssistant}
	if len(parts) > 0 {
		msg.Content = mustJSON(parts)
	}
	if len(calls) > 0 {
		msg.ToolCalls = mustJSON(calls)
	}
	if msg.Content == nil && msg.ToolCalls == nil {
		msg.Content = schemas.TextContent("") // a turn of thinking alone
	}
	return []schemas.Message{msg}, nil
}

// toolCall is an OpenAI tool call, as the canonical request and the
// dispatcher's Response carry them.
type toolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// openAITools turns custom Messages tools into OpenAI function tools.
// Anthropic's server and client tools (web search, bash, ...) run on
// Anthropic's side and have no equivalent on other routes.
func openAITools(raw json.RawMessage) (json.RawMessage, *frontdoor.Failure) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	var tools []struct {
		Type        string          `json:"type"`
		Name        string          `json:"name"`
		Description string          `json:"description"`
		InputSchema json.RawMessage `json:"input_schema"`
	}
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, invalidMessages("tools", "Input should be a list of tools")
	}
	type function struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters"`
	}
	type tool struct {
		Type     string   `json:"type"`
		Function function `json:"function"`
	}
	out := make([]tool, 0, len(tools))
	for i, t := range tools {
		switch {
		case t.Type != "" && t.Type != "custom":
			return nil, invalidMessages(fmt.Sprintf("tools.%d.type", i), "tools of type %q are not supported by this gateway", t.Type)
		case t.Name == "":
			return nil, invalidMessages(fmt.Sprintf("tools.%d.name", i), "Field required")
		case len(bytes.TrimSpace(t.InputSchema)) == 0 || bytes.TrimSpace(t.InputSchema)[0] != '{':
			return nil, invalidMessages(fmt.Sprintf("tools.%d.input_schema", i), "Input should be an object")
		}
		out = append(out, tool{Type: "function", Function: function{Name: t.Name, Description: t.Description, Parameters: t.InputSchema}})
	}
	return mustJSON(out), nil
}

// openAIToolChoice turns a Messages tool_choice into OpenAI's.
func openAIToolChoice(raw json.RawMessage) (json.RawMessage, *frontdoor.Failure) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	var tc struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal(raw, &tc); err != nil {
		return nil, invalidMessages("tool_choice", "Input should be an object")
	}
	switch tc.Type {
	case "auto", "none":
		return schemas.TextContent(tc.Type), nil
	case "any":
		return schemas.TextContent("required"), nil
	case "tool":
		if tc.Name == "" {
			return nil, invalidMessages("tool_choice.name", "Field required")
		}
		return mustJSON(map[string]any{"type": "function", "function": map[string]string{"name": tc.Name}}), nil
	}
	return nil, invalidMessages("tool_choice.type", "Input should be 'auto', 'any', 'tool' or 'none'")
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
// message_start cannot know the usage yet, so it reports zero tokens;
// message_delta carries the winner's input and output tokens, which
// clients take as the message's cumulative usage.
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
	return s.event("message_start", struct {
		Type    string  `json:"type"`
		Message message `json:"message"`
	}{"message_start", message{ID: s.id, Type: "message", Role: "assistant", Model: s.model, Content: []json.RawMessage{}}})
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
