package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/hedgerow/hedgerow/schemas"
)

// This file is the OpenAI adapter's Responses path: a request whose caller
// spoke the Responses API (schemas.DialectResponses) goes to the provider's
// {base_url}/responses with the caller's members as sent, and the
// provider's semantic events are read back into the worker's deltas
// (docs/architecture.md §8).

// streamResponses implements Stream for a Responses request with one
// streaming POST to {base_url}/responses. response.created and
// response.in_progress carry no output: the first delta is the first
// output text or function call.
func (o *OpenAI) streamResponses(ctx context.Context, req *schemas.ChatRequest, sink Sink) (Outcome, error) {
	body, err := o.responsesBody(req)
	if err != nil {
		return Outcome{}, unencodable(err)
	}
	// The endpoint is {base_url}/responses, beside {base_url}/chat/completions.
	endpoint := strings.TrimSuffix(o.endpoint, "/chat/completions") + "/responses"
	return o.stream(ctx, endpoint, body, o.authorize, &responsesAccumulator{sink: sink, inputEstimate: inputEstimate(body)}, "a finish reason")
}

// responsesEvent is the part of a Responses streaming event the adapter
// reads.
type responsesEvent struct {
	Type        string `json:"type"`
	Delta       string `json:"delta"`
	OutputIndex int    `json:"output_index"`
	Item        *struct {
		Type      string `json:"type"`
		CallID    string `json:"call_id"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"item"`
	Response *struct {
		Status            string `json:"status"`
		IncompleteDetails *struct {
			Reason string `json:"reason"`
		} `json:"incomplete_details"`
		Usage *struct {
			InputTokens  int64 `json:"input_tokens"`
			OutputTokens int64 `json:"output_tokens"`
		} `json:"usage"`
		Error json.RawMessage `json:"error"`
	} `json:"response"`
}

// responsesAccumulator folds a Responses event stream into an Outcome and
// forwards its output to the sink as deltas in the chat shape: text as
// Content, each function_call item as a tool call whose index counts the
// calls, its argument deltas as fragments of it.
type responsesAccumulator struct {
	sink          Sink
	inputEstimate int64

	content   strings.Builder
	refusal   strings.Builder
	calls     []*toolCall
	arguments []*strings.Builder
	callAt    map[int]int // tool-call index by output_index
	tokens    int64
	finish    string
	usage     *schemas.Usage
	done      bool // a terminal event arrived
	generated bool // the first output reached the sink, and FirstByte with it
}

// event folds one event's data. It returns the error object of an error
// or response.failed event, or an error if the data is not an event.
func (a *responsesAccumulator) event(_, data []byte) (json.RawMessage, error) {
	var ev responsesEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		return nil, fmt.Errorf("decode responses event: %w", err)
	}
	switch ev.Type {
	case "response.output_text.delta":
		if ev.Delta != "" {
			a.content.WriteString(ev.Delta)
			a.emit(Delta{Content: ev.Delta})
		}
	case "response.refusal.delta":
		if ev.Delta != "" {
			a.firstToken() // a refusal is output too
		}
		a.refusal.WriteString(ev.Delta)
	case "response.output_item.added":
		if ev.Item == nil || ev.Item.Type != "function_call" {
			return nil, nil
		}
		if a.callAt == nil {
			a.callAt = make(map[int]int)
		}
		k := len(a.calls)
		a.callAt[ev.OutputIndex] = k
		call := &toolCall{ID: ev.Item.CallID, Type: "function", Function: toolCallFunction{Name: ev.Item.Name}}
		a.calls, a.arguments = append(a.calls, call), append(a.arguments, &strings.Builder{})
		a.arguments[k].WriteString(ev.Item.Arguments)
		a.emit(Delta{ToolCalls: callDelta(k, call.ID, call.Function.Name, ev.Item.Arguments)})
	case "response.function_call_arguments.delta":
		k, ok := a.callAt[ev.OutputIndex]
		if !ok {
			return nil, fmt.Errorf("arguments of output %d, which is no function call", ev.OutputIndex)
		}
		if ev.Delta != "" {
			a.arguments[k].WriteString(ev.Delta)
			a.emit(Delta{ToolCalls: callDelta(k, "", "", ev.Delta)})
		}
	case "response.completed", "response.incomplete":
		if ev.Response == nil {
			return nil, fmt.Errorf("%s without a response", ev.Type)
		}
		a.done, a.finish = true, "stop"
		switch {
		case ev.Type == "response.incomplete" && ev.Response.IncompleteDetails != nil && ev.Response.IncompleteDetails.Reason == "content_filter":
			a.finish = "content_filter"
		case ev.Type == "response.incomplete":
			a.finish = "length"
		case len(a.calls) > 0:
			a.finish = "tool_calls"
		}
		if u := ev.Response.Usage; u != nil {
			a.usage = &schemas.Usage{InputUnits: u.InputTokens, OutputUnits: u.OutputTokens}
		}
	case "response.failed":
		if ev.Response != nil && dropNull(ev.Response.Error) != nil {
			return ev.Response.Error, nil
		}
		return data, nil
	case "error":
		return data, nil
	}
	return nil, nil
}

// emit hands the sink one delta, counted as one output token until the
// provider's usage says otherwise.
func (a *responsesAccumulator) emit(d Delta) {
	a.firstToken()
	d.Tokens = 1
	a.tokens++
	a.sink.Delta(d)
}

// ended reports that a terminal event arrived.
func (a *responsesAccumulator) ended() bool { return a.done }

// firstToken reports the first output — text, a function call, a refusal —
// as the attempt's first byte, once (docs/architecture.md §4): never
// response.created or response.in_progress.
func (a *responsesAccumulator) firstToken() {
	if !a.generated {
		a.generated = true
		a.sink.FirstByte()
	}
}

// callDelta is one tool-call fragment in the chat shape: the first of a
// call names its id, type and function; later ones add argument text.
func callDelta(index int, id, name, args string) json.RawMessage {
	type function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	}
	d := struct {
		Index    int      `json:"index"`
		ID       string   `json:"id,omitempty"`
		Type     string   `json:"type,omitempty"`
		Function function `json:"function"`
	}{Index: index, ID: id, Function: function{Name: name, Arguments: args}}
	if id != "" {
		d.Type = "function"
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode([]any{d}) // strings and ints always encode
	return bytes.TrimRight(b.Bytes(), "\n")
}

// outcome is the attempt's result so far.
// progress counts the output so far: 0 until the first output, then one
// more for every output delta (readEvents' stall bound).
func (a *responsesAccumulator) progress() int64 {
	if !a.generated {
		return 0
	}
	return 1 + a.tokens
}

func (a *responsesAccumulator) outcome() Outcome {
	out := Outcome{
		FinishReason: a.finish,
		Content:      a.content.String(),
		Refusal:      a.refusal.String(),
		WellFormed:   a.done,
		Usage:        schemas.Usage{InputUnits: a.inputEstimate, OutputUnits: a.tokens, Estimated: true},
	}
	if a.usage != nil {
		out.Usage = *a.usage
	}
	if len(a.calls) > 0 {
		calls := make([]toolCall, len(a.calls))
		for k, c := range a.calls {
			calls[k] = *c
			calls[k].Function.Arguments = a.arguments[k].String()
		}
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(calls) // strings always encode
		out.ToolCalls = bytes.TrimRight(b.Bytes(), "\n")
	}
	return out
}

// responsesRequest is the Responses request body of the canonical request's
// typed fields; the caller's other members are added as sent.
type responsesRequest struct {
	Model             string          `json:"model"`
	Instructions      string          `json:"instructions,omitempty"`
	Input             []any           `json:"input"`
	MaxOutputTokens   int             `json:"max_output_tokens,omitempty"`
	Temperature       *float64        `json:"temperature,omitempty"`
	TopP              *float64        `json:"top_p,omitempty"`
	Tools             []any           `json:"tools,omitempty"`
	ToolChoice        json.RawMessage `json:"tool_choice,omitempty"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls,omitempty"`
	Text              any             `json:"text,omitempty"`
	Stream            bool            `json:"stream"`
}

// responsesBody is the inverse of the Responses door's mapping: a leading
// system message of string content is the instructions; messages are
// message items (text parts input_text, or output_text for the assistant;
// image_url parts input_image), an assistant's tool calls function_call
// items, tool messages function_call_output items; chat tools and
// tool_choice the flat Responses shapes; response_format text.format; the
// cap max_output_tokens. The model is the route's.
func (o *OpenAI) responsesBody(req *schemas.ChatRequest) ([]byte, error) {
	extra, model, err := o.translate(req, schemas.DialectOpenAI)
	if err != nil {
		return nil, err
	}
	body := responsesRequest{
		Model: model, MaxOutputTokens: req.MaxTokens, Temperature: req.Temperature, TopP: req.TopP,
		ParallelToolCalls: req.ParallelToolCalls, ToolChoice: responsesToolChoice(req.ToolChoice), Stream: true,
	}
	msgs := req.Messages
	if len(msgs) > 0 && msgs[0].Role == schemas.MessageSystem {
		if c := bytes.TrimSpace(msgs[0].Content); len(c) > 0 && c[0] == '"' && json.Unmarshal(c, &body.Instructions) == nil {
			msgs = msgs[1:]
		}
	}
	if body.Input, err = responsesInput(msgs); err != nil {
		return nil, err
	}
	if body.Tools, err = responsesTools(req.Tools); err != nil {
		return nil, err
	}
	if body.Text, err = responsesText(req.ResponseFormat); err != nil {
		return nil, err
	}
	out, err := marshalNoEscape(body)
	if err != nil {
		return nil, fmt.Errorf("encode responses request: %w", err)
	}
	return withMembers(out, extra)
}

// responsesInput is the conversation as Responses input items.
func responsesInput(msgs []schemas.Message) ([]any, error) {
	items := make([]any, 0, len(msgs))
	for i, m := range msgs {
		switch m.Role {
		case schemas.MessageTool:
			text, err := m.Text()
			if err != nil {
				return nil, fmt.Errorf("messages[%d]: %w", i, err)
			}
			items = append(items, map[string]any{"type": "function_call_output", "call_id": m.ToolCallID, "output": text})
			continue
		}
		if c := dropNull(m.Content); c != nil {
			content, err := responsesContent(m.Role, c)
			if err != nil {
				return nil, fmt.Errorf("messages[%d]: %w", i, err)
			}
			items = append(items, map[string]any{"type": "message", "role": m.Role, "content": content})
		}
		if calls := dropNull(m.ToolCalls); calls != nil {
			var tcs []toolCall
			if err := json.Unmarshal(calls, &tcs); err != nil {
				return nil, fmt.Errorf("messages[%d]: tool_calls: %w", i, err)
			}
			for _, c := range tcs {
				items = append(items, map[string]any{"type": "function_call", "call_id": c.ID,
					"name": c.Function.Name, "arguments": c.Function.Arguments})
			}
		}
	}
	return items, nil
}

// responsesContent is a message's content as Responses content: a string
// as is, parts as input_text (output_text for the assistant) and
// input_image parts.
func responsesContent(role schemas.MessageRole, raw json.RawMessage) (any, error) {
	if raw = bytes.TrimSpace(raw); raw[0] == '"' {
		return raw, nil
	}
	m := schemas.Message{Role: role, Content: raw}
	parts, err := m.Parts()
	if err != nil {
		return nil, err
	}
	textType := "input_text"
	if role == schemas.MessageAssistant {
		textType = "output_text"
	}
	out := make([]any, 0, len(parts))
	for _, p := range parts {
		switch p.Type {
		case "text":
			out = append(out, map[string]any{"type": textType, "text": p.Text})
		case "image_url":
			var img struct {
				ImageURL struct {
					URL    string `json:"url"`
					Detail string `json:"detail,omitempty"`
				} `json:"image_url"`
			}
			if json.Unmarshal(p.Raw, &img) != nil {
				return nil, fmt.Errorf("%w: image_url part without a url", schemas.ErrMalformedRequest)
			}
			part := map[string]any{"type": "input_image", "image_url": img.ImageURL.URL}
			if img.ImageURL.Detail != "" {
				part["detail"] = img.ImageURL.Detail
			}
			out = append(out, part)
		default:
			return nil, fmt.Errorf("%w: content part of type %q has no Responses equivalent", schemas.ErrMalformedRequest, p.Type)
		}
	}
	return out, nil
}

// responsesTools are chat tools in the flat Responses shape.
func responsesTools(raw json.RawMessage) ([]any, error) {
	if dropNull(raw) == nil {
		return nil, nil
	}
	var tools []struct {
		Type     string                     `json:"type"`
		Function map[string]json.RawMessage `json:"function"`
	}
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, fmt.Errorf("%w: tools: %v", schemas.ErrMalformedRequest, err)
	}
	out := make([]any, 0, len(tools))
	for _, t := range tools {
		if t.Type != "function" || t.Function == nil {
			return nil, fmt.Errorf("%w: a tool of type %q has no Responses equivalent", schemas.ErrMalformedRequest, t.Type)
		}
		flat := map[string]any{"type": "function"}
		for k, v := range t.Function {
			flat[k] = v
		}
		out = append(out, flat)
	}
	return out, nil
}

// responsesToolChoice is a chat tool_choice in the Responses shape.
func responsesToolChoice(raw json.RawMessage) json.RawMessage {
	raw = dropNull(raw)
	var fn struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if raw == nil || json.Unmarshal(raw, &fn) != nil || fn.Type != "function" {
		return raw // a mode string, or as sent
	}
	out, _ := json.Marshal(map[string]string{"type": "function", "name": fn.Function.Name}) // strings always marshal
	return out
}

// responsesText is a response_format as the Responses text member.
func responsesText(raw json.RawMessage) (any, error) {
	if dropNull(raw) == nil {
		return nil, nil
	}
	var rf map[string]json.RawMessage
	if err := json.Unmarshal(raw, &rf); err != nil {
		return nil, fmt.Errorf("%w: response_format: %v", schemas.ErrMalformedRequest, err)
	}
	var typ string
	_ = json.Unmarshal(rf["type"], &typ)
	if typ != "json_schema" {
		return map[string]json.RawMessage{"format": raw}, nil
	}
	var schema map[string]json.RawMessage
	if err := json.Unmarshal(rf["json_schema"], &schema); err != nil {
		return nil, fmt.Errorf("%w: response_format.json_schema: %v", schemas.ErrMalformedRequest, err)
	}
	format := map[string]json.RawMessage{"type": rf["type"]}
	for k, v := range schema {
		format[k] = v
	}
	return map[string]any{"format": format}, nil
}
