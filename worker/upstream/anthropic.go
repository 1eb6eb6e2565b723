package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// AnthropicVersion is the anthropic-version header the adapter sends: the
// Messages API version whose shapes it reads.
const AnthropicVersion = "2023-06-01"

// DefaultAnthropicMaxTokens is the max_tokens sent for a request that sets
// no cap, since the Messages API requires one. It is large enough not to cut
// an ordinary answer; budgets reserve by the cohort's output, not by it.
const DefaultAnthropicMaxTokens = 4096

// AnthropicConfig configures the Anthropic Messages adapter of one route.
type AnthropicConfig struct {
	// Config is shared with the OpenAI adapter, except BaseURL's convention:
	// the API root as Anthropic's SDKs take it ("https://api.anthropic.com"),
	// to which the adapter appends "/v1/messages"; a root that already ends
	// in "/v1", as OpenAI-style routes are written, gets "/messages" only.
	// APIKey is sent as x-api-key.
	Config
	// MaxTokens is the max_tokens sent when the request sets none; 0 means
	// DefaultAnthropicMaxTokens.
	MaxTokens int
}

// Anthropic is the Upstream of an Anthropic Messages endpoint. It is safe
// for concurrent use.
type Anthropic struct {
	endpoint  string
	model     string
	key       string
	maxTokens int
	client    *http.Client
	now       func() time.Time
	stall     time.Duration // 0: no stall bound
}

var _ Upstream = (*Anthropic)(nil)

// NewAnthropic returns an adapter for the route cfg describes.
func NewAnthropic(cfg AnthropicConfig) (*Anthropic, error) {
	u, err := parseBaseURL(cfg.BaseURL)
	if err != nil {
		return nil, fmt.Errorf("anthropic adapter: %w", err)
	}
	if cfg.MaxTokens < 0 {
		return nil, fmt.Errorf("anthropic adapter: default max_tokens %d is negative", cfg.MaxTokens)
	}
	root := strings.TrimSuffix(cfg.BaseURL, "/")
	endpoint := root + "/v1/messages"
	if strings.HasSuffix(strings.TrimSuffix(u.Path, "/"), "/v1") {
		endpoint = root + "/messages"
	}
	maxTokens := cfg.MaxTokens
	if maxTokens == 0 {
		maxTokens = DefaultAnthropicMaxTokens
	}
	return &Anthropic{
		endpoint:  endpoint,
		model:     cfg.Model,
		key:       cfg.APIKey,
		maxTokens: maxTokens,
		client:    cfg.httpClient(),
		now:       cfg.clock(),
		stall:     cfg.stallAfter(),
	}, nil
}

// CloseIdleConnections closes the adapter's idle provider connections, for
// a worker shutting down.
func (a *Anthropic) CloseIdleConnections() { a.client.CloseIdleConnections() }

// Stream implements Upstream with one streaming POST to the Messages
// endpoint. As with the OpenAI adapter, the request is sent once and the
// provider is always streamed from, whatever the caller asked for.
func (a *Anthropic) Stream(ctx context.Context, req *schemas.ChatRequest, sink Sink) (Outcome, error) {
	if sink == nil {
		sink = discard{}
	}
	if err := ctx.Err(); err != nil {
		return Outcome{}, transportError(ctx, err) // nothing was sent
	}
	body, err := a.requestBody(req)
	if err != nil {
		return Outcome{}, unencodable(err)
	}
	// As in the OpenAI adapter: a stream held open after message_stop can be
	// cut without failing the attempt.
	ps, inputEstimate, out, err := openStream(ctx, a.client, a.endpoint, body, a.now, func(h http.Header) {
		h.Set("Anthropic-Version", AnthropicVersion)
		if a.key != "" {
			h.Set("X-Api-Key", a.key)
		}
	})
	if err != nil {
		return out, err
	}
	defer ps.close()
	ps.stallAfter = stallBound(ctx, a.stall)

	return readEvents(ctx, ps, newMessageStream(sink, inputEstimate), a.now, "a stop reason")
}

// FinishReason maps a Messages stop_reason to the canonical finish reason
// the arbiter and the OpenAI front door read. A reason without a canonical
// equivalent (pause_turn) is passed on as is, which the arbiter treats as
// incomplete.
func FinishReason(stopReason string) string {
	switch stopReason {
	case "end_turn", "stop_sequence":
		return "stop"
	case "max_tokens", "model_context_window_exceeded":
		return "length"
	case "tool_use":
		return "tool_calls"
	case "refusal":
		return "content_filter"
	}
	return stopReason
}

// messagesEvent is the part of a Messages stream event the adapter reads.
// Its type is in the data as well as in the SSE event name; the data's is
// used, as the SDKs do.
type messagesEvent struct {
	Type    string `json:"type"`
	Index   int    `json:"index"`
	Message *struct {
		Usage messagesUsage `json:"usage"`
	} `json:"message"`
	ContentBlock *messagesBlock `json:"content_block"`
	Delta        *struct {
		Type        string  `json:"type"`
		Text        string  `json:"text"`
		PartialJSON string  `json:"partial_json"`
		Thinking    string  `json:"thinking"`
		StopReason  *string `json:"stop_reason"`
	} `json:"delta"`
	Usage *messagesUsage  `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// messagesBlock is a content_block_start's block: what it says of the block
// before its deltas.
type messagesBlock struct {
	Type     string          `json:"type"`
	Text     string          `json:"text"`
	ID       string          `json:"id"`
	Name     string          `json:"name"`
	Input    json.RawMessage `json:"input"`
	Thinking string          `json:"thinking"`
	Data     string          `json:"data"` // a redacted_thinking block's
}

// messagesUsage is a Messages usage object. Every count is cumulative for
// the message; absent counts are nil.
type messagesUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
}

// input returns the input units the usage reports: uncached, cache-written
// and cache-read tokens together, all of which the provider bills.
func (u messagesUsage) input() (int64, bool) {
	if u.InputTokens == nil {
		return 0, false
	}
	n := *u.InputTokens
	for _, c := range []*int64{u.CacheCreationInputTokens, u.CacheReadInputTokens} {
		if c != nil {
			n += *c
		}
	}
	return n, true
}

// messageStream folds a Messages event stream into an Outcome. Text and
// tool calls go through the OpenAI adapter's accumulator, in OpenAI's delta
// shape, so both adapters hand the worker the same Delta and Outcome.
type messageStream struct {
	acc *accumulator

	inputTokens  int64 // reported input units
	sawInput     bool
	outputTokens int64 // latest cumulative output_tokens
	finalUsage   bool  // a message_delta reported the message's usage

	tools    map[int]int  // content block index → tool-call index
	toolArgs map[int]bool // tool-call index → argument text arrived
	stopped  bool         // message_stop arrived
}

func newMessageStream(sink Sink, inputEstimate int64) *messageStream {
	return &messageStream{acc: newAccumulator(sink, inputEstimate), tools: map[int]int{}, toolArgs: map[int]bool{}}
}

// event folds one event. It returns the data of an error event, or an error
// if the data is not a Messages event.
func (s *messageStream) event(typ, data []byte) (json.RawMessage, error) {
	var e messagesEvent
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, fmt.Errorf("decode %s event: %w", typ, err)
	}
	if e.Type == "" {
		e.Type = string(typ)
	}
	switch e.Type {
	case "error":
		return bytes.Clone(data), nil
	case "message_start":
		if e.Message == nil {
			return nil, errors.New("message_start without a message")
		}
		s.usage(e.Message.Usage)
	case "content_block_start":
		if e.ContentBlock == nil {
			return nil, errors.New("content_block_start without a content block")
		}
		return nil, s.blockStart(e.Index, e.ContentBlock)
	case "content_block_delta":
		if e.Delta == nil {
			return nil, errors.New("content_block_delta without a delta")
		}
		return nil, s.blockDelta(e.Index, e.Delta.Type, e.Delta.Text, e.Delta.PartialJSON, e.Delta.Thinking)
	case "content_block_stop":
		return nil, s.blockStop(e.Index)
	case "message_delta":
		if e.Delta != nil && e.Delta.StopReason != nil && *e.Delta.StopReason != "" {
			s.acc.finish = FinishReason(*e.Delta.StopReason)
		}
		if e.Usage != nil {
			s.usage(*e.Usage)
			s.finalUsage = s.finalUsage || e.Usage.OutputTokens != nil
		}
	case "message_stop":
		s.acc.done = true
		s.stopped = true
	}
	// ping, and event types added to the API later, carry nothing to read.
	return nil, nil
}

// ended reports that message_stop arrived.
func (s *messageStream) ended() bool { return s.stopped }

func (s *messageStream) usage(u messagesUsage) {
	if n, ok := u.input(); ok {
		s.inputTokens, s.sawInput = n, true
	}
	if u.OutputTokens != nil {
		s.outputTokens = *u.OutputTokens
	}
}

// blockStart opens a content block: text is delivered as it comes, a
// tool_use becomes the first fragment of an OpenAI tool call; thinking and
// server-side blocks are not part of the answer. A tool call, a server
// tool's call and thinking that arrives whole are the model's output, so
// their start is a first token; an empty text or thinking block's start
// is not.
func (s *messageStream) blockStart(index int, b *messagesBlock) error {
	switch b.Type {
	case "text":
		s.text(b.Text)
	case "tool_use":
		n := len(s.tools)
		s.tools[index] = n
		args := ""
		if in := bytes.TrimSpace(b.Input); len(in) > 0 && !bytes.Equal(in, []byte("{}")) && !isNull(in) {
			args = string(in) // a block sent whole rather than streamed
			s.toolArgs[n] = true
		}
		return s.toolFragment(toolCallFragment{Index: n, ID: b.ID, Type: "function",
			Function: toolCallFunctionFragment{Name: b.Name, Arguments: args}})
	case "server_tool_use":
		s.acc.firstToken()
	case "thinking":
		if b.Thinking != "" {
			s.acc.firstToken()
		}
	case "redacted_thinking":
		if b.Data != "" {
			s.acc.firstToken()
		}
	}
	return nil
}

func (s *messageStream) blockDelta(index int, typ, text, partialJSON, thinking string) error {
	switch typ {
	case "text_delta":
		s.text(text)
	case "input_json_delta":
		n, ok := s.tools[index]
		if !ok {
			return fmt.Errorf("input_json_delta for content block %d, which is no tool_use", index)
		}
		if partialJSON == "" {
			return nil // not output; the block's start was
		}
		s.toolArgs[n] = true
		return s.toolFragment(toolCallFragment{Index: n, Function: toolCallFunctionFragment{Arguments: partialJSON}})
	case "thinking_delta":
		if thinking != "" {
			s.acc.firstToken()
			s.acc.tokens++ // billed output, never delivered
		}
	}
	return nil
}

// blockStop completes a tool call that streamed no arguments with "{}", so
// that its arguments are a JSON object as OpenAI's always are.
func (s *messageStream) blockStop(index int) error {
	n, ok := s.tools[index]
	if !ok || s.toolArgs[n] {
		return nil
	}
	s.toolArgs[n] = true
	raw, err := json.Marshal([]toolCallFragment{{Index: n, Function: toolCallFunctionFragment{Arguments: "{}"}}})
	if err != nil {
		return fmt.Errorf("encode tool-call fragment: %w", err)
	}
	// Part of the call already counted; not a token of its own.
	if _, err := s.acc.mergeToolCalls(raw); err != nil {
		return err
	}
	s.acc.sink.Delta(Delta{ToolCalls: raw})
	return nil
}

func (s *messageStream) text(t string) {
	if t == "" {
		return
	}
	s.acc.firstToken()
	s.acc.content.WriteString(t)
	s.acc.tokens++
	s.acc.sink.Delta(Delta{Content: t, Tokens: 1})
}

// toolCallFragment is a tool-call delta in OpenAI's streaming shape: the
// first fragment of a call names it, later ones add argument text.
type toolCallFragment struct {
	Index    int                      `json:"index"`
	ID       string                   `json:"id,omitempty"`
	Type     string                   `json:"type,omitempty"`
	Function toolCallFunctionFragment `json:"function"`
}

type toolCallFunctionFragment struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

func (s *messageStream) toolFragment(f toolCallFragment) error {
	raw, err := json.Marshal([]toolCallFragment{f})
	if err != nil {
		return fmt.Errorf("encode tool-call fragment: %w", err)
	}
	if _, err := s.acc.mergeToolCalls(raw); err != nil {
		return err
	}
	s.acc.firstToken()
	s.acc.tokens++
	s.acc.sink.Delta(Delta{ToolCalls: raw, Tokens: 1})
	return nil
}

// outcome is the attempt's result so far. Usage is the provider's when a
// message_delta reported it; otherwise it is estimated from what was
// reported or counted, never less than either.
func (s *messageStream) progress() int64 { return s.acc.progress() }

func (s *messageStream) outcome() Outcome {
	out := s.acc.outcome()
	switch {
	case s.finalUsage && s.sawInput:
		out.Usage = schemas.Usage{InputUnits: s.inputTokens, OutputUnits: s.outputTokens}
	default:
		out.Usage = schemas.Usage{InputUnits: s.acc.inputEstimate, OutputUnits: max(s.outputTokens, s.acc.tokens), Estimated: true}
		if s.sawInput {
			out.Usage.InputUnits = s.inputTokens
		}
	}
	return out
}

// messagesRequest is the Messages request body.
type messagesRequest struct {
	Model         string            `json:"model"`
	MaxTokens     int               `json:"max_tokens"`
	System        json.RawMessage   `json:"system,omitempty"`
	Messages      []messagesMessage `json:"messages"`
	StopSequences []string          `json:"stop_sequences,omitempty"`
	Temperature   *float64          `json:"temperature,omitempty"`
	TopP          *float64          `json:"top_p,omitempty"`
	Tools         []messagesTool    `json:"tools,omitempty"`
	ToolChoice    json.RawMessage   `json:"tool_choice,omitempty"`
	Stream        bool              `json:"stream"`
}

type messagesMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type messagesTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// Content blocks of a Messages request.
type (
	textBlock struct {
		Type string `json:"type"` // "text"
		Text string `json:"text"`
	}
	imageBlock struct {
		Type   string      `json:"type"` // "image"
		Source imageSource `json:"source"`
	}
	imageSource struct {
		Type      string `json:"type"` // "base64" or "url"
		MediaType string `json:"media_type,omitempty"`
		Data      string `json:"data,omitempty"`
		URL       string `json:"url,omitempty"`
	}
	toolUseBlock struct {
		Type  string          `json:"type"` // "tool_use"
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	}
	toolResultBlock struct {
		Type      string          `json:"type"` // "tool_result"
		ToolUseID string          `json:"tool_use_id"`
		Content   json.RawMessage `json:"content"`
	}
)

// requestBody translates the canonical request into a Messages request:
// system and developer messages become the system prompt; tool messages
// become user messages carrying tool_result blocks; assistant tool calls
// become tool_use blocks; OpenAI image parts become image blocks; tools and
// tool_choice take Anthropic's shapes, parallel_tool_calls false becomes
// tool_choice.disable_parallel_tool_use. A request without max_tokens gets
// the adapter's default. The caller's other members follow as sent when the
// caller spoke Messages, translated from an OpenAI caller's otherwise
// (schemas.ChatRequest.ForDialect: user becomes metadata.user_id). What the
// Messages API has no equivalent for (presence and frequency penalties,
// seed, a JSON response_format, logit_bias, ...) is refused, and so are parts
// it cannot carry: dropping them would change the question.
func (a *Anthropic) requestBody(req *schemas.ChatRequest) ([]byte, error) {
	if req == nil {
		return nil, errors.New("no request")
	}
	extra, err := req.ForDialect(schemas.DialectAnthropic)
	if err != nil {
		return nil, err
	}
	model := a.model
	if model == "" {
		model = req.Model
	}
	system, msgs, err := messagesOf(req.Messages)
	if err != nil {
		return nil, err
	}
	body := messagesRequest{
		Model:         model,
		MaxTokens:     req.MaxTokens,
		System:        system,
		Messages:      msgs,
		StopSequences: req.Stop,
		Temperature:   req.Temperature,
		TopP:          req.TopP,
		Stream:        true,
	}
	if body.MaxTokens == 0 {
		body.MaxTokens = a.maxTokens
	}
	if body.Tools, err = toolsOf(req.Tools); err != nil {
		return nil, err
	}
	if len(body.Tools) > 0 {
		disableParallel := req.ParallelToolCalls != nil && !*req.ParallelToolCalls
		if body.ToolChoice, err = toolChoiceOf(req.ToolChoice, disableParallel); err != nil {
			return nil, err
		}
	}
	out, err := marshalNoEscape(body)
	if err != nil {
		return nil, fmt.Errorf("encode messages request: %w", err)
	}
	return withMembers(out, extra)
}

// messagesOf splits the conversation into the system prompt and the
// Messages turns. One system message with string content is sent as a
// string; anything else as text blocks, in order.
func messagesOf(in []schemas.Message) (json.RawMessage, []messagesMessage, error) {
	var (
		systemParts []textBlock
		systemRaw   json.RawMessage
		systemCount int
		out         = make([]messagesMessage, 0, len(in))
	)
	for i, m := range in {
		var (
			msg messagesMessage
			err error
		)
		switch m.Role {
		case schemas.MessageSystem, schemas.MessageDeveloper:
			parts, perr := m.Parts()
			if perr != nil {
				return nil, nil, fmt.Errorf("messages[%d]: %w", i, perr)
			}
			for _, p := range parts {
				if p.Type != "text" {
					return nil, nil, fmt.Errorf("messages[%d]: a system prompt carries only text, not %q", i, p.Type)
				}
				systemParts = append(systemParts, textBlock{Type: "text", Text: p.Text})
			}
			systemCount++
			systemRaw = m.Content
			continue
		case schemas.MessageUser:
			msg, err = userMessage(m)
		case schemas.MessageAssistant:
			msg, err = assistantMessage(m)
		case schemas.MessageTool:
			msg, err = toolResultMessage(m)
		default:
			err = fmt.Errorf("unknown role %q", m.Role)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		out = append(out, msg)
	}
	if systemCount == 0 {
		return nil, out, nil
	}
	if t := bytes.TrimSpace(systemRaw); systemCount == 1 && len(t) > 0 && t[0] == '"' {
		return t, out, nil
	}
	raw, err := marshalNoEscape(systemParts)
	if err != nil {
		return nil, nil, fmt.Errorf("encode system prompt: %w", err)
	}
	return raw, out, nil
}

// userMessage keeps string content as it is and turns parts into blocks.
func userMessage(m schemas.Message) (messagesMessage, error) {
	if t := bytes.TrimSpace(m.Content); len(t) > 0 && t[0] == '"' {
		return messagesMessage{Role: "user", Content: t}, nil
	}
	parts, err := m.Parts()
	if err != nil {
		return messagesMessage{}, err
	}
	blocks := make([]any, 0, len(parts))
	for _, p := range parts {
		b, err := partBlock(p)
		if err != nil {
			return messagesMessage{}, err
		}
		blocks = append(blocks, b)
	}
	return blocksMessage("user", blocks)
}

// partBlock translates one OpenAI content part.
func partBlock(p schemas.ContentPart) (any, error) {
	switch p.Type {
	case "text":
		return textBlock{Type: "text", Text: p.Text}, nil
	case "image_url":
		var img struct {
			ImageURL struct {
				URL string `json:"url"`
			} `json:"image_url"`
		}
		if err := json.Unmarshal(p.Raw, &img); err != nil || img.ImageURL.URL == "" {
			return nil, errors.New("image_url part without a url")
		}
		return imageBlockOf(img.ImageURL.URL)
	}
	return nil, fmt.Errorf("content part %q has no Messages equivalent", p.Type)
}

// imageBlockOf turns an image URL, or a base64 data URL, into an image block.
func imageBlockOf(u string) (imageBlock, error) {
	if rest, ok := strings.CutPrefix(u, "data:"); ok {
		meta, data, ok := strings.Cut(rest, ",")
		mediaType, enc, _ := strings.Cut(meta, ";")
		if !ok || enc != "base64" || mediaType == "" {
			return imageBlock{}, errors.New("image data URL must be data:<media type>;base64,<data>")
		}
		return imageBlock{Type: "image", Source: imageSource{Type: "base64", MediaType: mediaType, Data: data}}, nil
	}
	if !strings.HasPrefix(u, "https://") && !strings.HasPrefix(u, "http://") {
		return imageBlock{}, errors.New("image url must be http(s) or a base64 data URL")
	}
	return imageBlock{Type: "image", Source: imageSource{Type: "url", URL: u}}, nil
}

// assistantMessage keeps plain string content as it is; text (and refusal)
// parts and tool calls become text and tool_use blocks.
func assistantMessage(m schemas.Message) (messagesMessage, error) {
	hasCalls := len(dropNull(m.ToolCalls)) > 0
	if t := bytes.TrimSpace(m.Content); !hasCalls && len(t) > 0 && t[0] == '"' {
		return messagesMessage{Role: "assistant", Content: t}, nil
	}
	parts, err := m.Parts()
	if err != nil {
		return messagesMessage{}, err
	}
	var blocks []any
	for _, p := range parts {
		text := p.Text
		switch p.Type {
		case "text":
		case "refusal":
			var r struct {
				Refusal string `json:"refusal"`
			}
			if err := json.Unmarshal(p.Raw, &r); err != nil {
				return messagesMessage{}, fmt.Errorf("refusal part: %w", err)
			}
			text = r.Refusal
		default:
			return messagesMessage{}, fmt.Errorf("assistant content part %q has no Messages equivalent", p.Type)
		}
		if text != "" { // the API refuses empty text blocks
			blocks = append(blocks, textBlock{Type: "text", Text: text})
		}
	}
	if hasCalls {
		var calls []toolCall
		if err := json.Unmarshal(m.ToolCalls, &calls); err != nil {
			return messagesMessage{}, fmt.Errorf("tool_calls: %w", err)
		}
		for j, c := range calls {
			input := json.RawMessage(c.Function.Arguments)
			if strings.TrimSpace(c.Function.Arguments) == "" {
				input = json.RawMessage("{}")
			}
			if !json.Valid(input) || bytes.TrimSpace(input)[0] != '{' {
				return messagesMessage{}, fmt.Errorf("tool_calls[%d]: arguments must be a JSON object", j)
			}
			blocks = append(blocks, toolUseBlock{Type: "tool_use", ID: c.ID, Name: c.Function.Name, Input: input})
		}
	}
	return blocksMessage("assistant", blocks)
}

// toolResultMessage turns a tool message into a user turn holding its
// result; consecutive ones are combined into one turn by the API.
func toolResultMessage(m schemas.Message) (messagesMessage, error) {
	content := bytes.TrimSpace(m.Content)
	if len(content) == 0 || content[0] != '"' {
		parts, err := m.Parts()
		if err != nil {
			return messagesMessage{}, err
		}
		blocks := make([]textBlock, 0, len(parts))
		for _, p := range parts {
			if p.Type != "text" {
				return messagesMessage{}, fmt.Errorf("tool result part %q has no Messages equivalent", p.Type)
			}
			blocks = append(blocks, textBlock{Type: "text", Text: p.Text})
		}
		raw, err := marshalNoEscape(blocks)
		if err != nil {
			return messagesMessage{}, err
		}
		content = raw
	}
	return blocksMessage("user", []any{toolResultBlock{Type: "tool_result", ToolUseID: m.ToolCallID, Content: content}})
}

func blocksMessage(role string, blocks []any) (messagesMessage, error) {
	if blocks == nil {
		blocks = []any{}
	}
	raw, err := marshalNoEscape(blocks)
	if err != nil {
		return messagesMessage{}, fmt.Errorf("encode %s content: %w", role, err)
	}
	return messagesMessage{Role: role, Content: raw}, nil
}

// toolsOf translates OpenAI function tools. A function without parameters
// takes none, which the Messages API spells as an empty object schema.
func toolsOf(raw json.RawMessage) ([]messagesTool, error) {
	if dropNull(raw) == nil {
		return nil, nil
	}
	var tools []struct {
		Type     string `json:"type"`
		Function struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, fmt.Errorf("tools: %w", err)
	}
	out := make([]messagesTool, 0, len(tools))
	for i, t := range tools {
		if t.Type != "function" || t.Function.Name == "" {
			return nil, fmt.Errorf("tools[%d]: only named function tools have a Messages equivalent", i)
		}
		schema := dropNull(t.Function.Parameters)
		if schema == nil {
			schema = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		out = append(out, messagesTool{Name: t.Function.Name, Description: t.Function.Description, InputSchema: schema})
	}
	return out, nil
}

// toolChoiceOf translates an OpenAI tool_choice: "auto", "none",
// "required" (Anthropic's "any") or one named function ("tool"). With
// disableParallel (parallel_tool_calls false) the choice carries
// disable_parallel_tool_use, an absent choice becoming "auto"; "none" calls
// no tool, so it needs none.
func toolChoiceOf(raw json.RawMessage, disableParallel bool) (json.RawMessage, error) {
	type choice struct {
		Type            string `json:"type"`
		Name            string `json:"name,omitempty"`
		DisableParallel bool   `json:"disable_parallel_tool_use,omitempty"`
	}
	raw = dropNull(raw)
	if raw == nil {
		if !disableParallel {
			return nil, nil
		}
		raw = json.RawMessage(`"auto"`)
	}
	var c choice
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "auto", "none":
			c.Type = s
		case "required":
			c.Type = "any"
		default:
			return nil, fmt.Errorf("tool_choice %q has no Messages equivalent", s)
		}
	} else {
		var obj struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if err := json.Unmarshal(raw, &obj); err != nil || obj.Type != "function" || obj.Function.Name == "" {
			return nil, errors.New("tool_choice object must name a function")
		}
		c = choice{Type: "tool", Name: obj.Function.Name}
	}
	c.DisableParallel = disableParallel && c.Type != "none"
	return marshalNoEscape(c)
}

// marshalNoEscape encodes v without HTML escaping, so text reaches the
// provider as the caller wrote it.
func marshalNoEscape(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

func isNull(raw []byte) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }
