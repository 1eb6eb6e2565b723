package upstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/hedgerow/hedgerow/schemas"
)

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
	body, extra, err := a.messagesRequest(req)
	if err != nil {
		return nil, err
	}
	return encodeMessages(body, extra)
}

// messagesRequest is requestBody before its encoding: the typed body and
// the caller's other members, which the caller must not modify.
func (a *Anthropic) messagesRequest(req *schemas.ChatRequest) (messagesRequest, map[string]json.RawMessage, error) {
	extra, model, err := a.translate(req, schemas.DialectAnthropic)
	if err != nil {
		return messagesRequest{}, nil, err
	}
	system, msgs, err := messagesOf(req.Messages)
	if err != nil {
		return messagesRequest{}, nil, err
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
		return messagesRequest{}, nil, err
	}
	if len(body.Tools) > 0 {
		disableParallel := req.ParallelToolCalls != nil && !*req.ParallelToolCalls
		if body.ToolChoice, err = toolChoiceOf(req.ToolChoice, disableParallel); err != nil {
			return messagesRequest{}, nil, err
		}
	}
	return body, extra, nil
}

// encodeMessages encodes a Messages body with the members beyond its
// typed fields.
func encodeMessages(body messagesRequest, extra map[string]json.RawMessage) ([]byte, error) {
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
