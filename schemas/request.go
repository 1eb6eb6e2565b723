package schemas

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// MessageRole is the author of one message of a conversation.
type MessageRole string

// The message roles of the OpenAI chat shape; adapters map them to their
// provider's (Anthropic takes system and developer text as its system prompt).
const (
	MessageSystem    MessageRole = "system"
	MessageDeveloper MessageRole = "developer"
	MessageUser      MessageRole = "user"
	MessageAssistant MessageRole = "assistant"
	MessageTool      MessageRole = "tool"
)

// ChatRequest is the provider-neutral canonical request: what the caller
// asked for, independent of the route that will serve it. Front doors build
// it from the caller's body; worker adapters build the provider's request
// from it. Workers always stream from the provider; Stream says only
// whether the caller receives a stream.
//
// The typed fields are the members hedgerow reads itself (messages, the
// output cap the budgets and the cohort use, stream, tools, the
// response_format the contract compiles) or translates between dialects
// (sampling parameters, stop, tool_choice, parallel_tool_calls), in the
// OpenAI shape. Fields whose shape differs between providers (tools,
// tool_choice, response_format, tool-call lists) are kept as raw JSON in
// that shape, so the gateway passes them through without a lossy model of
// its own. Every other member the caller sent is carried as sent in Extra,
// in the shape of the caller's Dialect; a route of the same dialect
// receives it unchanged, a route of the other dialect receives it
// translated or the request is refused naming it (ForDialect), never
// dropped. See docs/architecture.md §8, "Request fidelity".
//
// A ChatRequest holds prompts and user identifiers (Extra's "user" and
// "metadata"): it is never logged or recorded, only fingerprinted.
type ChatRequest struct {
	// Model is the user-facing model name the caller asked for; the route
	// decides the upstream model. Optional: the model class may come from
	// the submit request instead.
	Model    string    `json:"model,omitempty"`
	Messages []Message `json:"messages,omitempty"`
	// MaxTokens caps output tokens; 0 means the caller set no cap (budgets
	// then reserve the cohort's P95 output).
	MaxTokens int `json:"max_tokens,omitempty"`
	// MaxTokensField is the member an OpenAI-compatible route receives
	// MaxTokens in: ParamMaxTokens (also when empty) or
	// ParamMaxCompletionTokens, which OpenAI's reasoning models require.
	// The OpenAI door keeps the name the caller used.
	MaxTokensField   string          `json:"max_tokens_field,omitempty"`
	Temperature      *float64        `json:"temperature,omitempty"`
	TopP             *float64        `json:"top_p,omitempty"`
	PresencePenalty  *float64        `json:"presence_penalty,omitempty"`
	FrequencyPenalty *float64        `json:"frequency_penalty,omitempty"`
	Seed             *int64          `json:"seed,omitempty"`
	Stop             []string        `json:"stop,omitempty"`
	Tools            json.RawMessage `json:"tools,omitempty"`           // array of tool definitions
	ToolChoice       json.RawMessage `json:"tool_choice,omitempty"`     // string or object
	ResponseFormat   json.RawMessage `json:"response_format,omitempty"` // object
	// ParallelToolCalls is OpenAI's parallel_tool_calls, Anthropic's
	// tool_choice.disable_parallel_tool_use negated; nil when not set.
	ParallelToolCalls *bool `json:"parallel_tool_calls,omitempty"`
	Stream            bool  `json:"stream,omitempty"`
	// Dialect is the API the caller spoke, which is the shape of Extra;
	// empty means DialectOpenAI.
	Dialect Dialect `json:"dialect,omitempty"`
	// Extra holds the caller's members that have no typed field above,
	// by name, each value exactly as sent: logit_bias, user, metadata,
	// reasoning_effort, top_k, members hedgerow does not know... It never
	// holds a member hedgerow owns (see ReservedParam).
	Extra map[string]json.RawMessage `json:"extra,omitempty"`
	// Embedding, when set, makes this an embeddings request (RequestKind)
	// instead of a chat completion: no messages, never streamed, answered
	// whole with vectors (AttemptResult.Embeddings).
	Embedding *EmbeddingRequest `json:"embedding,omitempty"`
}

// The names under which an OpenAI-compatible route receives the output cap
// (ChatRequest.MaxTokensField).
const (
	ParamMaxTokens           = "max_tokens"
	ParamMaxCompletionTokens = "max_completion_tokens"
)

// OutputCapParam is the member an OpenAI-compatible route receives
// MaxTokens in.
func (r *ChatRequest) OutputCapParam() string {
	if r.MaxTokensField == ParamMaxCompletionTokens {
		return ParamMaxCompletionTokens
	}
	return ParamMaxTokens
}

// Message is one turn of the conversation.
//
// Content is raw JSON holding one of: a string; an array of content parts
// (objects with a "type", e.g. {"type":"text","text":"..."} or image parts,
// passed through as given); or null/absent, allowed only for an assistant
// message that carries tool calls. Use TextContent to build the common case
// and Parts or Text to read it without caring which form was sent.
type Message struct {
	Role       MessageRole     `json:"role"`
	Content    json.RawMessage `json:"content,omitempty"`
	Name       string          `json:"name,omitempty"`
	ToolCalls  json.RawMessage `json:"tool_calls,omitempty"` // array, assistant messages only
	ToolCallID string          `json:"tool_call_id,omitempty"`
}

// ContentPart is one element of a message's content. Raw is the part exactly
// as sent, so adapters can pass through part types they know (images) that
// ContentPart does not model.
type ContentPart struct {
	Type string
	Text string // set for "text" parts
	Raw  json.RawMessage
}

// TextContent encodes s as a message's string content.
func TextContent(s string) json.RawMessage {
	b, _ := json.Marshal(s) // a string always marshals
	return b
}

// Parts returns the message's content as parts: string content becomes one
// text part, absent or null content no parts.
func (m Message) Parts() ([]ContentPart, error) {
	raw := bytes.TrimSpace(m.Content)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("%w: content: %v", ErrMalformedRequest, err)
		}
		return []ContentPart{{Type: "text", Text: s, Raw: raw}}, nil
	case '[':
		var elems []json.RawMessage
		if err := json.Unmarshal(raw, &elems); err != nil {
			return nil, fmt.Errorf("%w: content: %v", ErrMalformedRequest, err)
		}
		parts := make([]ContentPart, 0, len(elems))
		for i, e := range elems {
			var head struct {
				Type string           `json:"type"`
				Text *json.RawMessage `json:"text"`
			}
			if err := json.Unmarshal(e, &head); err != nil {
				return nil, fmt.Errorf("%w: content[%d]: want an object: %v", ErrMalformedRequest, i, err)
			}
			if head.Type == "" {
				return nil, fmt.Errorf("%w: content[%d]: part has no type", ErrMalformedRequest, i)
			}
			p := ContentPart{Type: head.Type, Raw: e}
			if head.Type == "text" {
				if head.Text == nil || json.Unmarshal(*head.Text, &p.Text) != nil {
					return nil, fmt.Errorf("%w: content[%d]: text part needs a string \"text\"", ErrMalformedRequest, i)
				}
			}
			parts = append(parts, p)
		}
		return parts, nil
	}
	return nil, fmt.Errorf("%w: content must be a string, an array of parts or null", ErrMalformedRequest)
}

// Text concatenates the message's text parts, for adapters and estimators
// that need only the text.
func (m Message) Text() (string, error) {
	parts, err := m.Parts()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String(), nil
}

// Validate reports obvious malformation that every route would reject, so
// the gateway can fail the group at once instead of spending attempts on it.
// Errors match ErrMalformedRequest.
func (r ChatRequest) Validate() error {
	if r.Embedding != nil {
		return r.validateEmbedding()
	}
	if len(r.Messages) == 0 {
		return fmt.Errorf("%w: no messages", ErrMalformedRequest)
	}
	if r.MaxTokens < 0 {
		return fmt.Errorf("%w: max_tokens %d is negative", ErrMalformedRequest, r.MaxTokens)
	}
	if err := checkRange("temperature", r.Temperature, 0, 2); err != nil {
		return err
	}
	if err := checkRange("top_p", r.TopP, 0, 1); err != nil {
		return err
	}
	if err := checkRange("presence_penalty", r.PresencePenalty, -2, 2); err != nil {
		return err
	}
	if err := checkRange("frequency_penalty", r.FrequencyPenalty, -2, 2); err != nil {
		return err
	}
	for i, s := range r.Stop {
		if s == "" {
			return fmt.Errorf("%w: stop[%d] is empty", ErrMalformedRequest, i)
		}
	}
	if err := checkRawKind("tools", r.Tools, '['); err != nil {
		return err
	}
	if err := checkRawKind("tool_choice", r.ToolChoice, '"', '{'); err != nil {
		return err
	}
	if err := checkRawKind("response_format", r.ResponseFormat, '{'); err != nil {
		return err
	}
	for i, m := range r.Messages {
		if err := m.validate(); err != nil {
			return fmt.Errorf("messages[%d]: %w", i, err)
		}
	}
	switch r.MaxTokensField {
	case "", ParamMaxTokens, ParamMaxCompletionTokens:
	default:
		return fmt.Errorf("%w: max_tokens_field %q names neither max_tokens nor max_completion_tokens", ErrMalformedRequest, r.MaxTokensField)
	}
	return r.validateExtra()
}

func (m Message) validate() error {
	switch m.Role {
	case MessageSystem, MessageDeveloper, MessageUser, MessageAssistant, MessageTool:
	case "":
		return fmt.Errorf("%w: no role", ErrMalformedRequest)
	default:
		return fmt.Errorf("%w: unknown role %q", ErrMalformedRequest, m.Role)
	}
	if err := checkRawKind("tool_calls", m.ToolCalls, '['); err != nil {
		return err
	}
	hasToolCalls := len(m.ToolCalls) > 0 && !isNull(m.ToolCalls)
	if hasToolCalls && m.Role != MessageAssistant {
		return fmt.Errorf("%w: only assistant messages carry tool_calls", ErrMalformedRequest)
	}
	if m.Role == MessageTool && m.ToolCallID == "" {
		return fmt.Errorf("%w: tool message needs tool_call_id", ErrMalformedRequest)
	}
	if len(m.Content) == 0 || isNull(m.Content) {
		if m.Role == MessageAssistant && hasToolCalls {
			return nil
		}
		return fmt.Errorf("%w: no content", ErrMalformedRequest)
	}
	if _, err := m.Parts(); err != nil {
		return err
	}
	return nil
}

func checkRange(name string, v *float64, lo, hi float64) error {
	if v != nil && !(*v >= lo && *v <= hi) {
		return fmt.Errorf("%w: %s %v outside [%v, %v]", ErrMalformedRequest, name, *v, lo, hi)
	}
	return nil
}

// checkRawKind accepts absent or null raw JSON, or valid JSON whose first
// byte is one of the wanted opening characters.
func checkRawKind(name string, raw json.RawMessage, want ...byte) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || isNull(raw) {
		return nil
	}
	if !json.Valid(raw) || bytes.IndexByte(want, raw[0]) < 0 {
		return fmt.Errorf("%w: %s has the wrong JSON type", ErrMalformedRequest, name)
	}
	return nil
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }
