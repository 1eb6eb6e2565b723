package httpdoor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/schemas"
)

// This file reads an Anthropic Messages request into the canonical request,
// member by member.

// parseMessagesRequest reads a Messages request into the canonical request.
// The system prompt becomes a leading system message; tool_result blocks
// become tool messages ahead of the rest of their user turn; tool_use blocks
// become the assistant's tool calls; images become image_url parts; tools
// and tool_choice take the OpenAI shapes the canonical request keeps
// (disable_parallel_tool_use as parallel_tool_calls). Every other member
// (top_k, metadata, thinking, service_tier, members hedgerow does not
// know) is carried as sent in the request's Extra, in the Anthropic
// dialect: an Anthropic route receives it unchanged, an OpenAI route
// translated or not at all (docs/architecture.md §8). Thinking blocks of
// earlier turns are dropped (no route could read them back); content the
// canonical request cannot carry (documents, server tools) is refused
// rather than dropped.
func parseMessagesRequest(body []byte) (string, schemas.ChatRequest, *frontdoor.Failure) {
	var req schemas.ChatRequest
	var (
		pool          string
		maxTokens     *int
		messages      []turn
		system, tools json.RawMessage
		toolChoice    json.RawMessage
		stop          []string
	)
	members := []member{
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
	}
	fields, f := readMembers(body, members, func(m member) *frontdoor.Failure {
		return invalidMessages(m.name, "Input should be %s", m.want)
	})
	switch {
	case f != nil:
		return "", req, f
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
	req.Dialect, req.Extra = schemas.DialectAnthropic, unread(fields, members)
	if req.Messages, f = canonicalMessages(system, messages); f != nil {
		return "", req, f
	}
	if req.Tools, f = openAITools(tools); f != nil {
		return "", req, f
	}
	if req.ToolChoice, req.ParallelToolCalls, f = openAIToolChoice(toolChoice); f != nil {
		return "", req, f
	}
	if err := req.Validate(); err != nil {
		return "", req, invalidRequest(err)
	}
	return pool, req, nil
}

// turn is one member of a Messages request's messages.
type turn struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// canonicalMessages is the conversation of a Messages request as the
// canonical request carries it: the system prompt first, then each turn.
func canonicalMessages(system json.RawMessage, turns []turn) ([]schemas.Message, *frontdoor.Failure) {
	var out []schemas.Message
	sys, f := systemMessage(system)
	if f != nil {
		return nil, f
	}
	if sys != nil {
		out = append(out, *sys)
	}
	for i, m := range turns {
		field := fmt.Sprintf("messages.%d", i)
		if m.Role != "user" && m.Role != "assistant" {
			return nil, invalidMessages(field+".role", "Input should be 'user' or 'assistant'")
		}
		// String content is one message of the turn's role, as sent.
		if content := bytes.TrimSpace(m.Content); len(content) > 0 && content[0] == '"' {
			out = append(out, schemas.Message{Role: schemas.MessageRole(m.Role), Content: content})
			continue
		}
		blocks, f := blocksOf(field+".content", m.Content)
		if f != nil {
			return nil, f
		}
		var msgs []schemas.Message
		if m.Role == "user" {
			msgs, f = userTurn(field, blocks)
		} else {
			msgs, f = assistantTurn(field, blocks)
		}
		if f != nil {
			return nil, f
		}
		out = append(out, msgs...)
	}
	return out, nil
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

// systemMessage is the system prompt as one system message.
func systemMessage(raw json.RawMessage) (*schemas.Message, *frontdoor.Failure) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	content, f := textOnly("system", raw, "the system prompt takes only text blocks")
	if f != nil {
		return nil, f
	}
	return &schemas.Message{Role: schemas.MessageSystem, Content: content}, nil
}

// textOnly is content that may hold only text, as the chat API carries it:
// a string stays a string, text blocks become text parts. Any other block
// is refused with why.
func textOnly(field string, raw json.RawMessage, why string) (json.RawMessage, *frontdoor.Failure) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		return raw, nil
	}
	blocks, f := blocksOf(field, raw)
	if f != nil {
		return nil, f
	}
	parts := make([]textPart, 0, len(blocks))
	for j, b := range blocks {
		if b.Type != "text" {
			return nil, invalidMessages(fmt.Sprintf("%s.%d.type", field, j), "%s", why)
		}
		parts = append(parts, textPart{Type: "text", Text: *b.Text})
	}
	return mustJSON(parts), nil
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

// userTurn is the blocks of one user turn: its tool results as tool
// messages, then its text and images as one user message (if it has any).
func userTurn(field string, blocks []contentBlock) ([]schemas.Message, *frontdoor.Failure) {
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
			return nil, invalidMessages(at+".type", "content blocks of type %q are not supported by this gateway", clip(b.Type))
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
	if content := bytes.TrimSpace(b.Content); len(content) == 0 || isJSONNull(content) {
		msg.Content = schemas.TextContent("")
		return msg, nil
	}
	var f *frontdoor.Failure
	msg.Content, f = textOnly(field+".content", b.Content, "tool results carry only text here")
	return msg, f
}

// assistantTurn is the blocks of one assistant turn: text as content,
// tool_use blocks as tool calls; thinking of earlier turns is dropped.
func assistantTurn(field string, blocks []contentBlock) ([]schemas.Message, *frontdoor.Failure) {
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
			return nil, invalidMessages(at+".type", "content blocks of type %q are not supported by this gateway", clip(b.Type))
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
			return nil, invalidMessages(fmt.Sprintf("tools.%d.type", i), "tools of type %q are not supported by this gateway", clip(t.Type))
		case t.Name == "":
			return nil, invalidMessages(fmt.Sprintf("tools.%d.name", i), "Field required")
		case len(bytes.TrimSpace(t.InputSchema)) == 0 || bytes.TrimSpace(t.InputSchema)[0] != '{':
			return nil, invalidMessages(fmt.Sprintf("tools.%d.input_schema", i), "Input should be an object")
		}
		out = append(out, tool{Type: "function", Function: function{Name: t.Name, Description: t.Description, Parameters: t.InputSchema}})
	}
	return mustJSON(out), nil
}

// openAIToolChoice turns a Messages tool_choice into OpenAI's, and its
// disable_parallel_tool_use into parallel_tool_calls (nil when not set).
func openAIToolChoice(raw json.RawMessage) (json.RawMessage, *bool, *frontdoor.Failure) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil, nil
	}
	var tc struct {
		Type            string `json:"type"`
		Name            string `json:"name"`
		DisableParallel *bool  `json:"disable_parallel_tool_use"`
	}
	if err := json.Unmarshal(raw, &tc); err != nil {
		return nil, nil, invalidMessages("tool_choice", "Input should be an object")
	}
	var parallel *bool
	if tc.DisableParallel != nil {
		parallel = new(!*tc.DisableParallel)
	}
	switch tc.Type {
	case "auto", "none":
		return schemas.TextContent(tc.Type), parallel, nil
	case "any":
		return schemas.TextContent("required"), parallel, nil
	case "tool":
		if tc.Name == "" {
			return nil, nil, invalidMessages("tool_choice.name", "Field required")
		}
		return mustJSON(map[string]any{"type": "function", "function": map[string]string{"name": tc.Name}}), parallel, nil
	}
	return nil, nil, invalidMessages("tool_choice.type", "Input should be 'auto', 'any', 'tool' or 'none'")
}
