package httpdoor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/schemas"
)

// This file reads an OpenAI Responses body into the canonical request
// (docs/architecture.md §8): input and instructions become messages,
// max_output_tokens the output cap, function tools and tool_choice the
// chat shapes, text.format the response_format. Every other member is
// carried as sent in Extra, in schemas.DialectResponses, for the worker's
// adapter to translate or refuse.

// parseResponsesRequest reads a Responses body: the model (the pool) and
// the canonical request. A streamed Responses answer always ends with its
// usage, in response.completed.
func parseResponsesRequest(body []byte) (pool string, req schemas.ChatRequest, f *frontdoor.Failure) {
	var (
		input, tools, toolChoice, text json.RawMessage
		instructions                   string
		maxOutputTokens                *int
		streamOptions                  map[string]json.RawMessage
	)
	members := []member{
		{"model", "a string", &pool},
		{"input", "a string or an array of input items", &input},
		{"instructions", "a string", &instructions},
		{"max_output_tokens", "an integer", &maxOutputTokens},
		{"temperature", "a number", &req.Temperature},
		{"top_p", "a number", &req.TopP},
		{"tools", "an array", &tools},
		{"tool_choice", "a string or an object", &toolChoice},
		{"parallel_tool_calls", "a boolean", &req.ParallelToolCalls},
		{"text", "an object", &text},
		{"stream", "a boolean", &req.Stream},
		{"stream_options", "an object", &streamOptions},
	}
	fields, f := readMembers(body, members, openAIWrongType)
	switch {
	case f != nil:
		return "", req, f
	case pool == "":
		return "", req, frontdoor.InvalidParam("model", "You must name a model: one of the pools in GET /v1/models.")
	case maxOutputTokens != nil && *maxOutputTokens < 1:
		return "", req, frontdoor.InvalidParam("max_output_tokens", "'max_output_tokens' must be at least 1.")
	}
	if req.Messages, f = inputMessages(instructions, input); f != nil {
		return "", req, f
	}
	if req.Tools, f = responsesTools(tools); f != nil {
		return "", req, f
	}
	if req.ToolChoice, f = responsesToolChoice(toolChoice); f != nil {
		return "", req, f
	}
	if req.ResponseFormat, f = responsesFormat(text); f != nil {
		return "", req, f
	}
	if maxOutputTokens != nil {
		// OpenAI's reasoning models take only max_completion_tokens.
		req.MaxTokens, req.MaxTokensField = *maxOutputTokens, schemas.ParamMaxCompletionTokens
	}
	req.Model, req.Dialect, req.Extra = pool, schemas.DialectResponses, unread(fields, members)
	if err := req.Validate(); err != nil {
		return "", req, responsesInvalidRequest(err)
	}
	return pool, req, nil
}

// responsesInvalidRequest answers a request Validate refuses, naming the
// Responses member its field came from.
func responsesInvalidRequest(err error) *frontdoor.Failure {
	f := invalidRequest(err)
	switch {
	case strings.HasPrefix(f.Param, "messages"):
		f.Param = "input"
	case f.Param == "max_tokens":
		f.Param = "max_output_tokens"
	case f.Param == "response_format":
		f.Param = "text.format"
	}
	return f
}

// inputItem is one item of a Responses input list, as far as the door reads it.
type inputItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// inputMessages turns instructions and input into chat messages: the
// instructions a leading system message; a string input one user message;
// message items messages of their role; function_call items the tool
// calls of an assistant message (consecutive calls share one, as parallel
// calls do in chat completions); function_call_output items tool messages.
// Other items (reasoning, hosted tool calls, item references) need state a
// chat route does not have and are refused naming them.
func inputMessages(instructions string, input json.RawMessage) ([]schemas.Message, *frontdoor.Failure) {
	var msgs []schemas.Message
	if instructions != "" {
		msgs = append(msgs, schemas.Message{Role: schemas.MessageSystem, Content: schemas.TextContent(instructions)})
	}
	input = bytes.TrimSpace(input)
	switch {
	case len(input) == 0 || isJSONNull(input):
		return nil, frontdoor.InvalidParam("input", "'input' is required: a string or a non-empty array of input items.")
	case input[0] == '"':
		var s string
		if json.Unmarshal(input, &s) != nil || s == "" {
			return nil, frontdoor.InvalidParam("input", "'input' must be a non-empty string or array.")
		}
		return append(msgs, schemas.Message{Role: schemas.MessageUser, Content: schemas.TextContent(s)}), nil
	}
	var items []json.RawMessage
	if json.Unmarshal(input, &items) != nil || len(items) == 0 {
		return nil, frontdoor.InvalidParam("input", "'input' must be a non-empty string or array of input items.")
	}
	for i, raw := range items {
		param := fmt.Sprintf("input[%d]", i)
		var it inputItem
		if json.Unmarshal(raw, &it) != nil {
			return nil, frontdoor.InvalidParam(param, "Each input item must be an object.")
		}
		if it.Type == "" && it.Role != "" {
			it.Type = "message"
		}
		switch it.Type {
		case "message":
			m, f := inputMessage(param, it)
			if f != nil {
				return nil, f
			}
			msgs = append(msgs, m)
		case "function_call":
			if it.CallID == "" || it.Name == "" {
				return nil, frontdoor.InvalidParam(param, "A function_call item needs a call_id and a name.")
			}
			call, _ := json.Marshal([]chatToolCall{{ID: it.CallID, Type: "function",
				Function: chatFunctionCall{Name: it.Name, Arguments: it.Arguments}}}) // strings always marshal
			if n := len(msgs); n > 0 && msgs[n-1].Role == schemas.MessageAssistant && len(msgs[n-1].ToolCalls) > 0 {
				msgs[n-1].ToolCalls = append(msgs[n-1].ToolCalls[:len(msgs[n-1].ToolCalls)-1], append([]byte{','}, call[1:]...)...)
			} else {
				msgs = append(msgs, schemas.Message{Role: schemas.MessageAssistant, ToolCalls: call})
			}
		case "function_call_output":
			out, f := outputText(param+".output", it.Output)
			if f != nil {
				return nil, f
			}
			if it.CallID == "" {
				return nil, frontdoor.InvalidParam(param, "A function_call_output item needs a call_id.")
			}
			msgs = append(msgs, schemas.Message{Role: schemas.MessageTool, ToolCallID: it.CallID, Content: schemas.TextContent(out)})
		default:
			return nil, frontdoor.InvalidParam(param+".type", fmt.Sprintf(
				"Input items of type %q are not supported: only message, function_call and function_call_output items are.", clip(it.Type)))
		}
	}
	return msgs, nil
}

// chatToolCall is one tool call of a chat assistant message.
type chatToolCall struct {
	ID       string           `json:"id"`
	Type     string           `json:"type"`
	Function chatFunctionCall `json:"function"`
}

type chatFunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// inputMessage is a message item as a chat message: input_text and
// output_text parts become text parts, input_image parts with a URL
// image_url parts.
func inputMessage(param string, it inputItem) (schemas.Message, *frontdoor.Failure) {
	role := schemas.MessageRole(it.Role)
	switch role {
	case schemas.MessageUser, schemas.MessageAssistant, schemas.MessageSystem, schemas.MessageDeveloper:
	default:
		return schemas.Message{}, frontdoor.InvalidParam(param+".role", "'role' must be one of user, assistant, system or developer.")
	}
	content := bytes.TrimSpace(it.Content)
	if len(content) > 0 && content[0] == '"' {
		return schemas.Message{Role: role, Content: content}, nil
	}
	var parts []struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		ImageURL string `json:"image_url"`
		Detail   string `json:"detail"`
	}
	if json.Unmarshal(content, &parts) != nil || len(parts) == 0 {
		return schemas.Message{}, frontdoor.InvalidParam(param+".content", "'content' must be a string or a non-empty array of content parts.")
	}
	chat := make([]map[string]any, 0, len(parts))
	for j, p := range parts {
		switch {
		case p.Type == "input_text" || p.Type == "output_text":
			chat = append(chat, map[string]any{"type": "text", "text": p.Text})
		case p.Type == "input_image" && p.ImageURL != "":
			img := map[string]string{"url": p.ImageURL}
			if p.Detail != "" {
				img["detail"] = p.Detail
			}
			chat = append(chat, map[string]any{"type": "image_url", "image_url": img})
		default:
			return schemas.Message{}, frontdoor.InvalidParam(fmt.Sprintf("%s.content[%d]", param, j),
				"Only input_text, output_text and input_image (by image_url) content parts are supported.")
		}
	}
	c, err := json.Marshal(chat)
	if err != nil {
		return schemas.Message{}, frontdoor.InvalidParam(param+".content", "'content' could not be read.")
	}
	return schemas.Message{Role: role, Content: c}, nil
}

// outputText is a function_call_output's output: a string, or the text of
// its input_text parts.
func outputText(param string, raw json.RawMessage) (string, *frontdoor.Failure) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return "", frontdoor.InvalidParam(param, "'output' must be a string or an array of input_text parts.")
	}
	var b strings.Builder
	for j, p := range parts {
		if p.Type != "input_text" {
			return "", frontdoor.InvalidParam(fmt.Sprintf("%s[%d]", param, j), "Only input_text parts of an output are supported.")
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// responsesTools turns Responses function tools ({"type":"function",
// "name",...}) into chat tools ({"type":"function","function":{"name",...}}).
// Hosted tools (web search, file search...) have no chat equivalent.
func responsesTools(raw json.RawMessage) (json.RawMessage, *frontdoor.Failure) {
	if len(raw) == 0 || isJSONNull(raw) {
		return nil, nil
	}
	var tools []map[string]json.RawMessage
	if json.Unmarshal(raw, &tools) != nil {
		return nil, frontdoor.InvalidParam("tools", "Invalid type for 'tools': expected an array of tool objects.")
	}
	chat := make([]map[string]any, 0, len(tools))
	for i, t := range tools {
		var typ string
		_ = json.Unmarshal(t["type"], &typ)
		if typ != "function" {
			return nil, frontdoor.InvalidParam(fmt.Sprintf("tools[%d].type", i), "Only function tools are supported.")
		}
		fn := make(map[string]json.RawMessage, len(t))
		for k, v := range t {
			if k != "type" {
				fn[k] = v
			}
		}
		if _, ok := fn["name"]; !ok {
			return nil, frontdoor.InvalidParam(fmt.Sprintf("tools[%d].name", i), "A function tool needs a name.")
		}
		chat = append(chat, map[string]any{"type": "function", "function": fn})
	}
	out, err := json.Marshal(chat)
	if err != nil {
		return nil, frontdoor.InvalidParam("tools", "'tools' could not be read.")
	}
	return out, nil
}

// responsesToolChoice turns a Responses tool_choice into the chat one:
// "none", "auto" and "required" alike, {"type":"function","name":n} as
// {"type":"function","function":{"name":n}}.
func responsesToolChoice(raw json.RawMessage) (json.RawMessage, *frontdoor.Failure) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || isJSONNull(raw) {
		return nil, nil
	}
	var mode string
	if json.Unmarshal(raw, &mode) == nil {
		if mode == "none" || mode == "auto" || mode == "required" {
			return raw, nil
		}
		return nil, frontdoor.InvalidParam("tool_choice", "'tool_choice' must be none, auto, required or a function.")
	}
	var fn struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if json.Unmarshal(raw, &fn) != nil || fn.Type != "function" || fn.Name == "" {
		return nil, frontdoor.InvalidParam("tool_choice", `Only {"type":"function","name":...} tool choices are supported.`)
	}
	out, _ := json.Marshal(map[string]any{"type": "function", "function": map[string]string{"name": fn.Name}}) // strings always marshal
	return out, nil
}

// responsesFormat turns text.format into the chat response_format the
// contract compiles: text and json_object alike, {"type":"json_schema",
// "name","schema","strict","description"} with those members under
// json_schema. text.verbosity has no chat equivalent here.
func responsesFormat(raw json.RawMessage) (json.RawMessage, *frontdoor.Failure) {
	if len(raw) == 0 || isJSONNull(raw) {
		return nil, nil
	}
	var text map[string]json.RawMessage
	if json.Unmarshal(raw, &text) != nil {
		return nil, frontdoor.InvalidParam("text", "Invalid type for 'text': expected an object.")
	}
	for k, v := range text {
		if k != "format" && !isJSONNull(v) {
			return nil, frontdoor.InvalidParam("text."+clip(k), "Only 'text.format' is supported.")
		}
	}
	format := text["format"]
	if len(format) == 0 || isJSONNull(format) {
		return nil, nil
	}
	var spec map[string]json.RawMessage
	var typ string
	if json.Unmarshal(format, &spec) != nil || json.Unmarshal(spec["type"], &typ) != nil {
		return nil, frontdoor.InvalidParam("text.format", "'text.format' must be an object with a type.")
	}
	switch typ {
	case "text", "json_object":
		return format, nil
	case "json_schema":
		schema := make(map[string]json.RawMessage, len(spec))
		for k, v := range spec {
			if k != "type" {
				schema[k] = v
			}
		}
		out, err := json.Marshal(map[string]any{"type": "json_schema", "json_schema": schema})
		if err != nil {
			return nil, frontdoor.InvalidParam("text.format", "'text.format' could not be read.")
		}
		return out, nil
	}
	return nil, frontdoor.InvalidParam("text.format.type", "'text.format.type' must be text, json_object or json_schema.")
}
